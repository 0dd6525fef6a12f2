"""What ops.status shows of politeness beyond the queues: each proxy's health, and the domains
slowed down now, with the jitter between requests. Read from Redis only (shared/redis/keys.py).

    "proxies": [{"proxy": "socks5h://127.0.0.1:1080", "state": "usable", "benched_s": 0.0,
                 "recent_failures": 1}],
    "politeness": {"rate_jitter": 0.2, "slowed_domains": [{"domain": "a.example",
                   "configured_rps": 2.0, "rps_now": 1.1, "reason": "429", "since_s": 12.5}]}

Proxies appear by scheme, host and port only; their credentials are never read into the report.
"""

from __future__ import annotations

from typing import Any

import redis

from shared.errors import ConfigError
from shared.redis.keys import Keys
from shared.settings import Settings

MAX_DOMAINS = 20  # slowed domains listed; the rest are counted


def proxy_health(settings: Settings, client: redis.Redis) -> list[dict[str, Any]] | dict[str, str]:
    """Each configured proxy: benched or usable, and its failures in the current window; or
    {"error": ...} when the proxies cannot be read (PROXY_FILE missing here)."""
    from shared.http.proxies import proxies_of

    try:
        labels = [proxy.label for proxy in proxies_of(settings)]
    except ConfigError as exc:
        return {"error": str(exc)}
    keys = Keys(settings.redis_prefix)
    health = []
    for label in labels:
        benched_ms = int(client.pttl(keys.proxy_bench(label)))
        failures = client.get(keys.proxy_failures(label))
        health.append(
            {
                "proxy": label,
                "state": "benched" if benched_ms > 0 else "usable",
                "benched_s": max(0, benched_ms) / 1000,
                "recent_failures": int(failures) if failures is not None else 0,
            }
        )
    return health


def politeness_figures(settings: Settings, client: redis.Redis) -> dict[str, Any]:
    from worker.politeness.config import PolitenessConfig
    from worker.politeness.ratelimit import slowed_domains

    config = PolitenessConfig.from_settings(settings)
    slowed = slowed_domains(client, Keys(settings.redis_prefix), settings.rate_recovery_s)
    listed = []
    for domain, slowdown in sorted(slowed.items(), key=lambda item: item[1].fraction)[:MAX_DOMAINS]:
        configured = config.policy_for(domain).rate_limit_rps
        listed.append(
            {
                "domain": domain,
                "configured_rps": configured,
                "rps_now": round(configured * slowdown.fraction, 2),
                "reason": slowdown.reason,
                "since_s": round(slowdown.since_s, 1),
            }
        )
    return {"rate_jitter": settings.rate_jitter, "slowed_domains": listed, "slowed_total": len(slowed)}


def politeness_lines(report: dict[str, Any]) -> list[str]:
    """The section of the text view."""
    lines: list[str] = []
    proxies = report.get("proxies")
    if isinstance(proxies, dict):
        lines.append(f"proxies: unknown ({proxies['error']})")
    elif proxies:
        usable = sum(1 for p in proxies if p["state"] == "usable")
        lines.append(f"proxies: {usable} of {len(proxies)} usable")
        lines += [
            f"  {p['proxy']}  {p['state']}"
            + (f" {p['benched_s']:.0f} s more" if p["state"] == "benched" else "")
            + f", {p['recent_failures']} recent failures"
            for p in proxies
        ]
    politeness = report.get("politeness")
    if politeness is not None:
        slowed = politeness["slowed_domains"]
        jitter = politeness["rate_jitter"]
        lines.append(
            f"slowed domains: {politeness['slowed_total']}"
            + (f" (jitter up to +{jitter:.0%} between requests)" if jitter else " (no jitter)")
        )
        lines += [
            f"  {d['domain']}  {d['rps_now']:g}/s of {d['configured_rps']:g}/s after {d['reason']}, "
            f"{d['since_s']:.0f} s ago"
            for d in slowed
        ]
    return lines
