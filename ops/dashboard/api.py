"""The JSON API under /api/v1, the seed's /stats and /workers, and /healthz and /readyz.
Field names are ops.status --json's wherever the data overlaps; errors are {"error": one line}."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from typing import Any

import anyio.to_thread
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ops.dashboard import data, deadletters, domains, health, workers
from ops.dashboard.context import Dashboard
from shared.errors import ConfigError, PipelineError, ServiceUnavailable
from shared.settings import redact

MAX_LIMIT = 500
EXPORT_BATCH = 500
CSV_COLUMNS = (
    "id",
    "run_id",
    "url",
    "reason",
    "http_status",
    "attempts",
    "replays",
    "origin_queue",
    "worker_id",
    "state",
    "first_failed_at",
    "last_failed_at",
    "last_error",
)


def error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status)


async def answer(work: Callable[[], Any], status: int = 200) -> Response:
    """Run `work` in a thread; its data as JSON, or a one-line error."""
    try:
        found = await anyio.to_thread.run_sync(work)
    except ConfigError as exc:
        return error(400, str(exc))
    except ServiceUnavailable as exc:
        return error(503, str(exc))
    except PipelineError as exc:
        return error(503, str(exc))
    if found is None:
        return error(404, "not found")
    return JSONResponse(found, status)


def limit_of(request: Request, default: int = 50) -> int:
    raw = request.query_params.get("limit", "")
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) <= MAX_LIMIT:
        raise ConfigError(f"limit must be between 1 and {MAX_LIMIT}")
    return int(raw)


def dash_of(request: Request) -> Dashboard:
    dash: Dashboard = request.app.state.dashboard
    return dash


async def overview(request: Request) -> Response:
    return await answer(dash_of(request).views.report)


async def runs_list(request: Request) -> Response:
    links = dash_of(request).views.links
    try:
        limit = limit_of(request)
    except ConfigError as exc:
        return error(400, str(exc))
    before = request.query_params.get("before") or None
    return await answer(lambda: data.runs_page(links, limit, before))


async def run_one(request: Request) -> Response:
    views = dash_of(request).views
    run_id = request.path_params["run_id"]

    def one() -> dict[str, Any]:
        run = data.run_detail(views.links, run_id, views.get)
        return {k: v for k, v in run.items() if k not in ("queues", "workers", "activity", "namespace")}

    return await answer(one)


async def run_timeline(request: Request) -> Response:
    links = dash_of(request).views.links
    q = request.query_params
    minutes, step = q.get("minutes", "15"), q.get("step", "10")
    if not (minutes.isdigit() and step.isdigit() and 0 < int(minutes) <= 1440 and 0 < int(step) <= 3600):
        return error(400, "minutes must be 1-1440 and step 1-3600")
    run_id = request.path_params["run_id"]
    return await answer(lambda: data.timeline(links, run_id, int(minutes), int(step)))


async def run_domains(request: Request) -> Response:
    views = dash_of(request).views
    run_id = request.path_params["run_id"]

    def rows() -> list[dict[str, Any]]:
        run = data.run_detail(views.links, run_id, views.get)
        return domains.domains(views.links, run_id, run.get("redis_prefix"), run["activity"])

    return await answer(rows)


async def run_errors(request: Request) -> Response:
    links = dash_of(request).views.links
    try:
        limit = limit_of(request, 20)
    except ConfigError as exc:
        return error(400, str(exc))
    return await answer(lambda: data.recent_errors(links, request.path_params["run_id"], limit))


async def dead_letters(request: Request) -> Response:
    links = dash_of(request).views.links
    try:
        shown = deadletters.Filter.from_query(request.query_params)
        limit = limit_of(request)
    except ConfigError as exc:
        return error(400, str(exc))
    after = request.query_params.get("after_id", "")
    return await answer(
        lambda: deadletters.rows(links, shown, int(after) if after.isdigit() else None, limit)
    )


async def dead_letter_summary(request: Request) -> Response:
    links = dash_of(request).views.links
    try:
        shown = deadletters.Filter.from_query(request.query_params)
    except ConfigError as exc:
        return error(400, str(exc))
    return await answer(lambda: deadletters.summary(links, shown))


async def dead_letter_one(request: Request) -> Response:
    links = dash_of(request).views.links
    return await answer(lambda: deadletters.detail(links, int(request.path_params["row_id"])))


async def export(request: Request) -> Response:
    """Every row of the filter, fetched in keyset batches, never all in memory."""
    links = dash_of(request).views.links
    kind = request.path_params["kind"]
    if kind not in ("jsonl", "csv"):
        return error(404, "export as .jsonl or .csv")
    try:
        shown = deadletters.Filter.from_query(request.query_params)
    except ConfigError as exc:
        return error(400, str(exc))

    def lines() -> Iterator[str]:
        after: int | None = None
        if kind == "csv":
            yield _csv_line(CSV_COLUMNS)
        while True:
            batch = deadletters.rows(links, shown, after, EXPORT_BATCH)
            for row in batch:
                yield (
                    (json.dumps(row) + "\n") if kind == "jsonl" else _csv_line([row[c] for c in CSV_COLUMNS])
                )
            if len(batch) < EXPORT_BATCH:
                return
            after = batch[-1]["id"]

    media = "application/x-ndjson" if kind == "jsonl" else "text/csv"
    return StreamingResponse(
        lines(),
        media_type=media,
        headers={"Content-Disposition": f'attachment; filename="dead-letters.{kind}"'},
    )


def _csv_line(values: Any) -> str:
    out = io.StringIO()
    # A cell a spreadsheet would run as a formula starts with a quote instead.
    csv.writer(out).writerow(["'" + v if isinstance(v, str) and v[:1] in "=+-@" else v for v in values])
    return out.getvalue()


async def operation(request: Request) -> Response:
    op = dash_of(request).operations.get(request.path_params["op_id"])
    return JSONResponse(op.view()) if op else error(404, "no such operation")


async def queues(request: Request) -> Response:
    dash = dash_of(request)
    return await answer(lambda: dash.views.report()["queues"])


async def workers_api(request: Request) -> Response:
    dash = dash_of(request)

    def both() -> dict[str, Any]:
        live = dash.views.report()["workers"] or []
        return {"live": live, "gone": workers.gone(dash.views.links, {w["worker_id"] for w in live})}

    return await answer(both)


async def config(request: Request) -> Response:
    dash = dash_of(request)
    s, d = dash.settings, dash.dash
    return JSONResponse(
        {
            "namespace": s.crawl_namespace,
            "redis_prefix": s.redis_prefix,
            "pg_schema": s.pg_schema,
            "management_url": redact(s.rabbitmq_management_url),
            "amqp_url": redact(s.amqp_url),
            "redis_url": redact(s.redis_url),
            "database_url": redact(s.database_url),
            "rate_limit_rps": s.rate_limit_rps,
            "max_concurrent_per_domain": s.max_concurrent_per_domain,
            "proxies": [redact(p) for p in s.proxies.split(",") if p.strip()],
            "dashboard": {
                "host": d.host,
                "port": d.port,
                "read_only": d.read_only,
                "auth": d.auth_required,
                "viewer_token": bool(d.view_token),
                "refresh_s": d.refresh_s,
                "max_streams": d.max_streams,
                "root_path": d.root_path,
                "allowed_hosts": list(d.hosts_allowed()),
            },
            "samplers": dash.hub.figures(),
        }
    )


async def stats(request: Request) -> Response:
    """The seed's contract: {"workers", "tasks": {...}, "throughput": {...}}, of one run or all."""
    dash = dash_of(request)
    run_id = request.query_params.get("run") or None
    return await answer(lambda: health.seed_stats(dash.views.links, run_id, dash.views.get))


