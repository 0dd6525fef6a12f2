"""ops.status's proxies and slowed domains: what the proxy and slow-down keys hold, in the
gathered data (which the dashboard reads too) and in the text view, credentials never."""

from __future__ import annotations

import dataclasses
import json

import pytest

from ops.status import gather, render
from shared.http.proxies import RedisBench
from shared.redis.client import OPERATOR, connect_redis
from shared.redis.keys import Keys
from shared.settings import Settings
from worker.politeness.ratelimit import BETA, RateLimiter


def test_status_shows_proxy_health_and_slowed_domains(settings: Settings) -> None:
    shown = dataclasses.replace(
        settings,
        proxies="socks5h://u:s3cret@127.0.0.1:1080,http://127.0.0.1:3128",
        rate_limit_rps=4.0,
        rate_jitter=0.25,
    )
    client = connect_redis(shown, OPERATOR)
    keys = Keys(shown.redis_prefix)
    bench = RedisBench(client, keys, max_failures=2, bench_s=60)
    bench.failed("socks5h://127.0.0.1:1080")
    bench.failed("socks5h://127.0.0.1:1080")  # benched
    bench.failed("http://127.0.0.1:3128")  # one failure, still usable
    RateLimiter(client, keys, recovery_s=600).slow_down("slow.example", 4.0, why="429")
    client.close()

    report = gather(shown, None)

    assert report["proxies"] == [
        {
            "proxy": "socks5h://127.0.0.1:1080",
            "state": "benched",
            "benched_s": pytest.approx(60, abs=2),
            "recent_failures": 0,
        },
        {"proxy": "http://127.0.0.1:3128", "state": "usable", "benched_s": 0.0, "recent_failures": 1},
    ]
    politeness = report["politeness"]
    assert politeness["rate_jitter"] == 0.25 and politeness["slowed_total"] == 1
    (slowed,) = politeness["slowed_domains"]
    assert (slowed["domain"], slowed["reason"], slowed["configured_rps"]) == ("slow.example", "429", 4.0)
    assert slowed["rps_now"] == pytest.approx(4.0 * BETA, abs=0.05)  # growing back, slowly
    text = render(report)
    assert "proxies: 1 of 2 usable" in text
    assert "socks5h://127.0.0.1:1080  benched" in text
    assert "slowed domains: 1 (jitter up to +25% between requests)" in text
    assert "slow.example  2.8" in text and "/s of 4/s after 429, 0 s ago" in text
    assert "s3cret" not in text and "s3cret" not in json.dumps(report)
