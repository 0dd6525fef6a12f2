"""What WARC costs (docs/WARC.md): own CPU a page with WARC_DIR set against unset, on real pages
(bench/real_corpus.py) crawled by the pipeline as `make crawl` runs it; the bytes on disk a page
beside the body's size; and the writer library, measured on the same pages: our own writer
(worker/warc/records.py), warcio's WARCWriter and FastWARC's, each writing a page's response and
request records with their digests, gzip per record.

    python -m bench.warc_cost [--pages N] [--rounds R] [--writers-only]

The pipeline's two sides run in turn, R rounds, and the figures are the totals, since the
machine's speed drifts between minutes. `make bench` runs it after bench.perf.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.measure import free_port_block
from bench.perf import REAL_CONCURRENCY, REAL_HOSTS, REAL_WORKERS, Result, alternate, perf_site, run_pipeline
from bench.real_corpus import CorpusUnavailable, ensure_corpus, page_paths
from worker.warc import records
from worker.warc.exchange import Exchange, new_record_id

CPU_GOAL = 1.10  # own CPU a page with WARC on, at most this times that with it off
WRITER_ROUNDS = 3


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


def write_ours(exchange: Exchange, out: io.BytesIO) -> None:
    page = records.response(exchange, exchange.record_id, "2026-01-01T00:00:00.000000Z", "<urn:uuid:x>")
    request = records.request(
        exchange, new_record_id(), "2026-01-01T00:00:00.000000Z", "<urn:uuid:x>", exchange.record_id
    )
    out.write(records.gzip_member(page) + records.gzip_member(request))


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
        totals, each = alternate(rounds, {"off": off, "on": with_warc})
    served = page_paths(root)[:per_host]
    body = statistics.mean((root / p.lstrip("/")).stat().st_size for p in served)
    cpu_off = totals["off"].own_cpu_s / totals["off"].pages * 1000
    cpu_on = totals["on"].own_cpu_s / totals["on"].pages * 1000
    ratio = cpu_on / cpu_off
    on_disk = sum(sizes) / totals["on"].pages
    verdict = "met" if ratio <= CPU_GOAL else "NOT MET"
    return [
        f"pipeline, {totals['on'].pages // rounds} real pages a run on {REAL_HOSTS} hosts, "
        f"a pool of {REAL_WORKERS} workers x {REAL_CONCURRENCY}, {rounds} rounds (pages/s off/on: {each}):",
        f"  own CPU a page: WARC off {cpu_off:.2f} ms, on {cpu_on:.2f} ms, ratio {ratio:.3f} "
        f"(goal <= {CPU_GOAL}: {verdict})",
        f"  on disk a page: {on_disk / 1024:.1f} KB of WARC (gzip per record, request and response) "
        f"beside a body of {body / 1024:.1f} KB",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.warc_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=500, help="real pages a crawl (default 500)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side, in turn (default 2)")
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
