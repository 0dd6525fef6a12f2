"""What each live view shows: its data (a context) and its regions (fragments rendered from
templates/_partials). A page at GET and its live stream render the same partials from the same
context, so a page without JavaScript shows exactly what the live one does."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
import requests

from ops import management
from ops.dashboard import data, deadletters, domains, workers
from ops.dashboard.config import DashboardSettings
from ops.dashboard.connections import Connections
from ops.dashboard.text import linkable, short_error
from ops.status import gather
from shared.amqp.topology import queue_role
from shared.progress import duration
from shared.settings import Settings, redact

TEMPLATES = Path(__file__).parent / "templates"
MANAGEMENT_CACHE_S = 5.0  # RabbitMQ refreshes its figures every 5 s anyway
# The regions of each kind of view, in page order.
REGIONS = {
    "overview": ("header", "runs_table", "activity", "queue_summary"),
    "run": (
        "header",
        "run_progress",
        "run_identity",
        "run_why",
        "run_timeline",
        "run_politeness",
        "run_render",
        "run_reasons",
        "run_errors",
        "run_workers",
        "run_actions",
    ),
    "queues": ("header", "queues_table"),
    "workers": ("header", "workers_live", "workers_gone"),
    "dead-letters": ("header", "dl_summary"),
}


class CachedGet:
    """The management API's answers kept MANAGEMENT_CACHE_S, shared by every view."""

    def __init__(self, get: management.HttpGet, clock: Callable[[], float] = time.monotonic) -> None:
        self._get = get
        self._clock = clock
        self._kept: dict[str, tuple[float, Any]] = {}
        self._lock = threading.Lock()

    def __call__(self, url: str) -> Any:
        with self._lock:
            kept = self._kept.get(url)
            if kept and self._clock() - kept[0] < MANAGEMENT_CACHE_S:
                return kept[1]
        answer = self._get(url)
        with self._lock:
            self._kept[url] = (self._clock(), answer)
        return answer


