"""What WARC costs (docs/WARC.md): CPU a page with WARC_DIR set against unset, on real pages
(bench/real_corpus.py) crawled by the pipeline as `make crawl` runs it; the bytes on disk a page
beside the body's size; and the writer library, measured on the same pages: our own writer
(worker/warc/records.py, with ISA-L's deflate and, beside it, zlib's), warcio's WARCWriter and
FastWARC's, each writing a page's response and request records with their digests, gzip per
record.

    python -m bench.warc_cost [--pages N] [--rounds R] [--writers-only]

The figure is the CPU time the processes spent (from wait4 as each is reaped), not wall clock,
so a machine busy with other work stretches the crawl but charges it little. Still, a loaded
machine runs the same work slower by turns, so the two sides run R rounds each, on and off in
turn (off-on, then on-off, so neither always goes first), and the ratio is taken within each
round, whose two runs saw the same minutes of the machine: the median of the rounds' ratios,
with their lowest and highest beside it. `make bench` runs it after bench.perf.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.measure import free_port_block
from bench.perf import REAL_CONCURRENCY, REAL_HOSTS, REAL_WORKERS, Result, perf_site, run_pipeline
from bench.real_corpus import CorpusUnavailable, ensure_corpus, page_paths
from worker.warc import records
from worker.warc.exchange import Exchange, new_record_id

CPU_GOAL = 1.10  # own CPU a page with WARC on, at most this times that with it off
WRITER_ROUNDS = 3
# Rounds of the pipeline, each one run with WARC off and one with it on: at 2 or 3 a run that
# met a busy minute moved the ratio by several points; the median of 5 holds still.
ROUNDS = 5


def corpus_pages(root: Path, pages: int) -> list[Exchange]:
    exchanges = []
    for n, path in enumerate(page_paths(root)[:pages]):
        body = (root / path.lstrip("/")).read_bytes()
        exchanges.append(
            Exchange(
                url=f"http://127.0.1.1/{path.lstrip('/')}",
                request_headers=(("Host", "127.0.1.1"), ("User-Agent", "bench"), ("Accept-Encoding", "gzip")),
                http_version="HTTP/1.1",
                status=200,
                reason="OK",
                headers=(("Content-Type", "text/html"), ("Content-Length", str(len(body))), ("X-N", str(n))),
                body=body,
                started_at=time.time(),
            )
        )
    return exchanges


def _our_records(exchange: Exchange) -> tuple[records.Pieces, records.Pieces]:
    date = "2026-01-01T00:00:00.000000Z"
    page = records.response(exchange, exchange.record_id, date, "<urn:uuid:x>")
    request = records.request(exchange, new_record_id(), date, "<urn:uuid:x>", exchange.record_id)
    return page, request


def write_ours(exchange: Exchange, out: io.BytesIO) -> None:
    page, request = _our_records(exchange)
    out.write(records.gzip_member(page) + records.gzip_member(request))


def _zlib_member(pieces: records.Pieces) -> bytes:
    compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    return b"".join([*(compressor.compress(piece) for piece in pieces), compressor.flush()])


def write_ours_zlib(exchange: Exchange, out: io.BytesIO) -> None:
    """The same records compressed by zlib's fastest level, as the writer first did."""
    page, request = _our_records(exchange)
    out.write(_zlib_member(page) + _zlib_member(request))


def write_warcio(exchange: Exchange, out: io.BytesIO) -> None:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    writer = WARCWriter(out, gzip=True, warc_version="1.1")
    http = StatusAndHeaders(
        f"{exchange.status} {exchange.reason}", list(exchange.headers), protocol="HTTP/1.1"
    )
    response = writer.create_warc_record(
        exchange.url, "response", payload=io.BytesIO(exchange.body), http_headers=http
    )
    sent = StatusAndHeaders("GET / HTTP/1.1", list(exchange.request_headers), is_http_request=True)
    request = writer.create_warc_record(exchange.url, "request", payload=io.BytesIO(b""), http_headers=sent)
    writer.write_request_response_pair(request, response)


def write_fastwarc(exchange: Exchange, out: io.BytesIO) -> None:
    from fastwarc.stream_io import GzipWriter
    from fastwarc.warc import WarcRecord, WarcRecordType

    for kind, msgtype, block in (
        (WarcRecordType.response, "response", records.response_head(exchange) + exchange.body),
        (WarcRecordType.request, "request", records.request_block(exchange)),
    ):
        gzip = GzipWriter(out, compression_level=1)
        record = WarcRecord()
        record.init_headers(kind)
        record.headers["WARC-Target-URI"] = exchange.url
        record.headers["Content-Type"] = f"application/http; msgtype={msgtype}"
        record.set_bytes_content(block)
        record.write(gzip, checksum_data=True)
        gzip.finish()


WRITERS: dict[str, Callable[[Exchange, io.BytesIO], None]] = {
    "ours (worker/warc/records.py)": write_ours,
    "ours, with zlib level 1": write_ours_zlib,
    "warcio WARCWriter": write_warcio,
    "FastWARC": write_fastwarc,
}


def writers(exchanges: list[Exchange]) -> list[str]:
    """Each writer's CPU a page and bytes a page, the best of WRITER_ROUNDS rounds in turn."""
    best: dict[str, float] = {}
    size: dict[str, int] = {}
    for _ in range(WRITER_ROUNDS):
        for name, write in WRITERS.items():
            out = io.BytesIO()
            started = time.process_time()
            for exchange in exchanges:
                write(exchange, out)
            spent = time.process_time() - started
            best[name] = min(best.get(name, spent), spent)
            size[name] = out.tell()
    bodies = statistics.mean(len(e.body) for e in exchanges)
    lines = [
        f"writers, {len(exchanges)} real pages (mean body {bodies / 1024:.1f} KB), best of {WRITER_ROUNDS}:"
    ]
    for name in WRITERS:
        per_page_ms = best[name] / len(exchanges) * 1000
        lines.append(
            f"  {name:32s} {per_page_ms:6.2f} ms CPU a page, "
            f"{size[name] / len(exchanges) / 1024:6.1f} KB a page"
        )
    return lines


