"""URLs that wait in the ttl queue longer than TTL_QUEUE_EXPIRY_S, with no worker running, all
reach the dead-letter store as `expired`; the other queues keep theirs for the workers."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from shared.settings import Settings
from tests.faults.conftest import SIZE, Size
from tests.faults.fleet import Fleet
from tests.faults.ledger import take_ledger, wait_for_ledger
from tests.faults.site import FaultSite, SiteShape

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

EXPIRY_S = 1.0


def test_every_url_that_expires_unserved_is_dead_as_expired(
    settings: Settings,
    size: Size,
    env: Callable[..., dict[str, str]],
    site: Callable[[SiteShape], FaultSite],
    fleet: Callable[[dict[str, str]], Fleet],
    report: Callable[..., None],
) -> None:
    news = size.urls // 2  # the default routing rules send /news/ URLs to the ttl queue
    web = site(SiteShape(pages=size.urls - news, news=news))
    procs = fleet(env(TTL_QUEUE_EXPIRY_S=str(EXPIRY_S)))
    procs.start("dlq_consumer", "dlq_consumer", "consume")  # and no worker, for now
    assert procs.producer("ttl", "--sitemap", web.sitemap_index).wait(timeout=120) == 0
    assert procs.producer_summary("ttl")["enqueued"]["ttl"] == news

    expired = wait_for_ledger(
        settings, "ttl", web.urls("news"), size.settle_s, check=procs.assert_alive, drained=False
    )
    assert expired.lost == []
    assert expired.dead_by_reason() == {"expired": news}

    for i in range(1, 5):
        procs.start(f"worker-{i}", "worker")
    ledger = wait_for_ledger(settings, "ttl", web.urls(), size.settle_s, check=procs.assert_alive)
    report(**ledger.figures(), expiry_s=EXPIRY_S)
    ledger.assert_every_url_once()
    assert ledger.dead_by_reason() == {"expired": news}
    assert set(ledger.stored) == set(web.urls("pages"))
    # Expired URLs were never fetched, and their row says which queue they expired in.
    assert sum(web.page_hits()[p] for p in web.page_hits() if p.startswith("/news/")) == 0
    rows = take_ledger(settings, "ttl", web.urls("news"))
    assert {d.attempts for d in rows.dead.values()} == {0}
