"""Poison inputs end in the dead-letter store with a reason, after a bounded number of tries:
bodies that are not tasks, a page the HTML parser cannot take, URLs that always answer 500,
and a URL whose handling kills the worker every time."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time

import pytest

from shared.amqp import broker
from shared.amqp.topology import POISON_DELIVERY_LIMIT, build_topology, new_task_routing_key, work_exchange
from shared.settings import Settings
from tests.faults.conftest import SIZE
from tests.faults.fleet import Fleet
from tests.faults.ledger import take_ledger, wait_for_ledger
from tests.faults.scenario import Scenario
from tests.faults.site import FaultSite, SiteShape

pytestmark = pytest.mark.timeout(SIZE.timeout_s)

PAGES = 50
ALWAYS_500 = 5
CHARSET_TRAPS = 3
CHARSET_LIES = 2
UNDECODABLE = (
    b"\xff\xfe not even text",
    b"[1, 2, 3]",
    b'{"url": "", "run_id": "poison", "queue": "bulk"}',
)
SETTLE_S = 60.0


def test_poison_inputs_end_dead_with_a_reason_and_a_replay_cannot_loop(scenario: Scenario) -> None:
    settings, report = scenario.settings, scenario.report
    shape = SiteShape(
        pages=PAGES, always_500=ALWAYS_500, charset_traps=CHARSET_TRAPS, charset_lies=CHARSET_LIES
    )
    crawl = scenario.crawled("poison", shape, 2, 60)
    web, procs = crawl.web, crawl.procs
    environment = procs.env
    publish_raw(settings, UNDECODABLE)
    undecodable = [f"undecodable:{hashlib.sha256(body).hexdigest()}" for body in UNDECODABLE]

    ledger = wait_for_ledger(settings, "poison", web.urls(), SETTLE_S, undecodable, procs.assert_alive)
    ledger.assert_every_url_once()
    # A charset label naming a bytes codec (base64) is ignored: the page decodes as UTF-8 and is
    # stored, on its first fetch.
    lies = web.urls("charset-lie")
    assert len(lies) == CHARSET_LIES and all(ledger.stored.get(url) == 0 for url in lies)
    assert {u: d.reason for u, d in ledger.dead.items()} == {
        **dict.fromkeys(web.urls("always500"), "http_500"),
        **dict.fromkeys(web.urls("charset-trap"), "parse_error"),
        **dict.fromkeys(undecodable[:2], "undecodable"),  # not a JSON object
        undecodable[2]: "invalid_message",  # an object, but its URL is empty
    }
    hits = web.page_hits()
    # Three real failures, then dead: each always-500 URL was fetched exactly three times.
    assert {hits[path(url)] for url in web.urls("always500")} == {3}
    assert {ledger.dead[url].attempts for url in web.urls("always500")} == {3}
    # The same bytes would fail the same way again: a parse error is final at once.
    assert {hits[path(url)] for url in web.urls("charset-trap")} == {1}

    # An operator replays the always-500 URLs; they fail three more times and come back dead,
    # with their replay counted, instead of circling for ever.
    replay = subprocess.run(
        [sys.executable, "-m", "dlq_consumer", "replay", "--run", "poison", "--reason", "http_500"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    deadline = time.monotonic() + SETTLE_S
    while True:
        again = take_ledger(settings, "poison", web.urls(), undecodable)
        replayed = [again.dead.get(url) for url in web.urls("always500")]
        if all(d is not None and d.replays == 1 for d in replayed):
            break
        assert time.monotonic() < deadline, f"replayed URLs did not come back dead: {replayed}"
        time.sleep(0.25)
    assert {(d.reason, d.attempts, d.replays) for d in replayed if d} == {("http_500", 3, 1)}
    assert {web.page_hits()[path(url)] for url in web.urls("always500")} == {6}
    report(
        **ledger.figures(),
        charset_lies_stored=len(lies),
        always_500_fetches=3,
        after_one_replay={"fetches": 6, "replays": 1, "state": "dead"},
    )


def test_a_url_that_kills_its_worker_every_time_ends_dead_after_the_delivery_limit(
    scenario: Scenario,
) -> None:
    settings, report = scenario.settings, scenario.report
    # The worker is killed each time it fetches the hanging URL: a crash that the URL causes.
    # One fetch at a time: the URL being fetched when the worker dies is the one that killed it
    # (with more in flight, the others in flight at every kill are suspects too).
    one_at_a_time = {"FETCH_READ_TIMEOUT_S": "60", "FETCH_DEADLINE_S": "60", "FETCH_CONCURRENCY": "1"}
    crawl = scenario.crawled("killer", SiteShape(pages=20, hangs=1), 1, 60, **one_at_a_time)
    web, procs = crawl.web, crawl.procs
    kills = kill_whoever_fetches(settings, "killer", web, procs, "/hang/1.html")

    ledger = crawl.ledger(SETTLE_S)
    report(**ledger.figures(), sigkills=kills, hang_fetches=web.hits("/hang/1.html"))
    ledger.assert_every_url_once()
    (killer,) = web.urls("hang")
    assert ledger.dead_by_reason() == {"delivery_limit": 1}
    assert ledger.dead[killer].attempts == 0  # crashes are not failures of the URL
    assert web.hits("/hang/1.html") == POISON_DELIVERY_LIMIT == kills
    assert len(ledger.stored) == 20


def kill_whoever_fetches(settings: Settings, run_id: str, web: FaultSite, procs: Fleet, target: str) -> int:
    """Each time the (only) worker starts fetching `target`, SIGKILL it and start another; stop
    once `target` is dead-lettered. Returns the number of kills."""
    (url,) = [u for u in web.urls() if u.endswith(target)]
    kills = 0
    deadline = time.monotonic() + SETTLE_S
    while url not in take_ledger(settings, run_id, [url]).dead:
        assert time.monotonic() < deadline, f"{url} was not dead-lettered after {kills} kills"
        assert kills <= POISON_DELIVERY_LIMIT, "the delivery limit did not stop the crash loop"
        if web.hits(target) > kills:
            (worker,) = procs.workers()
            procs.kill(worker)
            procs.replace(worker)
            kills += 1
        time.sleep(0.05)
    return kills


def publish_raw(settings: Settings, bodies: tuple[bytes, ...]) -> None:
    connection = broker.connect(settings, "faults-poison")
    try:
        broker.declare_topology(connection, build_topology(settings))
        channel = broker.confirm_channel(connection)
        for body in bodies:
            exchange = work_exchange(settings.crawl_namespace)
            broker.publish(channel, broker.Publication(exchange, new_task_routing_key("bulk"), body))
    finally:
        connection.close()


def path(url: str) -> str:
    return "/" + url.split("/", 3)[3]
