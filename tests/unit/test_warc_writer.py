"""The WARC writer (worker/warc/) read back with warcio, which shares none of its code: records,
digests, offsets, rotation, `.open`, the repair of a file a killed writer left, a full disk."""

from __future__ import annotations

import gzip
import io
import os
import threading
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator

from shared.errors import ConfigError, ServiceUnavailable
from worker.fetch.response import Response
from worker.warc.archive import Archive, check_directory
from worker.warc.content_coding import BodyDecoder
from worker.warc.exchange import Exchange, archived_as, sha1_digest
from worker.warc.files import EXTENSION, OPEN_SUFFIX, FileSeries, OpenFile, repair_orphans, whole_length

pytestmark = pytest.mark.unit

HTML = b"<html><head><title>t</title></head><body>" + b"word " * 300 + b"</body></html>"


def exchange(
    url: str = "http://site.test/a", body: bytes = HTML, status: int = 200, **kw: object
) -> Exchange:
    headers = (("Content-Type", "text/html"), ("Transfer-Encoding", "chunked"), ("Set-Cookie", "a=1"))
    return Exchange(
        url=url,
        request_headers=(("Host", "site.test"), ("User-Agent", "ua")),
        http_version="HTTP/1.1",
        status=status,
        reason="OK" if status == 200 else "Not Modified",
        headers=(*headers, ("Set-Cookie", "b=2")),
        body=body,
        started_at=1_700_000_000.25,
        **kw,  # type: ignore[arg-type]
    )


def fetched(ex: Exchange, body: bytes = HTML) -> Response:
    return Response(ex.url, ex.status, "text/html", body, exchange=ex)


def archive_in(folder: Path, max_bytes: int = 10_000_000) -> Archive:
    series = FileSeries(str(folder), "crawl", "host-1-0", max_bytes, [("software", "test")])
    return Archive(series)


def records_of(path: Path) -> list[tuple[int, str, dict[str, str], bytes]]:
    """(offset, type, WARC headers, content as a replay would serve it) of every record."""
    found = []
    with open(path, "rb") as file:
        iterator = ArchiveIterator(file)
        for record in iterator:
            headers = dict(record.rec_headers.headers)
            content = record.content_stream().read()
            found.append((iterator.get_record_offset(), record.rec_type, headers, content))
    return found


def test_a_page_leaves_warcinfo_response_and_request_that_warcio_reads(tmp_path: Path) -> None:
    archive = archive_in(tmp_path)
    ex = exchange()
    at = archive.record(fetched(ex))
    archive.close()
    (path,) = tmp_path.glob("*" + EXTENSION)
    assert path.name == at.filename and at.filename.startswith("crawl-2") and "-00000-host-1-0" in at.filename
    found = records_of(path)
    assert [kind for _, kind, _, _ in found] == ["warcinfo", "response", "request"]
    offset, _, headers, content = found[1]
    assert offset == at.offset and headers["WARC-Record-ID"] == ex.record_id == at.record_id
    assert content == HTML and headers["WARC-Payload-Digest"] == sha1_digest(HTML)
    assert found[2][2]["WARC-Concurrent-To"] == ex.record_id
    assert headers["WARC-Warcinfo-ID"] == found[0][2]["WARC-Record-ID"] == found[2][2]["WARC-Warcinfo-ID"]
    # The offset and length are one gzip member holding just that record.
    data = path.read_bytes()[at.offset : at.offset + at.length]
    assert gzip.decompress(data).startswith(b"WARC/1.1\r\nWARC-Type: response")


def test_the_headers_are_kept_as_received_without_the_chunked_framing(tmp_path: Path) -> None:
    archive = archive_in(tmp_path)
    archive.record(fetched(exchange()))
    archive.close()
    (path,) = tmp_path.glob("*" + EXTENSION)
    with open(path, "rb") as file:
        response = next(r for r in ArchiveIterator(file) if r.rec_type == "response")
        assert [v for k, v in response.http_headers.headers if k == "Set-Cookie"] == ["a=1", "b=2"]
        assert response.http_headers.get_header("Transfer-Encoding") is None


def test_a_gzip_body_is_stored_as_sent_and_its_digest_is_of_those_bytes(tmp_path: Path) -> None:
    raw = gzip.compress(HTML)
    ex = exchange(body=raw)
    ex = Exchange(**{**ex.__dict__, "headers": (("Content-Encoding", "gzip"), ("Content-Type", "text/html"))})
    archive = archive_in(tmp_path)
    archive.record(fetched(ex, HTML))
    archive.close()
    (path,) = tmp_path.glob("*" + EXTENSION)
    response = records_of(path)[1]
    assert response[2]["WARC-Payload-Digest"] == sha1_digest(raw)
    assert response[3] == HTML  # warcio undoes the Content-Encoding once, as a replay does