async def seed_workers(request: Request) -> Response:
    dash = dash_of(request)
    return await answer(lambda: dash.views.report()["workers"] or [])


async def healthz(_request: Request) -> Response:
    return Response("ok", media_type="text/plain")


async def readyz(request: Request) -> Response:
    failed = await anyio.to_thread.run_sync(health.unready, dash_of(request).settings)
    if failed:
        return JSONResponse({"ready": False, "failed": failed}, 503)
    return JSONResponse({"ready": True})


ROUTES = [
    Route("/api/v1/overview", overview),
    Route("/api/v1/runs", runs_list, methods=["GET"]),
    Route("/api/v1/runs/{run_id}", run_one),
    Route("/api/v1/runs/{run_id}/timeline", run_timeline),
    Route("/api/v1/runs/{run_id}/errors", run_errors),
    Route("/api/v1/runs/{run_id}/domains", run_domains),
    Route("/api/v1/dead-letters", dead_letters),
    Route("/api/v1/dead-letters/summary", dead_letter_summary),
    Route("/api/v1/dead-letters.{kind:str}", export),
    Route("/api/v1/dead-letters/{row_id:int}", dead_letter_one),
    Route("/api/v1/operations/{op_id}", operation),
    Route("/api/v1/queues", queues),
    Route("/api/v1/workers", workers_api),
    Route("/api/v1/config", config),
    Route("/stats", stats),
    Route("/workers", seed_workers),
    Route("/healthz", healthz),
    Route("/readyz", readyz),
]