def environment(root_path: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,  # every value is text unless a template says otherwise, and none does
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = duration
    env.filters["linkable"] = linkable
    env.filters["short"] = short_error
    env.filters["when"] = lambda iso: "" if not iso else str(iso)[:19].replace("T", " ")
    env.filters["num"] = lambda n: "?" if n is None else f"{n:,}"
    env.globals["root"] = root_path
    return env


class Views:
    """Builds the context of a view and renders its regions. Every method is synchronous: the
    sampler and the page routes call them in a worker thread."""

    def __init__(
        self,
        settings: Settings,
        dash: DashboardSettings,
        get: management.HttpGet | None = None,
        links: Connections | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.dash = dash
        self.env = environment(dash.root_path)
        self.links = links or Connections(settings)
        self.get = CachedGet(get or self.links.management_get(), clock)

    def meta(self) -> dict[str, Any]:
        return {
            "namespace": self.settings.crawl_namespace,
            "redis_prefix": self.settings.redis_prefix,
            "pg_schema": self.settings.pg_schema,
            "read_only": self.dash.read_only,
            "auth": self.dash.auth_required,
            "refresh_s": self.dash.refresh_s,
            "management_url": redact(self.settings.rabbitmq_management_url),
        }

    def context(self, kind: str, arg: Any = None) -> dict[str, Any]:
        builders: dict[str, Callable[[Any], dict[str, Any]]] = {
            "overview": lambda _: self._overview(),
            "run": self._run,
            "queues": lambda _: self._queues(),
            "workers": lambda _: self._workers(),
            "dead-letters": self._dead_letters,
        }
        ctx = builders[kind](arg)
        ctx.setdefault("header", header(ctx.get("queues"), ctx.get("workers")))
        return {**ctx, "meta": self.meta()}

    def regions(self, kind: str, ctx: dict[str, Any]) -> dict[str, str]:
        return {name: self.env.get_template(f"_partials/{name}.html").render(ctx) for name in REGIONS[kind]}

    def produce(self, kind: str, arg: Any = None) -> Callable[[], dict[str, str]]:
        return lambda: self.regions(kind, self.context(kind, arg))

    def page(self, template: str, ctx: dict[str, Any]) -> str:
        return self.env.get_template(template).render(ctx)

    def report(self) -> dict[str, Any]:
        """ops.status.gather's overview, over the connections held."""
        with self.links.db() as conn:
            return gather(self.settings, None, self.get, conn=conn, client=self.links.redis)

    def _overview(self) -> dict[str, Any]:
        report = self.report()
        return {
            "runs": data.runs_page(self.links),
            "report": report,
            "queues": report["queues"],
            "workers": report["workers"],
            "activity": report["activity"],
        }

    def _run(self, run_id: str) -> dict[str, Any]:
        run = data.run_detail(self.links, run_id, self.get)
        return {
            "run": run,
            "timeline": data.timeline(self.links, run_id),
            "errors": data.recent_errors(self.links, run_id),
            "why": why_not_moving(run),
            "domains": domains.domains(self.links, run_id, run.get("redis_prefix"), run["activity"]),
            "queues": run["queues"],
            "workers": run["workers"],
        }

    def _queues(self) -> dict[str, Any]:
        report = self.report()
        return {
            "queues": report["queues"],
            "workers": report["workers"],
            "queue_source": report["queue_source"],
            "warnings": queue_warnings(report["queues"]),
        }

    def _workers(self) -> dict[str, Any]:
        report = self.report()
        live = report["workers"] or []
        return {
            "queues": report["queues"],
            "workers": report["workers"],
            "live": workers.by_host(live),
            "gone": workers.gone(self.links, {w["worker_id"] for w in live}),
        }

    def _dead_letters(self, shown: deadletters.Filter) -> dict[str, Any]:
        queues = _queues_or_none(self.settings, self.get)
        return {
            "filter": shown,
            "summary": deadletters.summary(self.links, shown),
            "queues": queues,
            "workers": workers.running(self.links),
        }


def _queues_or_none(settings: Settings, get: management.HttpGet) -> list[dict[str, Any]] | None:
    try:
        listed = management.list_queues(settings, get)
    except requests.RequestException:
        return None
    if listed is None:
        return None
    return [
        {
            "name": q["name"],
            "role": queue_role(settings.crawl_namespace, q["name"]),
            "exists": True,
            "ready": q.get("messages_ready"),
            "unacked": q.get("messages_unacknowledged"),
            "consumers": q.get("consumers"),
        }
        for q in listed
        if queue_role(settings.crawl_namespace, q["name"]) is not None
    ]


def header(queues: list[dict[str, Any]] | None, running: list[dict[str, Any]] | None) -> dict[str, Any]:
    parked = sum(int(q["ready"] or 0) for q in queues or [] if q["role"] == "parked")
    return {"workers": None if running is None else len(running), "parked": parked}


def queue_warnings(queues: list[dict[str, Any]]) -> list[str]:
    found = []
    for q in queues:
        if q["role"] == "work" and q["exists"] and (q["ready"] or 0) > 0 and q["consumers"] == 0:
            found.append(f"{q['name']} has {q['ready']} ready messages and no consumer")
        if q["role"] == "parked" and (q["ready"] or 0) > 0:
            found.append(f"{q['name']} holds {q['ready']} parked messages")
        if q["role"] == "dead" and (q["ready"] or 0) > 0:
            found.append(f"{q['name']} holds {q['ready']} messages: is the dead-letter consumer running?")
    return found


def why_not_moving(run: dict[str, Any]) -> str | None:
    """Only when nothing moves while something is left: the first reason that holds."""
    if run["pages_per_s"] > 0 or run["left"] <= 0:
        return None
    if run["state"] == "paused":
        return f"paused: {run['held']} URLs wait in the hold queue; resume to go on"
    if not run["workers"]:
        return "no workers are running"
    where = run["identity"]["shared_queues"]
    waiting = sum(v for k, v in where.items() if k.startswith("work_"))
    deferred = sum(v for k, v in where.items() if k.startswith(("defer_", "retry_")))
    if waiting == 0 and deferred > 0:
        return f"everything waits in defer and retry queues ({deferred} messages)"
    if waiting == 0 and deferred == 0 and not run["producing"]:
        return f"lost: {run['left']} URLs are left but every work, retry and defer queue is empty"
    return None
