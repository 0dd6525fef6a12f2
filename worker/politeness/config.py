"""How hard the worker may press on each domain, as configured: the settings' defaults
(RATE_LIMIT_RPS, MAX_CONCURRENT_PER_DOMAIN) and each domain's own line in POLITENESS_FILE.

Apart from the gate that applies it (worker/politeness/gate.py): it is read once, at start, and the
file's format and the errors that stop a worker on a bad line are a subject of their own.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shared.errors import ConfigError
from shared.settings import Settings


@dataclass(frozen=True)
class DomainPolicy:
    rate_limit_rps: float
    max_concurrent: int

    def rate_per_s(self, crawl_delay_s: float | None) -> float:
        """The configured rate, or less if robots.txt asks for a longer delay between requests."""
        if crawl_delay_s is not None and crawl_delay_s > 0:
            return min(self.rate_limit_rps, 1.0 / crawl_delay_s)
        return self.rate_limit_rps


_POLICY_KEYS = {"rate_limit_rps": float, "max_concurrent": int}


class PolitenessConfig:
    """Settings' defaults plus per-domain overrides from a TOML file:

        [domains."example.com"]
        rate_limit_rps = 0.5
        max_concurrent = 1

    A domain is host[:port] in lower case, the default port left out (shared.urls.domain_of).
    """

    def __init__(self, default: DomainPolicy, overrides: Mapping[str, DomainPolicy] | None = None) -> None:
        self.default = default
        self.overrides = {domain.lower(): policy for domain, policy in (overrides or {}).items()}

    @classmethod
    def from_settings(cls, settings: Settings) -> PolitenessConfig:
        default = DomainPolicy(settings.rate_limit_rps, settings.max_concurrent_per_domain)
        if not settings.politeness_file:
            return cls(default)
        path = Path(settings.politeness_file)
        try:
            document = tomllib.loads(path.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"POLITENESS_FILE {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"POLITENESS_FILE {path}: {exc}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"POLITENESS_FILE {path}: not UTF-8 text") from None
        return cls(default, _overrides(document, default, str(path)))

    def policy_for(self, domain: str) -> DomainPolicy:
        return self.overrides.get(domain.lower(), self.default)


def _overrides(document: dict[str, Any], default: DomainPolicy, where: str) -> dict[str, DomainPolicy]:
    unknown = set(document) - {"domains"}
    if unknown:
        raise ConfigError(f'{where}: unknown table(s) {sorted(unknown)}; expected [domains."host"]')
    domains = document.get("domains", {})
    if not isinstance(domains, dict):
        raise ConfigError(f"{where}: 'domains' must be a table")
    found: dict[str, DomainPolicy] = {}
    for domain, table in domains.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: domains.{domain!r} must be a table")
        values: dict[str, Any] = {
            "rate_limit_rps": default.rate_limit_rps,
            "max_concurrent": default.max_concurrent,
        }
        for key, raw in table.items():
            kind = _POLICY_KEYS.get(key)
            if kind is None:
                raise ConfigError(
                    f"{where}: domains.{domain!r}.{key}: unknown key; use {sorted(_POLICY_KEYS)}"
                )
            if (
                isinstance(raw, bool)
                or not isinstance(raw, int | float)
                or (kind is int and not isinstance(raw, int))
            ):
                raise ConfigError(
                    f"{where}: domains.{domain!r}.{key}: expected a {kind.__name__}, got {raw!r}"
                )
            if not math.isfinite(raw) or raw <= 0:
                raise ConfigError(f"{where}: domains.{domain!r}.{key}: must be positive, got {raw!r}")
            values[key] = kind(raw)
        found[domain.lower()] = DomainPolicy(**values)
    return found
