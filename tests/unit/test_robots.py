"""robots.txt: what answers mean, matching our agent, and fetching once for every worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from shared.errors import PermanentError, TransientError
from shared.try_later import TryLater
from tests.fakes import FakeTime
from worker.politeness.robots import (
    ALLOW_ALL,
    RULES,
    UNAVAILABLE,
    Robots,
    RobotsAnswer,
    RobotsEntry,
    RobotsRules,
    interpret,
    product_token,
    robots_url,
)

AGENT = "crawl-pipeline/0.1 (+https://github.com/crawl-pipeline)"
TEXT = b"""User-agent: *
Disallow: /private/
Crawl-delay: 3

User-agent: crawl-pipeline
Disallow: /not-for-us/
Allow: /not-for-us/but-this
Crawl-delay: 0.5

User-agent: github
Disallow: /
"""


@pytest.mark.parametrize(
    ("status", "verdict"),
    [
        (200, RULES),
        (204, RULES),
        (301, ALLOW_ALL),
        (401, ALLOW_ALL),
        (403, ALLOW_ALL),
        (404, ALLOW_ALL),
        (410, ALLOW_ALL),
        (500, UNAVAILABLE),
        (502, UNAVAILABLE),
        (599, UNAVAILABLE),
    ],
)
def test_what_each_status_means(status: int, verdict: str) -> None:
    assert interpret(RobotsAnswer(status, b"User-agent: *\nDisallow: /")).verdict == verdict


def test_a_byte_order_mark_and_bad_utf8_do_not_hide_the_rules() -> None:
    entry = interpret(RobotsAnswer(200, b"\xef\xbb\xbfUser-agent: *\nDisallow: /x\xff/\nDisallow: /a/\n"))
    rules = RobotsRules.from_entry(entry, "crawl-pipeline")
    assert not rules.allows("http://s.test/a/1") and rules.allows("http://s.test/b")


def test_product_token_is_what_groups_are_matched_against() -> None:
    assert product_token(AGENT) == "crawl-pipeline"
    assert product_token("MyBot") == "mybot"
    assert product_token("  ") == "*"


def test_our_own_group_wins_over_the_star_group() -> None:
    rules = RobotsRules.from_entry(interpret(RobotsAnswer(200, TEXT)), product_token(AGENT))
    assert not rules.allows("http://s.test/not-for-us/page")
    assert rules.allows("http://s.test/not-for-us/but-this")
    assert rules.allows("http://s.test/private/page")  # only the * group says no
    assert rules.crawl_delay_s == 0.5
    # The 'github' group (Disallow: /) must not catch us through the URL in our User-Agent.
    assert rules.allows("http://s.test/anything")


def test_other_agents_get_the_star_group() -> None:
    rules = RobotsRules.from_entry(interpret(RobotsAnswer(200, TEXT)), "otherbot")
    assert not rules.allows("http://s.test/private/page")
    assert rules.crawl_delay_s == 3.0


def test_allow_all_has_no_crawl_delay() -> None:
    rules = RobotsRules.from_entry(RobotsEntry(ALLOW_ALL), "crawl-pipeline")
    assert rules.allows("http://s.test/private/") and rules.crawl_delay_s is None


def test_robots_url_keeps_scheme_and_port() -> None:
    assert robots_url("https://s.test:8443/a/b?c=d") == "https://s.test:8443/robots.txt"


@pytest.mark.parametrize("raw", [b"", b"{", b'{"v":2}', b'{"v":1,"verdict":"maybe","text":"","detail":""}'])
def test_entries_that_do_not_decode_are_none(raw: bytes) -> None:
    assert RobotsEntry.decode(raw) is None


class FakeStore:
    def __init__(self, claim_free: bool = True) -> None:
        self.values: dict[str, bytes] = {}
        self.ttls: dict[str, float] = {}
        self.claim_free = claim_free
        self.unclaimed: list[str] = []

    def get(self, domain: str) -> bytes | None:
        return self.values.get(domain)

    def put(self, domain: str, value: bytes, ttl_s: float) -> None:
        self.values[domain] = value
        self.ttls[domain] = ttl_s

    def claim(self, domain: str, ttl_s: float) -> str | None:
        return "mine" if self.claim_free else None

    def unclaim(self, domain: str, token: str) -> None:
        self.unclaimed.append(token)


class Server:
    def __init__(self, *answers: RobotsAnswer | Exception) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    def __call__(self, url: str) -> RobotsAnswer:
        self.asked.append(url)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def robots_with(store: FakeStore, fake: FakeTime | None = None) -> Robots:
    fake = fake or FakeTime()
    return Robots(
        store, AGENT, ttl_s=3600.0, claim_ttl_s=40.0, max_wait_s=2.0, sleep=fake.sleep, clock=fake.clock
    )


def test_fetched_once_and_shared_through_the_store() -> None:
    store = FakeStore()
    server = Server(RobotsAnswer(200, b"User-agent: *\nDisallow: /x\n"))
    first = robots_with(store).rules_for("http://s.test/a", server)
    assert not first.allows("http://s.test/x")
    assert server.asked == ["http://s.test/robots.txt"] and store.unclaimed == ["mine"]
    assert store.ttls == {"s.test": 3600.0}
    # Another worker (another Robots) finds it in the store and asks nobody.
    second = robots_with(store).rules_for("http://s.test/b", Server())
    assert not second.allows("http://s.test/x")


def test_unreachable_is_remembered_briefly_and_fails_every_url_transiently() -> None:
    store = FakeStore()
    fake = FakeTime()
    robots = robots_with(store, fake)
    server = Server(TransientError("timeout", "read timed out"), RobotsAnswer(200, b""))
    for _ in range(2):
        with pytest.raises(TransientError) as caught:
            robots.rules_for("http://s.test/a", server)
        assert caught.value.reason == "robots_unavailable"
    assert len(server.asked) == 1 and store.ttls["s.test"] <= 10.0
    fake.now += 11.0
    del store.values["s.test"]  # what its expiry does
    assert robots.rules_for("http://s.test/a", server).allows("http://s.test/a")
    assert len(server.asked) == 2


def test_an_unusable_robots_txt_allows_everything() -> None:
    server = Server(PermanentError("redirect_loop", "too many"))
    assert robots_with(FakeStore()).rules_for("http://s.test/a", server).allows("http://s.test/a")


def test_waiting_for_another_workers_fetch_uses_its_verdict() -> None:
    store = FakeStore(claim_free=False)
    fake = FakeTime()

    class ArrivesLater(FakeStore):
        def get(self, domain: str) -> bytes | None:
            if fake.now >= 0.5:
                return RobotsEntry(RULES, "User-agent: *\nDisallow: /x\n").encode()
            return None

    later = ArrivesLater(claim_free=False)
    rules = robots_with(later, fake).rules_for("http://s.test/a", Server())
    assert not rules.allows("http://s.test/x")
    with pytest.raises(TryLater) as caught:  # nobody ever finishes: defer the URL
        robots_with(store, FakeTime()).rules_for("http://s.test/a", Server())
    assert caught.value.reason == "robots_pending"


def test_a_try_later_while_fetching_gives_the_claim_back_and_stores_nothing() -> None:
    store = FakeStore()
    with pytest.raises(TryLater):
        robots_with(store).rules_for("http://s.test/a", Server(TryLater(3.0, "rate")))
    assert store.unclaimed == ["mine"] and store.values == {}


class SlowStore(FakeStore):
    """A store whose first read of each domain in `slow` waits until `go` is set."""

    def __init__(self, *slow: str) -> None:
        super().__init__()
        self.slow = set(slow)
        self.reading = threading.Event()
        self.go = threading.Event()
        self.reads: list[str] = []

    def get(self, domain: str) -> bytes | None:
        self.reads.append(domain)
        if domain in self.slow:
            self.slow.discard(domain)
            self.reading.set()
            self.go.wait(10.0)
        return super().get(domain)


def in_threads(count: int, work: Callable[[], object]) -> tuple[list[threading.Thread], list[object]]:
    results: list[object] = []

    def run() -> None:
        try:
            results.append(work())
        except Exception as exc:
            results.append(exc)

    threads = [threading.Thread(target=run) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def test_the_threads_of_a_worker_look_a_domain_up_once() -> None:
    store = SlowStore("s.test")
    store.values["s.test"] = RobotsEntry(RULES, "User-agent: *\nDisallow: /x\n").encode()
    robots = robots_with(store)
    server = Server()
    first, results = in_threads(1, lambda: robots.rules_for("http://s.test/a", server))
    assert store.reading.wait(5.0)
    others, more = in_threads(4, lambda: robots.rules_for("http://s.test/b", server))
    time.sleep(0.2)  # the others reach the domain's line (without it, each would read the store)
    store.go.set()
    for thread in first + others:
        thread.join(5.0)
    results += more
    assert len(results) == 5 and all(isinstance(rules, RobotsRules) for rules in results)
    assert all(not rules.allows("http://s.test/x") for rules in results)  # type: ignore[attr-defined]
    assert store.reads == ["s.test"] and server.asked == []


def test_a_slow_look_up_of_one_domain_holds_up_no_other() -> None:
    store = SlowStore("slow.test")
    robots = robots_with(store)
    slow, results = in_threads(
        1, lambda: robots.rules_for("http://slow.test/a", Server(RobotsAnswer(404, b"")))
    )
    assert store.reading.wait(5.0)
    other = robots.rules_for("http://quick.test/a", Server(RobotsAnswer(404, b"")))
    assert other.allows("http://quick.test/a") and results == []  # the slow one still reading
    store.go.set()
    slow[0].join(5.0)
    assert len(results) == 1 and isinstance(results[0], RobotsRules)


def test_waiting_too_long_behind_another_threads_look_up_defers_the_url() -> None:
    store = SlowStore("s.test")
    robots = Robots(store, AGENT, ttl_s=3600.0, claim_ttl_s=40.0, max_wait_s=0.0)  # waits 1 s
    first, results = in_threads(
        1, lambda: robots.rules_for("http://s.test/a", Server(RobotsAnswer(404, b"")))
    )
    assert store.reading.wait(5.0)
    behind = Server()
    with pytest.raises(TryLater) as caught:
        robots.rules_for("http://s.test/b", behind)
    assert caught.value.reason == "robots_pending" and behind.asked == []
    assert store.reads == ["s.test"]  # it read nothing either
    store.go.set()
    first[0].join(5.0)
    assert len(results) == 1 and isinstance(results[0], RobotsRules)


def test_a_thread_behind_a_quick_look_up_waits_for_it_even_without_inline_waits() -> None:
    store = SlowStore("s.test")
    store.values["s.test"] = RobotsEntry(RULES, "User-agent: *\nDisallow: /x\n").encode()
    robots = Robots(store, AGENT, ttl_s=3600.0, claim_ttl_s=40.0, max_wait_s=0.0)
    first, _ = in_threads(1, lambda: robots.rules_for("http://s.test/a", Server()))
    assert store.reading.wait(5.0)
    threading.Timer(0.1, store.go.set).start()  # the lookup ends 0.1 s later
    assert not robots.rules_for("http://s.test/b", Server()).allows("http://s.test/x")
    first[0].join(5.0)
    assert store.reads == ["s.test"]
