"""QUEUE_TYPE=quorum on the local broker: the ttl, bulk and dead-letter queues are declared as
quorum queues (the priority queue stays classic), a crawl runs through them end to end, and a
URL that kills its worker every time is dead-lettered by the delivery limit."""

from __future__ import annotations

import base64
import json
import urllib.parse
import urllib.request

import pytest

from shared.amqp.topology import POISON_DELIVERY_LIMIT, dead_letter_queue, parked_queue, work_queue
from shared.settings import Settings
from tests.faults.conftest import SIZE
from tests.faults.scenario import Scenario
from tests.faults.site import SiteShape
from tests.faults.test_poison import kill_whoever_fetches

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

ALWAYS_500 = 5


@pytest.mark.usefixtures("management_api")  # queue types are read from it; skipped, saying why, without
def test_quorum_queues_declare_and_carry_a_crawl_with_a_delivery_limit(scenario: Scenario) -> None:
    settings, report = scenario.settings, scenario.report
    shape = SiteShape(pages=100, news=20, always_500=ALWAYS_500, hangs=1)
    # One fetch at a time: when the worker dies, the URL it was fetching is the one that killed
    # it. With several fetches in flight, the others in flight at every kill are suspects too
    # (docs/RELIABILITY.md, "What the delivery limit cannot tell").
    one_at_a_time = {"FETCH_READ_TIMEOUT_S": "60", "FETCH_DEADLINE_S": "60", "FETCH_CONCURRENCY": "1"}
    crawl = scenario.crawled("quorum", shape, 1, 60, QUEUE_TYPE="quorum", **one_at_a_time)
    web, procs = crawl.web, crawl.procs

    ns = settings.crawl_namespace
    assert queue_type(settings, work_queue(ns, "priority")) == "classic"
    for name in (work_queue(ns, "ttl"), work_queue(ns, "bulk"), dead_letter_queue(ns), parked_queue(ns)):
        assert queue_type(settings, name) == "quorum", name

    kills = kill_whoever_fetches(settings, "quorum", web, procs, "/hang/1.html")
    ledger = crawl.ledger(60)
    (killer,) = web.urls("hang")
    by = "worker" if ledger.dead[killer].worker_id else "broker"
    report(**ledger.figures(), sigkills=kills, hang_fetches=web.hits("/hang/1.html"), dead_lettered_by=by)
    assert ledger.lost == []
    assert ledger.duplicated == [], {url: ledger.dead.get(url) for url in ledger.duplicated}
    assert ledger.dead_by_reason() == {"http_500": ALWAYS_500, "delivery_limit": 1}
    assert len(ledger.stored) == 120
    assert kills <= POISON_DELIVERY_LIMIT + 1


def queue_type(settings: Settings, queue: str) -> str:
    """The queue's type as the management API reports it."""
    parts = urllib.parse.urlsplit(settings.amqp_url)
    vhost = urllib.parse.unquote(parts.path[1:]) or "/"
    url = f"{settings.rabbitmq_management_url}/api/queues/{urllib.parse.quote(vhost, safe='')}/{queue}"
    token = base64.b64encode(f"{parts.username}:{parts.password}".encode()).decode()
    request = urllib.request.Request(url, headers={"Authorization": f"Basic {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.load(response)["type"])
