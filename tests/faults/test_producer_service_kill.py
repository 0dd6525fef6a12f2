"""The producer service SIGKILLed mid-seeding, three times over: the crawl request each held
comes back to the next service, which takes the dead one's claims over, and the last seeds the
run to the end; every URL is stored or dead exactly once, none lost.

Only this test's own producer-service processes are killed; no service is stopped or restarted.

    FAULTS_SIZE=small: 1,000 URLs (the default)      FAULTS_SIZE=large: 5,000 URLs
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

import pytest

from ops.submit import submit
from producer.seeding import seeded_summary
from shared.amqp import broker
from shared.amqp.topology import build_topology, control_queue
from shared.postgres import db
from shared.settings import Settings
from tests.faults.conftest import SIZE, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import queued_messages, wait_for_ledger
from tests.faults.site import FaultSite, SiteShape

pytestmark = [pytest.mark.faults, pytest.mark.timeout(SIZE.timeout_s + 120)]

RUN = "killed-service"
KILLS = 3
ALWAYS_500 = 10
WORKERS = 2
SITEMAPS = 20  # each read with a pause, so that the seeding takes a while and the kill lands in it


def control_depth(settings: Settings) -> tuple[int, int]:
    connection = broker.connect(settings, "faults-control")
    try:
        return broker.queue_depth(connection.channel(), control_queue(settings.crawl_namespace))
    finally:
        connection.close()


def test_a_sigkilled_producer_service_gives_its_request_back_and_the_run_completes(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    urls = size.urls
    web = site(
        SiteShape(
            pages=urls - ALWAYS_500,
            always_500=ALWAYS_500,
            urls_per_sitemap=urls // SITEMAPS,
            sitemap_delay_s=0.5,
        )
    )
    procs = fleet(env())
    connection = broker.connect(settings, "faults-setup")
    try:
        broker.declare_topology(connection, build_topology(settings))
    finally:
        connection.close()
    db.ensure_schema(settings)
    started = time.monotonic()

    procs.start("producer-service-1", "producer", "--serve")
    submitted = submit(settings, {"run_id": RUN, "sitemaps": [web.sitemap_index]})
    # Each service is killed once a further share of the URLs is queued (no worker runs yet), at
    # a random moment inside that share: mid-seeding, a batch in flight or between two.
    chaos = random.Random(47)
    kills: list[dict[str, int]] = []
    for kill in range(1, KILLS + 1):
        target = urls * kill // (KILLS + 1) + chaos.randint(0, urls // 20)
        deadline = time.monotonic() + 120
        while (queued := queued_messages(settings)) < target:
            procs.assert_alive()
            assert time.monotonic() < deadline, f"service {kill} did not get as far as {target} URLs"
            time.sleep(0.005)
        procs.kill(f"producer-service-{kill}")
        assert seeded_summary(settings, RUN) is None, "the kill did not land mid-seeding"
        deadline = time.monotonic() + 10  # the broker requeues it once it sees the connection gone
        while (back := control_depth(settings)[0]) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        kills.append({"queued_at_kill": queued, "request_back_in_queue": back})
        procs.start(f"producer-service-{kill + 1}", "producer", "--serve")
    procs.start_services(WORKERS)

    ledger = wait_for_ledger(
        settings, RUN, web.urls(), max(size.settle_s, urls / 40), check=procs.assert_alive
    )
    deadline = time.monotonic() + 30
    while seeded_summary(settings, RUN) is None or control_depth(settings)[0]:
        assert time.monotonic() < deadline, "the request was never acked"
        time.sleep(0.5)
    seedings = [
        procs.log_lines(f"producer-service-{n}", f"crawl request {submitted.operation}: seeding run {RUN}")
        for n in range(1, KILLS + 2)
    ]
    summary = seeded_summary(settings, RUN)
    assert summary is not None
    report(
        **ledger.figures(),
        kills=kills,
        last_seeding={k: summary[k] for k in ("enqueued_total", "duplicates", "taken_over", "republished")},
        elapsed_s=round(time.monotonic() - started, 1),
    )
    assert all(k["queued_at_kill"] < urls for k in kills), "a kill came after the seeding"
    assert [k["request_back_in_queue"] for k in kills] == [1] * KILLS, "a killed service's request was lost"
    # Each service seeded the same request once; every one after the first got it back.
    assert [len(lines) for lines in seedings] == [1] * (KILLS + 1)
    assert all("(delivered again)" in lines[0] for lines in seedings[1:])
    ledger.assert_every_url_once()
    assert len(ledger.stored) == urls - ALWAYS_500
    assert ledger.dead_by_reason() == {"http_500": ALWAYS_500}
    assert (len(ledger.lost), len(ledger.duplicated)) == (0, 0)
    assert control_depth(settings) == (0, 1), "the request was not acked, or the service is gone"