def test_a_304_and_a_fresh_cached_body_leave_revisits_naming_the_first_record(tmp_path: Path) -> None:
    first = exchange()
    archive = archive_in(tmp_path)
    archive.record(fetched(first))
    original = archived_as(first)
    not_modified = exchange(status=304, body=b"")
    revalidated = Response(first.url, 200, "text/html", HTML, from_cache=True, not_modified=True,
                           exchange=not_modified, archived=original)  # fmt: skip
    at_304 = archive.record(revalidated)
    at_fresh = archive.record(Response(first.url, 200, "text/html", HTML, from_cache=True, archived=original))
    archive.close()
    (path,) = tmp_path.glob("*" + EXTENSION)
    by_offset = {offset: headers for offset, _, headers, _ in records_of(path)}
    for at, profile in ((at_304, "server-not-modified"), (at_fresh, "identical-payload-digest")):
        headers = by_offset[at.offset]
        assert headers["WARC-Type"] == "revisit" and headers["WARC-Profile"].endswith(profile)
        assert headers["WARC-Refers-To"] == first.record_id
        assert headers["WARC-Payload-Digest"] == sha1_digest(HTML)
    assert by_offset[at_304.offset + at_304.length]["WARC-Type"] == "request"  # the 304's request


def test_files_rotate_past_the_limit_and_each_closed_one_is_whole(tmp_path: Path) -> None:
    archive = archive_in(tmp_path, max_bytes=500)
    places = [archive.record(fetched(exchange(f"http://site.test/{i}"))) for i in range(5)]
    assert len(list(tmp_path.glob("*" + OPEN_SUFFIX))) == 1
    archive.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert len(names) == 5 and not any(n.endswith(OPEN_SUFFIX) for n in names)
    assert [n.split("-")[2] for n in names] == ["00000", "00001", "00002", "00003", "00004"]
    for at in places:
        path = tmp_path / at.filename
        (_, kind, info, _), *rest = records_of(path)
        assert kind == "warcinfo"
        # Each page's records were built naming the file open before, which then rotated: they
        # were built again, and name the warcinfo of the file they are in.
        assert {headers["WARC-Warcinfo-ID"] for _, _, headers, _ in rest} == {info["WARC-Record-ID"]}
        with open(path, "rb") as file:
            assert whole_length(file) == path.stat().st_size


def test_a_file_left_open_by_a_killed_writer_is_cut_after_its_last_whole_record(tmp_path: Path) -> None:
    archive = archive_in(tmp_path)
    at = archive.record(fetched(exchange()))
    current = archive._series.current
    assert current is not None
    os.write(current.fd, gzip.compress(b"WARC/1.1\r\nWARC-Type: response\r\n")[:-7])  # killed mid-record
    assert repair_orphans(str(tmp_path)) == []  # its writer is alive: left alone
    os.close(current.fd)  # the writer dies: its lock goes with it
    assert repair_orphans(str(tmp_path)) == [at.filename]
    path = tmp_path / at.filename
    assert [kind for _, kind, _, _ in records_of(path)] == ["warcinfo", "response", "request"]
    with open(path, "rb") as file:
        assert whole_length(file) == path.stat().st_size


