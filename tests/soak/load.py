"""What the soak crawls: waves of runs over local sites, submitted to the producer service one
after another across the fault window, so that faults always find work in flight.

Each wave is two runs:
    sitemap   a FaultSite (tests/faults/site.py) read from its sitemaps: plain pages, news (the
              ttl queue), pages that always answer 500 (retried, then dead), charset traps
              (a parse error: dead at once) and a few pages built by a script (the renderer)
    discover  a GraphSite crawled by discovery from /p/0 (the frontier consumer), every page
              reachable
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from ops.submit import submit
from shared.errors import PipelineError
from shared.settings import Settings
from tests.faults.site import FaultSite, GraphSite, SiteShape
from tests.local_site import LocalSite
from tests.soak.checker import Run

SITEMAP_SHARE = 0.8
ALWAYS_500_SHARE = 0.002
CHARSET_TRAP_SHARE = 0.002
NEWS_SHARE = 0.05
SCRIPT_SHELLS_PER_WAVE = 8  # Chromium is slow here; a small share of the URLs
SUBMIT_RETRY_S = 2.0
WAVE_EVERY_S = 75.0


@dataclass(frozen=True)
class Wave:
    index: int
    at_s: float
    sitemap_run: str
    discover_run: str
    shape: SiteShape
    graph_pages: int


def plan(seed: int, urls: int, window_s: float) -> list[Wave]:
    """Waves of about equal size, one every WAVE_EVERY_S or so, the last submitted at 80 % of
    the window: each process does the same work many times over, so its memory after the first
    waves is its steady state."""
    count = max(3, round(window_s / WAVE_EVERY_S))
    base, extra = divmod(urls, count)  # the first `extra` waves take one URL more: `urls` in all
    waves = []
    for index in range(count):
        per_wave = base + (1 if index < extra else 0)
        sitemap_urls = int(per_wave * SITEMAP_SHARE)
        always_500 = max(2, int(sitemap_urls * ALWAYS_500_SHARE))
        traps = max(2, int(sitemap_urls * CHARSET_TRAP_SHARE))
        news = int(sitemap_urls * NEWS_SHARE)
        shells = SCRIPT_SHELLS_PER_WAVE
        pages = sitemap_urls - always_500 - traps - news - shells
        if pages < 1 or per_wave - sitemap_urls < 1:
            too_few = f"SOAK_URLS={urls} is too few for {count} waves of {window_s:g} s"
            raise ValueError(f"{too_few}: give at least {count * 100}")
        shape = SiteShape(
            pages=pages,
            news=news,
            always_500=always_500,
            charset_traps=traps,
            script_shells=shells,
            urls_per_sitemap=2_000,
            sitemap_delay_s=0.2,
            page_delay_s=0.01,
        )
        waves.append(
            Wave(
                index=index + 1,
                at_s=round(5 + index * (0.8 * window_s - 5) / max(1, count - 1), 1),
                sitemap_run=f"soak-{seed}-sitemap-{index + 1}",
                discover_run=f"soak-{seed}-discover-{index + 1}",
                shape=shape,
                graph_pages=per_wave - sitemap_urls,
            )
        )
    return waves


class Load:
    def __init__(self, waves: list[Wave], settings: Settings) -> None:
        self.waves = waves
        self.settings = settings
        self.sites: list[LocalSite] = []
        self.runs: list[Run] = []
        self._sitemaps: dict[int, FaultSite] = {}
        self._graphs: dict[int, GraphSite] = {}
        self.submitted: list[tuple[float, str]] = []

    def start_sites(self) -> None:
        for wave in self.waves:
            sitemap = FaultSite(wave.shape).start()
            graph = GraphSite(wave.graph_pages).start()
            self._sitemaps[wave.index], self._graphs[wave.index] = sitemap, graph
            self.sites += [sitemap, graph]
            self.runs.append(Run(wave.sitemap_run, tuple(sitemap.urls())))
            self.runs.append(Run(wave.discover_run, tuple(graph.url(f"/p/{n}") for n in range(graph.pages))))

    @property
    def urls(self) -> int:
        return sum(len(run.urls) for run in self.runs)

    def due(self, now_s: float) -> list[Wave]:
        done = {run for _t, run in self.submitted}
        return [w for w in self.waves if w.at_s <= now_s and w.sitemap_run not in done]

    def submit(self, wave: Wave, now_s: float) -> None:
        """Both runs of the wave, each retried until the broker takes it (it may be down)."""
        sitemap, graph = self._sitemaps[wave.index], self._graphs[wave.index]
        bodies: list[dict[str, Any]] = [
            {"run_id": wave.discover_run, "start_urls": [graph.url("/p/0")], "max_depth": 60, "max_pages": 0},
            {"run_id": wave.sitemap_run, "sitemaps": [sitemap.sitemap_index]},
        ]
        for body in bodies:
            while True:
                try:
                    submit(self.settings, body)
                    break
                except (PipelineError, OSError) as exc:
                    print(
                        f"soak: submitting {body['run_id']} failed ({exc}); again in {SUBMIT_RETRY_S} s",
                        flush=True,
                    )
                    time.sleep(SUBMIT_RETRY_S)
        self.submitted.append((now_s, wave.sitemap_run))

    def stop(self) -> None:
        for site in self.sites:
            site.stop()
