"""bench.politeness_cost's arithmetic: a polite crawl's CPU against the unbound one's."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import threading

import pytest

from bench.measure import children_of, postmasters
from bench.politeness_cost import Result, SitePages, corpus_route, parse_args
from bench.site import Hit


def result(ours: float, services: float, idle: float) -> Result:
    return Result("run", 10.0, 200, 2, ours, services, idle, 200, 0, 200)


def test_ratios_compare_ours_the_machine_and_the_machine_net_of_idle() -> None:
    polite, unbound = result(3.0, 2.0, 1.5), result(2.0, 0.5, 0.0)
    assert polite.ratios(unbound) == pytest.approx((1.5, 2.0, 1.4))


def test_a_side_that_spent_nothing_gives_an_infinite_ratio_not_an_error() -> None:
    assert result(1.0, 0.0, 0.0).ratios(result(0.0, 0.0, 0.0)) == (math.inf, math.inf, math.inf)


@pytest.mark.parametrize("argv", [["--repeat", "0"], ["--with-unbound", "--rate", "0"]])
def test_arguments_that_cannot_make_a_comparison_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        parse_args(argv)
    assert refused.value.code == 2


def test_the_services_share_is_shown_by_service_in_ms_a_page() -> None:
    run = Result(
        "run",
        10.0,
        200,
        2,
        1.0,
        0.6,
        0.2,
        200,
        0,
        200,
        {"beam.smp": 0.4, "postgres": 0.2},
        900,
        polling_cpu_s=0.05,
    )
    assert run.services_row(200).split("services ms/page: ")[1] == (
        "RabbitMQ 2.00, PostgreSQL 1.00; idle share 1.00; Redis round trips/page 4.5; "
        "the bench's polling of PostgreSQL (left out) 0.25"
    )


def test_a_crawl_that_used_no_broker_shows_no_broker_figures() -> None:
    scrapy = Result("Scrapy, 2/s", 10.0, 200, 2, 1.0, 0.6, 0.2, 0, 0, 0, through_broker=False)
    columns = scrapy.row(200).split()
    assert columns[-3:] == ["-", "-", "-"]
    assert columns[-6:-3] == ["5.0", "8.0", "7.0"]  # ours, the machine, net of idle: ms a page


def test_the_postmaster_is_the_postgres_process_no_other_started_whatever_its_pid() -> None:
    # pids wrapped: two backends have lower pids than their postmaster, 29854 (started by init)
    parents = {29854: 1, 29858: 29854, 412: 29854, 977: 29854}
    assert postmasters(parents) == {29854}
    assert postmasters({}) == set()


def hit(path: str) -> Hit:
    return Hit(0.0, "127.0.0.1:1", path, {})


def test_the_real_pages_site_serves_its_pages_allows_everything_and_has_nothing_else() -> None:
    route = corpus_route({"/library/os.html": b"<html>os</html>"})
    page = route(hit("/library/os.html"))
    assert (page.status, page.body) == (200, b"<html>os</html>")
    assert page.headers["Content-Type"].startswith("text/html")
    robots = route(hit("/robots.txt"))
    assert robots.status == 200 and b"Allow: /" in robots.body
    assert route(hit("/library/sys.html")).status == 404


def test_the_synthetic_site_asks_for_as_many_distinct_pages_as_the_crawl_has() -> None:
    pages = SitePages.synthetic(3)
    assert pages.paths == ["/p/0", "/p/1", "/p/2"]
    assert pages.route(hit("/p/1")).status == 200


def test_the_generated_site_serves_make_bench_pages_linking_to_its_own_host() -> None:
    pages = SitePages.generated(3)
    assert pages.paths == ["/p/0.html", "/p/1.html", "/p/2.html"]
    page = pages.route(hit("/p/2.html"))
    assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
    assert b'<link rel="canonical" href="http://127.0.0.1:1/p/2.html">' in page.body
    assert 5_000 < len(page.body) < 8_000 and page.body.count(b"<a href=") == 20
    assert pages.route(hit("/robots.txt")).status == 200
    for outside in ("/p/3.html", "/p/x.html", "/p/1", "/p/01.html", "/p/\u00b2.html", "/other"):
        assert pages.route(hit(outside)).status == 404, outside


def test_real_and_generated_pages_cannot_both_be_served() -> None:
    with pytest.raises(SystemExit) as refused:
        parse_args(["--real-pages", "--bench-pages"])
    assert refused.value.code == 2


def test_children_are_found_whichever_thread_forked_them_and_an_ended_process_has_none() -> None:
    forked: list[subprocess.Popen[bytes]] = []
    thread = threading.Thread(
        target=lambda: forked.append(
            subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE)
        )
    )
    thread.start()
    thread.join()
    (child,) = forked
    try:
        assert child.pid in children_of(os.getpid())
    finally:
        child.communicate(b"\n", timeout=10)
    assert child.pid not in children_of(os.getpid())
    assert children_of(child.pid) == []
