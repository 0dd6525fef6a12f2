"""The producer service SIGKILLed mid-seeding: the crawl request it held comes back to the next
service, which takes the dead one's claims over and seeds the run to the end; every URL is
stored or dead exactly once, none lost.

Only this test's own producer-service processes are killed; no service is stopped or restarted.

    FAULTS_SIZE=small: 1,000 URLs (the default)      FAULTS_SIZE=large: 5,000 URLs
"""

from __future__ import annotations

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
            sitemap_delay_s=0.2,
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
    # Killed once a third of the URLs are queued (no worker runs yet): mid-seeding.
    deadline = time.monotonic() + 120
    while (queued_at_kill := queued_messages(settings)) < urls // 3:
        procs.assert_alive()
        assert time.monotonic() < deadline, "the service did not start seeding"
        time.sleep(0.02)
    procs.kill("producer-service-1")
    seeded_at_kill = seeded_summary(settings, RUN)
    deadline = time.monotonic() + 10  # the broker requeues it once it sees the connection gone
    while (back_in_queue := control_depth(settings)[0]) == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    procs.start("producer-service-2", "producer", "--serve")
    procs.start_services(WORKERS)

    ledger = wait_for_ledger(
        settings, RUN, web.urls(), max(size.settle_s, urls / 40), check=procs.assert_alive
    )
    deadline = time.monotonic() + 30
    while seeded_summary(settings, RUN) is None or control_depth(settings)[0]:
        assert time.monotonic() < deadline, "the request was never acked"
        time.sleep(0.5)
    resumed = procs.log_lines("producer-service-2", f"crawl request {submitted.operation}: seeding run {RUN}")
    summary = seeded_summary(settings, RUN)
    assert summary is not None
    report(
        **ledger.figures(),
        queued_at_kill=queued_at_kill,
        request_back_in_queue=back_in_queue,
        second_seeding={k: summary[k] for k in ("enqueued_total", "duplicates", "taken_over", "republished")},
        elapsed_s=round(time.monotonic() - started, 1),
    )
    assert queued_at_kill < urls and seeded_at_kill is None, "the kill did not land mid-seeding"
    assert back_in_queue == 1, "the killed service's request did not come back"
    assert len(resumed) == 1 and "(delivered again)" in resumed[0]
    ledger.assert_every_url_once()
    assert len(ledger.stored) == urls - ALWAYS_500
    assert ledger.dead_by_reason() == {"http_500": ALWAYS_500}
    assert (len(ledger.lost), len(ledger.duplicated)) == (0, 0)
    assert control_depth(settings) == (0, 1), "the request was not acked, or the service is gone"