def test_an_open_file_with_nothing_whole_is_removed(tmp_path: Path) -> None:
    opened = OpenFile(str(tmp_path), "crawl-x" + EXTENSION)
    os.write(opened.fd, b"\x1f\x8b\x08")
    os.close(opened.fd)
    repair_orphans(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_waits_without_leaving_part_of_a_record(tmp_path: Path) -> None:
    full = [False]

    def write(fd: int, data: memoryview) -> int:
        if full[0]:
            os.write(fd, bytes(data)[:100])  # part of it went in before the disk filled
            raise OSError(28, "No space left on device")
        return os.write(fd, data)

    problems: list[str | None] = []

    def pause(seconds: float) -> bool:
        problems.append(archive.problem)
        full[0] = len(problems) < 2  # room again after the second pause
        return False

    series = FileSeries(str(tmp_path), "crawl", "host-1-0", 10**7, [("software", "test")], write=write)
    archive = Archive(series, pause=pause)
    archive.record(fetched(exchange()))
    current = archive._series.current
    assert current is not None
    size_before = current.size
    full[0] = True
    at = archive.record(fetched(exchange("http://site.test/b")))
    assert len(problems) == 2 and "is full" in str(problems[0]) and archive.problem is None
    assert at.offset == size_before
    archive.close()
    kinds = [kind for _, kind, _, _ in records_of(tmp_path / at.filename)]
    assert kinds == ["warcinfo", "response", "request", "response", "request"]


def test_a_full_disk_at_a_stop_gives_the_message_back(tmp_path: Path) -> None:
    def write(fd: int, data: memoryview) -> int:
        raise OSError(28, "No space left on device")

    series = FileSeries(str(tmp_path), "crawl", "host-1-0", 10**7, [("software", "test")], write=write)
    archive = Archive(series, pause=lambda _s: True)  # the worker stops while it waits
    with pytest.raises(ServiceUnavailable, match="WARC_DIR"):
        archive.record(fetched(exchange()))
    assert list(tmp_path.iterdir()) == []  # the file that got no warcinfo is gone


def test_records_from_many_threads_each_land_where_they_say(tmp_path: Path) -> None:
    archive = archive_in(tmp_path, max_bytes=5_000)
    places = []
    lock = threading.Lock()

    def write(i: int) -> None:
        at = archive.record(fetched(exchange(f"http://site.test/{i}")))
        with lock:
            places.append((i, at))

    threads = [threading.Thread(target=write, args=(i,)) for i in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    archive.close()
    assert len(list(tmp_path.iterdir())) >= 3  # it rotated while threads had records built
    for i, at in places:
        with open(tmp_path / at.filename, "rb") as file:
            file.seek(at.offset)
            record = next(iter(ArchiveIterator(io.BytesIO(file.read(at.length)))))
            assert record.rec_headers.get_header("WARC-Target-URI") == f"http://site.test/{i}"
    # Records are built before the lock, naming the file open then: one that landed in a file
    # opened meanwhile was built again, so every record names its own file's warcinfo.
    for path in tmp_path.iterdir():
        (_, kind, info, _), *rest = records_of(path)
        assert kind == "warcinfo" and rest
        assert {headers["WARC-Warcinfo-ID"] for _, _, headers, _ in rest} == {info["WARC-Record-ID"]}


def test_a_sync_fsyncs_only_what_came_since_the_last(tmp_path: Path) -> None:
    synced: list[int] = []
    series = FileSeries(str(tmp_path), "crawl", "host-1-0", 10**7, [("software", "test")])
    archive = Archive(series, fsync=synced.append)
    archive.sync()  # no file yet
    archive.record(fetched(exchange()))
    archive.sync()
    archive.sync()  # a batch of rows with no new record: nothing to make durable
    assert len(synced) == 1
    archive.record(fetched(exchange("http://site.test/b")))
    archive.sync()
    assert len(synced) == 2
    archive.close()


def test_warc_dir_mistakes_are_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"WARC_DIR: .*missing.* is not a folder"):
        check_directory(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"WARC_DIR: .* is full"):
        check_directory(str(tmp_path), needed_bytes=1 << 62)
    if os.geteuid() != 0:  # root writes anywhere
        os.chmod(tmp_path, 0o500)
        with pytest.raises(ConfigError, match="WARC_DIR: cannot write in"):
            check_directory(str(tmp_path))


def test_the_body_decoder_undoes_gzip_and_deflate_and_caps_a_bomb() -> None:
    import zlib

    assert BodyDecoder("gzip", "u").decode(gzip.compress(HTML), 10**6) == HTML
    assert BodyDecoder("deflate", "u").decode(zlib.compress(HTML), 10**6) == HTML
    raw_deflate = zlib.compressobj(wbits=-15)
    assert BodyDecoder("deflate", "u").decode(raw_deflate.compress(HTML) + raw_deflate.flush(), 10**6) == HTML
    assert BodyDecoder("br", "u").decode(b"\x01\x02", 10) == b"\x01\x02"  # left as it came
    assert len(BodyDecoder("gzip", "u").decode(gzip.compress(b"\0" * 10**7), 1000)) == 1001


def test_a_page_rendered_by_a_browser_is_a_resource_record_of_its_dom(tmp_path: Path) -> None:
    archive = archive_in(tmp_path)
    at = archive.record(Response("http://site.test/app", 200, "text/html; charset=utf-8", HTML))
    archive.close()
    found = {
        offset: (kind, headers, content)
        for offset, kind, headers, content in records_of(tmp_path / at.filename)
    }
    kind, headers, content = found[at.offset]
    assert kind == "resource" and content == HTML and headers["WARC-Payload-Digest"] == sha1_digest(HTML)
    assert headers["Content-Type"] == "text/html; charset=utf-8"


def test_a_write_error_other_than_a_full_disk_gives_the_message_back_not_to_the_dead(tmp_path: Path) -> None:
    failing = [False]

    def write(fd: int, data: memoryview) -> int:
        if failing[0]:
            raise OSError(5, "Input/output error")
        return os.write(fd, data)

    series = FileSeries(str(tmp_path), "crawl", "host-1-0", 10**7, [("software", "test")], write=write)
    archive = Archive(series)
    at = archive.record(fetched(exchange()))
    failing[0] = True
    with pytest.raises(ServiceUnavailable, match="Input/output error"):
        archive.record(fetched(exchange("http://site.test/b")))
    failing[0] = False
    archive.close()
    path = tmp_path / at.filename
    with open(path, "rb") as file:
        assert whole_length(file) == path.stat().st_size
