"""Per-domain politeness of a run, live and cluster-wide: the run's busiest domains of the last
minute (ops.activity's DOMAINS_SINCE), then one Redis pipeline over the keys every worker
obeys (shared.redis.keys): the Retry-After pause left, the leases in flight against the cap,
and when the next request may go (the rate's TAT, in µs of the Redis clock)."""

from __future__ import annotations

from typing import Any

from ops.activity import DOMAINS_SINCE, RATE_WINDOW_S
from ops.dashboard.connections import Connections
from ops.dashboard.text import whole
from shared.redis.errors import translate_redis_errors
from shared.redis.keys import Keys

DOMAINS_LIMIT = 50
SLOW_SHARE = 0.5  # a domain stored at under half its allowed rate, with URLs waiting, is amber


def domains(
    links: Connections, run_id: str, prefix: str | None = None, activity: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """`activity`: the run's recent_activity with its DOMAINS_LIMIT busiest domains, when the
    caller has read it already (data.run_detail does)."""
    settings = links.settings
    if activity is not None:
        busiest = [(str(d["domain"]), whole(d["pages"])) for d in activity["top_domains"]]
    else:
        window = {"run_id": run_id, "window_s": RATE_WINDOW_S, "limit": DOMAINS_LIMIT}
        with links.db() as conn:
            busiest = [(str(d or ""), whole(n)) for d, n in conn.execute(DOMAINS_SINCE, window)]
    if not busiest:
        return []
    keys = Keys(prefix or settings.redis_prefix)
    client = links.redis
    with translate_redis_errors(settings.redis_url):
        seconds, micros = client.time()
        now_us = seconds * 1_000_000 + micros
        pipe = client.pipeline(transaction=False)
        for domain, _ in busiest:
            pipe.pttl(keys.pause(domain))
            pipe.zcount(keys.inflight(domain), now_us, "+inf")
            pipe.get(keys.rate(domain))
        answers = pipe.execute()
    rows = []
    for n, (domain, stored) in enumerate(busiest):
        pause_ms, in_flight, tat = answers[3 * n : 3 * n + 3]
        next_in_s = max(0.0, (int(tat) - now_us) / 1_000_000) if tat else 0.0
        observed = round(stored / RATE_WINDOW_S, 2)
        rows.append(
            {
                "domain": domain,
                "configured_rps": settings.rate_limit_rps,
                "observed_per_s": observed,
                "in_flight": int(in_flight),
                "max_in_flight": settings.max_concurrent_per_domain,
                "pause_left_s": round(pause_ms / 1000, 1) if pause_ms and pause_ms > 0 else 0.0,
                "next_slot_in_s": round(next_in_s, 2),
                "slow": observed < SLOW_SHARE * settings.rate_limit_rps,
            }
        )
    return rows
