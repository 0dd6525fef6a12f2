"""The renderer's soak: many renders through one engine, its memory sampled, its browsers counted
after the stop.

    python -m bench.render_soak [--renders 2000] [--concurrency 4]

The renders cycle over the script-built pages of bench/script_site.py (content and links built
by scripts, a popup, a page that navigates away, and every 50th a page that allocates until its
renderer process crashes). Every `--sample-every` renders (20) it reads the memory of the renderer's
whole tree: this process, the Playwright driver, and the browser (PSS, so pages the processes
share count once). It prints the samples, the growth over the second half (the last sample
against the one at the half, a least-squares slope in MB per 1,000 renders, and the mean of
each quarter's samples, the last quarter's over the third's), and the
Chromium processes left once the engine and its watchdog have stopped, which must be 0.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from bench.script_site import SITE_HOST, Canary, ScriptSite
from renderer.engine import RenderEngine
from renderer.page import RenderCrashed
from renderer.processes import all_processes, descendants, proportional_bytes
from renderer.watchdog import Watchdog
from shared.errors import TaskError
from shared.http.netguard import AddressGuard, address_policy
from shared.settings import Settings

CYCLE = ("/content", "/links", "/popup", "/away")
CRASH_EVERY = 50


def tree_memory_mb() -> tuple[float, float]:
    """This process and everything below it (the driver, the browser, the watchdog), and this
    process alone: a leak of ours and a leak of the browser's grow different figures."""
    own = proportional_bytes(os.getpid())
    below = sum(proportional_bytes(p.pid) for p in descendants(os.getpid()))
    return round((own + below) / 2**20, 1), round(own / 2**20, 1)


def cpu_seconds() -> float:
    """CPU of this process and of everything below it now (the browser's processes that ended,
    a crashed page's, are missed: a lower bound)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in [os.getpid(), *(p.pid for p in descendants(os.getpid()))]:
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat_file:
                fields = stat_file.read().decode("utf-8", "replace").rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def percentile(values: list[int], share: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))] if ordered else 0


def slope_mb_per_1000(points: list[tuple[int, float]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in points)
    variance = sum((x - mean_x) ** 2 for x, _ in points) or 1.0
    return covariance / variance * 1000


def quarter_means(points: list[tuple[int, float]], renders: int) -> list[float]:
    """The mean of the samples in each quarter of the renders. A single sample catches the
    browser's sawtooth wherever it is (a context's pages grow until it is replaced, a page
    allocating towards its cap may be in flight), so a leak is told by the quarters' means:
    flat if the last quarter's is no higher than the third's."""
    means = []
    for quarter in range(4):
        low, high = quarter * renders / 4, (quarter + 1) * renders / 4
        inside = [y for x, y in points if low < x <= high]
        means.append(round(sum(inside) / len(inside), 1) if inside else 0.0)
    return means


def soak(renders: int, concurrency: int, sample_every: int) -> dict[str, object]:
    canary = Canary()
    site = ScriptSite(canary)
    settings = dataclasses.replace(
        Settings.from_env({"FETCH_ALLOWLIST": f"{SITE_HOST}/32", "RENDER_DEADLINE_S": "10"}),
        render_concurrency=concurrency,
    )
    watchdog = Watchdog.start()
    engine = RenderEngine(settings, AddressGuard(address_policy(settings)), watchdog).start()
    outcomes: dict[str, int] = {}
    samples: list[tuple[int, float]] = []
    own_samples: list[tuple[int, float]] = []
    process_samples: list[tuple[int, int]] = []  # Chromium's processes: a stray one shows here first
    render_ms: list[int] = []
    browsers_seen: set[int] = set()
    details: dict[str, str] = {}  # the first error of each kind, for a person to read

    def one(index: int) -> str:
        path = "/memory" if index % CRASH_EVERY == CRASH_EVERY - 1 else CYCLE[index % len(CYCLE)]
        try:
            render_ms.append(engine.render(site.url(path)).render_ms)
        except RenderCrashed as exc:
            if path != "/memory":
                details.setdefault(f"crashed on {path}", str(exc)[:300])
            return "crashed" if path == "/memory" else "crashed_unexpectedly"
        except TaskError as exc:
            details.setdefault(exc.reason, str(exc)[:300])
            return exc.reason
        return "ok" if path != "/memory" else "memory_page_survived"

    started, cpu_started = time.monotonic(), cpu_seconds()
    with ThreadPoolExecutor(concurrency) as pool:
        for done, outcome in enumerate(pool.map(one, range(renders)), 1):
            outcomes[outcome] = outcomes.get(outcome, 0) + 1
            if done % sample_every == 0:
                tree_mb, own_mb = tree_memory_mb()
                samples.append((done, tree_mb))
                own_samples.append((done, own_mb))
                below = descendants(os.getpid())
                browsers_seen |= {p.pgid for p in below if p.pid == p.pgid}
                process_samples.append((done, sum(1 for p in below if p.pgid in browsers_seen)))
    elapsed_s, cpu_s = time.monotonic() - started, cpu_seconds() - cpu_started
    assert engine.pool is not None
    figures = dataclasses.asdict(engine.pool.figures)
    engine.close()
    watchdog.stop()
    site.close()
    canary.close()
    left = [p.pid for p in all_processes() if p.pgid in browsers_seen]
    second_half = [point for point in samples if point[0] > renders // 2]
    own_second_half = [point for point in own_samples if point[0] > renders // 2]
    half = min(samples, key=lambda point: abs(point[0] - renders // 2)) if samples else (0, 0.0)
    quarters = quarter_means(samples, renders)
    return {
        "renders": renders,
        "concurrency": concurrency,
        "seconds": round(elapsed_s, 1),
        "pages_per_s": round(renders / elapsed_s, 2),
        "cpu_ms_per_render_at_least": round(cpu_s * 1000 / renders, 1),
        "render_ms_p50_p95_max": [
            percentile(render_ms, 0.5),
            percentile(render_ms, 0.95),
            max(render_ms, default=0),
        ],
        "outcomes": outcomes,
        "errors": details,
        "pool": figures,
        "memory_mb_samples": samples,
        "second_half_growth_mb": round(samples[-1][1] - half[1], 1) if samples else 0.0,
        "second_half_slope_mb_per_1000": round(slope_mb_per_1000(second_half), 1),
        "quarter_means_mb": quarters,
        "last_quarter_over_third": round(quarters[3] / (quarters[2] or 1.0), 3),
        "renderer_process_mb_samples": own_samples,
        "browser_process_samples": process_samples,
        "renderer_process_second_half_slope_mb_per_1000": round(slope_mb_per_1000(own_second_half), 1),
        "chromium_processes_after_stop": len(left),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.render_soak", description=__doc__.splitlines()[0])
    parser.add_argument("--renders", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sample-every", type=int, default=20)
    args = parser.parse_args(argv)
    result = soak(args.renders, args.concurrency, max(1, args.sample_every))
    print(json.dumps(result, indent=1))
    return 0 if result["chromium_processes_after_stop"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