@dataclass(frozen=True)
class Spread:
    """The median of a figure over the rounds, with the lowest and highest beside it."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        return cls(statistics.median(values), min(values), max(values))

    def format(self, spec: str) -> str:
        return f"{self.median:{spec}} ({self.low:{spec}}-{self.high:{spec}})"


def in_turn(rounds: int, sides: dict[str, Callable[[], Result]]) -> dict[str, list[Result]]:
    """Each side once a round, the order reversed every other round (A B, B A, A B, ...), so
    that neither side always runs first, after a quiet spell or a busy one."""
    runs: dict[str, list[Result]] = {name: [] for name in sides}
    names = list(sides)
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else reversed(names):
            runs[name].append(sides[name]())
    return runs


def per_page_ms(results: list[Result], cpu: Callable[[Result], float]) -> list[float]:
    return [1000 * cpu(result) / result.pages for result in results]


def ratios(on: list[float], off: list[float]) -> list[float]:
    """Each round's on against the same round's off: two runs that saw the same minutes."""
    return [a / b for a, b in zip(on, off, strict=True)]


def pipeline(root: Path, pages: int, rounds: int, log_dir: Path) -> list[str]:
    per_host = max(1, pages // REAL_HOSTS)
    warc_dir = Path(tempfile.mkdtemp(prefix="warc-", dir=log_dir))
    port = free_port_block(1)
    sizes: list[int] = []

    def with_warc() -> Result:
        for leftover in warc_dir.iterdir():
            leftover.unlink()
        result = run_pipeline(
            index, REAL_WORKERS, REAL_CONCURRENCY, log_dir, site=site, extra_env={"WARC_DIR": str(warc_dir)}
        )
        sizes.append(sum(p.stat().st_size for p in warc_dir.iterdir()))
        return result

    with perf_site(REAL_HOSTS, per_host, 100, log_dir, root=root, port=port) as site:
        index = [f"--sitemap=http://127.0.1.1:{port}/sitemap_index.xml"]
        off = lambda: run_pipeline(index, REAL_WORKERS, REAL_CONCURRENCY, log_dir, site=site)  # noqa: E731
        runs = in_turn(rounds, {"off": off, "on": with_warc})
    served = page_paths(root)[:per_host]
    body = statistics.mean((root / p.lstrip("/")).stat().st_size for p in served)
    workers = {side: per_page_ms(runs[side], lambda r: r.worker_cpu_s) for side in runs}
    own = {side: per_page_ms(runs[side], lambda r: r.own_cpu_s) for side in runs}
    worker_ratio = Spread.of(ratios(workers["on"], workers["off"]))
    own_ratio = Spread.of(ratios(own["on"], own["off"]))
    added = Spread.of([a - b for a, b in zip(workers["on"], workers["off"], strict=True)])
    stored = [r.pages for side in runs for r in runs[side]]
    on_disk = sum(sizes) / sum(r.pages for r in runs["on"])
    verdict = "met" if worker_ratio.median <= CPU_GOAL else "NOT MET"
    pairs = zip(runs["off"], runs["on"], strict=True)
    each = ", ".join(f"{a.pages_per_s:.0f}/{b.pages_per_s:.0f}" for a, b in pairs)
    return [
        f"pipeline, {min(stored)}-{max(stored)} real pages a run on {REAL_HOSTS} hosts, a pool of "
        f"{REAL_WORKERS} workers x {REAL_CONCURRENCY}, {rounds} rounds of WARC off and on in turn; "
        "CPU time from wait4, median (lowest-highest) over the rounds:",
        f"  workers' CPU a page:  off {Spread.of(workers['off']).format('.2f')} ms, "
        f"on {Spread.of(workers['on']).format('.2f')} ms",
        f"  own CPU a page (workers, producer, dead-letter consumer):  off "
        f"{Spread.of(own['off']).format('.2f')} ms, on {Spread.of(own['on']).format('.2f')} ms",
        f"  on/off within each round:  workers {worker_ratio.format('.3f')} (goal <= {CPU_GOAL}: "
        f"{verdict}), own {own_ratio.format('.3f')}; WARC adds {added.format('+.2f')} ms of the "
        "workers' CPU a page",
        f"  pages/s off/on, each round (wall clock, for the machine's load): {each}",
        "  each round, workers' CPU a page off/on: "
        + ", ".join(f"{b:.2f}/{a:.2f}" for a, b in zip(workers["on"], workers["off"], strict=True)),
        f"  on disk a page: {on_disk / 1024:.1f} KB of WARC (gzip per record, request and response) "
        f"beside a body of {body / 1024:.1f} KB",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warc_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500, help="real pages a crawl (default 500)")
    parser.add_argument(
        "--rounds", type=int, default=ROUNDS, help=f"runs of each side, in turn (default {ROUNDS})"
    )
    parser.add_argument("--writers-only", action="store_true", help="measure the writer libraries alone")
    args = parser.parse_args(argv)
    try:
        root = ensure_corpus()
    except CorpusUnavailable as exc:
        print(f"warc cost: skipped, {exc}")
        return 0
    lines = writers(corpus_pages(root, args.pages))
    if not args.writers_only:
        with tempfile.TemporaryDirectory(prefix="bench-warc-") as log_dir:
            lines += pipeline(root, args.pages, args.rounds, Path(log_dir))
    print("\n".join(lines))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
