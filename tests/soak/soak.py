"""One soak, start to end: the soak's own services and the fault proxies in front of them, the
sites, the pipeline's processes, the load, the nemesis, the drain, the checker, the report.

The pipeline's processes reach RabbitMQ, Redis and PostgreSQL only through the proxies (the
links the nemesis degrades); the soak's own reads (the ledger, the management API, the checks)
go to the services directly. RabbitMQ's management API is not proxied.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ops import management
from shared.amqp import broker
from shared.amqp.topology import build_topology
from shared.postgres import db
from shared.settings import Settings
from tests.faults.fleet import Fleet
from tests.faults.ledger import take_ledger
from tests.soak import checker
from tests.soak.cast import Cast, rss_kb
from tests.soak.load import Load, plan
from tests.soak.nemesis import Nemesis
from tests.soak.proxy import FaultProxy
from tests.soak.schedule import draw
from tests.soak.services import OwnServices, Ports

REPO = Path(__file__).resolve().parents[2]
RSS_EVERY_S = 10.0
POLL_S = 1.0
DRAIN_POLL_S = 5.0
STUCK_S = 90.0  # a redelivery after a consumer timeout or a delay queue takes less
NAMES = "soak"


@dataclass(frozen=True)
class Options:
    minutes: float
    seed: int
    urls: int
    port_base: int
    drain_minutes: float
    folder: Path

    @property
    def window_s(self) -> float:
        return self.minutes * 60


def pipeline_env(services: OwnServices, ports: Ports, warc_dir: Path, proxied: bool) -> dict[str, str]:
    def through(service: str) -> int:
        return ports.proxied(service) if proxied else ports.service(service)

    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("AMQP_", "REDIS_", "DATABASE_"))},
        "AMQP_URL": f"amqp://guest:guest@127.0.0.1:{through('amqp')}/%2f",
        "REDIS_URL": f"redis://127.0.0.1:{through('redis')}/0",
        "DATABASE_URL": f"postgresql://postgres@127.0.0.1:{through('postgres')}/crawler",
        "RABBITMQ_MANAGEMENT_URL": services.direct_env()["RABBITMQ_MANAGEMENT_URL"],
        "CRAWL_NAMESPACE": NAMES,
        "REDIS_PREFIX": NAMES,
        "PG_SCHEMA": NAMES,
        "FETCH_ALLOWLIST": "127.0.0.0/8",  # the sites are on loopback, which the guard refuses
        "RATE_LIMIT_RPS": "5000",  # one domain serves every URL here: the site sets the pace
        "MAX_CONCURRENT_PER_DOMAIN": "64",
        "RETRY_DELAYS_S": "1,3",
        "TTL_QUEUE_EXPIRY_S": "7200",
        "HEARTBEAT_S": "5",  # a pause of 14 s or more is past it
        "FETCH_CONCURRENCY": "16",
        "WARC_DIR": str(warc_dir),
        "WARC_MAX_BYTES": "20000000",
        "RENDER": "auto",
        "RENDER_CONCURRENCY": "2",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
    }


class Soak:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.ports = Ports(options.port_base)
        self.folder = options.folder
        self.services = OwnServices(self.ports, self.folder / "services")
        self.warc_dir = self.folder / "warc"
        self.env = pipeline_env(self.services, self.ports, self.warc_dir, proxied=True)
        self.direct_env = pipeline_env(self.services, self.ports, self.warc_dir, proxied=False)
        self.settings = Settings.from_env(self.direct_env)
        self.schedule = draw(options.seed, options.window_s)
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []
        self.proxies: dict[str, FaultProxy] = {}
        self.started = 0.0

    def say(self, text: str) -> None:
        at = time.monotonic() - self.started if self.started else 0.0
        print(f"soak [{at:7.1f}s] {text}", flush=True)

    def run(self) -> int:
        o = self.options
        print(
            f"soak: seed {o.seed}, {o.minutes:g} minutes of faults, {o.urls} URLs, ports from {o.port_base}"
        )
        print(f"soak: replay with SOAK_SEED={o.seed} SOAK_MINUTES={o.minutes:g} SOAK_URLS={o.urls} make soak")
        print(f"soak: {len(self.schedule)} faults scheduled:")
        for fault in self.schedule:
            print(f"  {fault.describe()}")
        if self.folder.exists():
            shutil.rmtree(self.folder, ignore_errors=True)
        self.warc_dir.mkdir(parents=True)
        fleet = Fleet(self.folder / "logs", self.env)
        load = Load(plan(o.seed, o.urls, o.window_s), self.settings)
        try:
            self.services.start()
            for service in ("amqp", "redis", "postgres"):
                self.proxies[service] = FaultProxy(
                    self.ports.proxied(service), self.ports.service(service)
                ).start()
            self._prepare()
            load.start_sites()
            cast = Cast(fleet, self.ports.dashboard)
            cast.start_all()
            nemesis = Nemesis(self.schedule, cast, self.services.outage, self.proxies, o.seed)
            self.started = time.monotonic()
            nemesis.start()
            self.say(f"{load.urls} URLs in {len(load.runs)} runs; nemesis started")
            self._loop(cast, load, nemesis, until_s=o.window_s)
            nemesis.stop()
            self.say(f"fault window over: {nemesis.history.by_kind()}; draining")
            drained = self._drain(cast, load, nemesis)
            self._sample(cast)
            verdicts = self._check(load, drained)
            verdicts.append(
                checker.processes([r for _t, r in nemesis.history.revived], cast.logs_with_tracebacks())
            )
            return self._report(nemesis, load, verdicts)
        finally:
            self._clean_up(fleet, load)

    def _clean_up(self, fleet: Fleet, load: Load) -> None:
        """Everything the soak started is stopped, whatever ended it (a check, an error, a
        signal): a second signal meanwhile is ignored, and one step failing skips no other."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        steps: list[Callable[[], object]] = [
            fleet.stop,
            fleet.close,
            *(p.stop for p in self.proxies.values()),
            load.stop,
            self.services.stop,
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # said, and the next step goes on
                print(f"soak: cleaning up: {type(exc).__name__}: {exc}", flush=True)
        print(
            f"soak: every process and service of the soak stopped; logs in {self.folder / 'logs'}", flush=True
        )

    def _prepare(self) -> None:
        """Schema and topology before anything starts, so the first request finds its queue."""
        db.ensure_schema(self.settings)
        connection = broker.connect(self.settings, "soak-setup")
        try:
            broker.declare_topology(connection, build_topology(self.settings))
        finally:
            connection.close()

    def _now(self) -> float:
        return time.monotonic() - self.started

    def _loop(self, cast: Cast, load: Load, nemesis: Nemesis, until_s: float) -> None:
        """Until `until_s`: submit each wave when due, start again a process that exited on its
        own (a restart policy's work), sample RSS."""
        last_sample = -RSS_EVERY_S
        while (now := self._now()) < until_s:
            for wave in load.due(now):
                load.submit(wave, now)
                self.say(f"wave {wave.index} submitted: {wave.sitemap_run}, {wave.discover_run}")
            for revived in cast.revive_exited():
                nemesis.history.revived.append((now, revived))
                self.say(f"exited on its own, started again: {revived}")
            if now - last_sample >= RSS_EVERY_S:
                self._sample(cast)
                last_sample = now
            time.sleep(POLL_S)

    def _sample(self, cast: Cast) -> None:
        found: dict[str, tuple[int, int]] = {}
        for name, pid in cast.pids().items():
            rss = rss_kb(pid)
            if rss is not None:
                found[name] = (pid, rss)
        self.samples.append((self._now(), found))

    def _drain(self, cast: Cast, load: Load, nemesis: Nemesis) -> bool:
        """Until every URL has its outcome and every queue is empty; or until nothing is queued
        and no outcome has come for STUCK_S (what is missing then will not come); or until the
        drain's time is up."""
        deadline = self._now() + self.options.drain_minutes * 60
        get = management.getter(self.settings)
        last_sample, last_said = self._now(), 0.0
        missing_before, changed_at = -2, self._now()
        while self._now() < deadline:
            for wave in load.due(float("inf")):
                load.submit(wave, self._now())
            for revived in cast.revive_exited():
                nemesis.history.revived.append((self._now(), revived))
                self.say(f"exited on its own, started again: {revived}")
            try:
                missing = sum(len(take_ledger(self.settings, r.run_id, r.urls).lost) for r in load.runs)
                left = checker.queues(get, self.settings.rabbitmq_management_url).figures["messages_left"]
            except Exception as exc:  # a service still coming back
                self.say(f"drain: not readable yet ({type(exc).__name__})")
                missing, left = -1, -1
            if missing == 0 and left == 0:
                self.say("drained: every URL has its outcome, every queue is empty")
                return True
            if missing != missing_before:
                missing_before, changed_at = missing, self._now()
            if left == 0 and self._now() - changed_at > STUCK_S:
                self.say(f"drain: {missing} URLs without an outcome and nothing queued for {STUCK_S:.0f} s")
                return False
            if self._now() - last_said >= 30:
                self.say(f"drain: {missing} URLs without an outcome, {left} messages in queues")
                last_said = self._now()
            if self._now() - last_sample >= RSS_EVERY_S:
                self._sample(cast)
                last_sample = self._now()
            time.sleep(DRAIN_POLL_S)
        self.say("drain: time is up")
        return False

    def _check(self, load: Load, drained: bool) -> list[checker.Verdict]:
        get = management.getter(self.settings)
        accounting, _ledgers = checker.accounting(self.settings, load.runs)
        verdicts = [
            accounting,
            checker.queues(get, self.settings.rabbitmq_management_url),
            checker.warc(self.direct_env, str(self.warc_dir)),
            checker.figures(
                self.settings, self.direct_env, f"http://127.0.0.1:{self.ports.dashboard}", load.runs
            ),
            checker.memory(self.samples, soak_s=self.samples[-1][0]),
        ]
        if not drained:
            verdicts[0].problems.insert(
                0, "not drained: URLs without an outcome (see the drain's lines above)"
            )
        return verdicts

    def _report(self, nemesis: Nemesis, load: Load, verdicts: list[checker.Verdict]) -> int:
        o = self.options
        print("\nsoak: fault history (as carried out):")
        for entry in sorted(nemesis.history.done, key=lambda e: e.began_s):
            print(f"  {entry.line()}")
        for at, revived in nemesis.history.revived:
            print(f"  {at:8.1f}s  exited on its own, started again: {revived}")
        print(f"\nsoak: seed {o.seed}; faults by kind {nemesis.history.by_kind()}")
        for verdict in verdicts:
            for line in verdict.lines():
                print(f"  {line}")
        ok = all(v.ok for v in verdicts)
        summary: dict[str, Any] = {
            "seed": o.seed,
            "minutes": o.minutes,
            "urls": load.urls,
            "faults": len(nemesis.history.done),
            "faults_by_kind": nemesis.history.by_kind(),
            "fault_errors": sum(1 for e in nemesis.history.done if e.error),
            "exited_on_own": len(nemesis.history.revived),
            "checks": {v.name: {"ok": v.ok, **v.figures} for v in verdicts},
            "ok": ok,
            "schedule": [json.loads(f.to_json()) for f in self.schedule],
        }
        out = REPO / "var" / "soak"
        out.mkdir(parents=True, exist_ok=True)
        (out / f"soak-{o.seed}.json").write_text(json.dumps(summary, indent=1))
        print(f"\nsoak: {'PASS' if ok else 'FAIL'} (seed {o.seed}); summary in var/soak/soak-{o.seed}.json")
        return 0 if ok else 1


def options_from_env(environ: dict[str, str]) -> Options:
    def number(name: str, default: str, kind: type[float] | type[int]) -> Any:
        text = environ.get(name) or default
        try:
            value = kind(text)
        except ValueError:
            raise SystemExit(f"soak: {name}={text!r} is not a number") from None
        if value <= 0 and name != "SOAK_SEED":
            raise SystemExit(f"soak: {name}={text!r} must be more than 0")
        return value

    seed = number("SOAK_SEED", str(random.SystemRandom().randrange(1, 10**6)), int)
    base = number("SOAK_PORT_BASE", "27100", int)
    return Options(
        minutes=number("SOAK_MINUTES", "30", float),
        seed=seed,
        urls=number("SOAK_URLS", "50000", int),
        port_base=base,
        drain_minutes=number("SOAK_DRAIN_MINUTES", "15", float),
        folder=Path(environ.get("SOAK_DIR") or f"/var/tmp/crawl-soak-{base}"),
    )
