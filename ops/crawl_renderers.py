"""When `ops.crawl` starts renderers (python -m renderer), and how many.

A crawl renders when its workers send script shells on (RENDER=auto), or when a rule of its
routing file sends URLs straight to the render queue (`render = "always"`): the producer and
the frontier then publish there, and without a renderer those URLs would wait for ever. Such a
crawl starts one `python -m renderer --processes N` beside its workers, supervised as
`renderer-pool` like the worker pool: N is --renderers, else RENDERER_PROCESSES (1); each
renderer runs its own Chromium with RENDER_CONCURRENCY pages in flight. `--renderers 0` starts
none, for renderers that run elsewhere. A crawl that renders nothing starts none either way.
"""

from __future__ import annotations

from ops.crawl_workers import WorkerLaunch
from producer.routing import load_router
from renderer.chromium import require_chromium
from shared.errors import ConfigError
from shared.settings import Settings

RENDERER_POOL = "renderer-pool"


def why_render(settings: Settings) -> str | None:
    """What makes the crawl render, in a few words; None for a crawl that renders nothing."""
    if settings.render == "auto":
        return "RENDER=auto"
    router = load_router(settings.routing_file)
    if any(rule.render for rule in router.rules):
        return f'{router.source} has render = "always"'
    return None


def renderer_launches(settings: Settings, renderers: int | None) -> list[WorkerLaunch]:
    """The renderer pool the crawl starts: none, or one of `renderers` processes
    (RENDERER_PROCESSES when None). A crawl that renders needs CHROMIUM_PATH, checked here."""
    if renderers is not None and renderers < 0:
        raise ConfigError("--renderers: must be 0 or more")
    count = settings.renderer_processes if renderers is None else renderers
    if count == 0 or why_render(settings) is None:
        return []
    require_chromium(settings.chromium_path)
    return [WorkerLaunch(RENDERER_POOL, ("--processes", str(count)), count, module="renderer")]


def renderers_line(settings: Settings, launches: list[WorkerLaunch]) -> str:
    """The crawl's line about its renderers; empty for a crawl that renders nothing."""
    reason = why_render(settings)
    if reason is None:
        return ""
    if not launches:
        return f"renders ({reason}), but --renderers 0: the render queue waits for renderers run elsewhere"
    count = launches[0].processes
    return (
        f"renders ({reason}): {count} renderer{'s' if count != 1 else ''} "
        f"with {settings.render_concurrency} pages in flight each"
    )
