"""WARC_DIR set: a crawl's files read back with warcio, which shares no code with the writer;
a second crawl's 304s and a third's fresh cache hits as revisits; `ops.warc check` and `cdxj`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from ops.crawl import run_crawl
from shared.postgres import db
from shared.settings import Settings
from tests.e2e.conftest import service_env
from tests.warc_site import WarcSite
from worker.warc.exchange import sha1_digest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PAGE_ROWS = "SELECT url, warc_filename, warc_offset, warc_length FROM pages WHERE run_id = %s ORDER BY url"


def crawl(settings: Settings, site: WarcSite, run_id: str, logs: Path, warc_dir: Path, **env: str) -> None:
    out = io.StringIO()
    code = run_crawl(
        settings,
        ["--sitemap", site.url("/sitemap.xml")],
        2,
        run_id,
        service_env(settings, WARC_DIR=str(warc_dir), **env),
        logs,
        240,
        out,
    )
    assert code == 0, out.getvalue()


def page_rows(settings: Settings, run_id: str) -> list[tuple[str, str, int, int]]:
    with db.connect(settings, autocommit=True) as conn:
        return [(str(u), str(f), int(o), int(n)) for u, f, o, n in conn.execute(PAGE_ROWS, (run_id,))]  # type: ignore[call-overload]


@dataclass(frozen=True)
class Seen:
    """One record as warcio read it."""

    type: str
    length: int
    headers: dict[str, str]
    raw: bytes  # the payload as sent (after the HTTP headers)
    digest_ok: bool | None


def every_record(warc_dir: Path) -> dict[tuple[str, int], Seen]:
    """Each record of every file, by (file, offset)."""
    found: dict[tuple[str, int], Seen] = {}
    for path in sorted(warc_dir.iterdir()):
        with open(path, "rb") as file:
            iterator = ArchiveIterator(file, check_digests=True)
            for record in iterator:
                raw = bytes(record.raw_stream.read())
                offset = iterator.get_record_offset()
                found[(path.name, offset)] = Seen(
                    record.rec_type,
                    iterator.get_record_length(),
                    dict(record.rec_headers.headers),
                    raw,
                    record.digest_checker.passed,
                )
    return found


def decoded_content(path: Path, offset: int) -> bytes:
    with open(path, "rb") as file:
        file.seek(offset)
        record = next(iter(ArchiveIterator(file)))
        return bytes(record.content_stream().read())


def test_a_warc_crawl_leaves_one_record_a_page_that_warcio_reads_and_rows_point_at(
    settings: Settings, tmp_path: Path
) -> None:
    warc_dir = tmp_path / "warc"
    warc_dir.mkdir()
    with WarcSite() as site:
        served = site.served()
        crawl(settings, site, "warc-1", tmp_path / "logs1", warc_dir)
        first = page_rows(settings, "warc-1")
        records = every_record(warc_dir)
        names = os.listdir(warc_dir)
        assert names and not [n for n in names if n.endswith(".open")]  # a clean stop closes them

        # Every file whole and every digest right, by warcio's own reading.
        assert all(r.digest_ok is not False for r in records.values())
        responses = {k: r for k, r in records.items() if r.type == "response"}
        assert len(responses) == len(served)  # one response record for every stored page
        assert {url for url, *_ in first} == set(served)
        for url, filename, offset, length in first:
            record = records[(filename, offset)]  # the row's offset lands on its record
            assert record.type == "response" and record.length == length
            assert record.headers["WARC-Target-URI"] == url
            assert record.headers["WARC-Payload-Digest"] == sha1_digest(record.raw)
            assert decoded_content(warc_dir / filename, offset) == served[url]  # the body the site sent
        # gzip pages are kept as sent: their payload is the compressed bytes.
        gz = [r for r in responses.values() if r.raw[:2] == b"\x1f\x8b"]
        assert len(gz) == len(served) // 3

        # A second crawl: each page answers 304 to its ETag, and leaves a revisit naming the first.
        crawl(settings, site, "warc-2", tmp_path / "logs2", warc_dir)
        # A third with fresh cache entries: no request at all, a revisit of identical payload.
        crawl(settings, site, "warc-3", tmp_path / "logs3", warc_dir, CACHE_FRESH_S="3600")

    records = every_record(warc_dir)
    responses_by_id = {r.headers["WARC-Record-ID"]: r for r in records.values() if r.type == "response"}
    refetched = 0
    for run_id, profile in (("warc-2", "server-not-modified"), ("warc-3", "identical-payload-digest")):
        rows = page_rows(settings, run_id)
        assert len(rows) == len(served)
        kinds = []
        for url, filename, offset, _length in rows:
            record = records[(filename, offset)]
            assert record.headers["WARC-Target-URI"] == url
            kinds.append(record.type)
            if record.type == "revisit":
                assert record.headers["WARC-Profile"].endswith(profile), (run_id, record.headers)
                original = responses_by_id[record.headers["WARC-Refers-To"]]
                assert original.headers["WARC-Target-URI"] == url
                assert record.headers["WARC-Payload-Digest"] == original.headers["WARC-Payload-Digest"]
            else:  # a cache entry not written before its worker stopped: fetched again
                assert record.type == "response"
                refetched += 1
        # The cache's writes ride with a worker's next command: a page or two may miss it.
        assert kinds.count("revisit") >= len(served) - 2, (run_id, kinds)
    assert sum(1 for r in records.values() if r.type == "response") == len(served) + refetched

    env = service_env(settings)
    check = subprocess.run(
        [sys.executable, "-m", "ops.warc", "check", str(warc_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"{len(served) * 3} rows, 0 problems" in check.stderr
    index = subprocess.run(
        [sys.executable, "-m", "ops.warc", "cdxj", str(warc_dir), "--run", "warc-2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert index.returncode == 0, index.stderr
    lines = index.stdout.splitlines()
    assert lines == sorted(lines) and len(lines) == 2 * len(served)  # each revisit and its original
    assert sum('"mime": "warc/revisit"' in line for line in lines) == len(served)


def test_ops_warc_check_names_a_cut_file_and_a_row_whose_record_is_gone(
    settings: Settings, tmp_path: Path
) -> None:
    warc_dir = tmp_path / "warc"
    warc_dir.mkdir()
    with WarcSite(pages=3) as site:
        crawl(settings, site, "warc-cut", tmp_path / "logs", warc_dir)
    url, filename, offset, length = page_rows(settings, "warc-cut")[0]
    path = warc_dir / filename
    path.write_bytes(path.read_bytes()[: offset + length - 10])  # into the row's own record
    check = subprocess.run(
        [sys.executable, "-m", "ops.warc", "check", str(warc_dir), "--run", "warc-cut"],
        env=service_env(settings),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert check.returncode == 1
    assert f"{filename}: only the first {offset} of" in check.stdout
    assert f"row {url}: {filename} ends before {offset}+{length}" in check.stdout
