"""Reading the workers' WARC files back with warcio (ops/warc.py): each file whole, each record's
digests, and the record a page row points at.

warcio is the reader here on purpose: it shares no code with the writer (worker/warc/), so a
file it reads cleanly is one any WARC tool can read.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from warcio.archiveiterator import ArchiveIterator
from warcio.exceptions import ArchiveLoadFailed

from worker.warc.files import EXTENSION, OPEN_SUFFIX, whole_length

PAGE_TYPES = ("response", "revisit", "resource")  # the records a page row may point at


@dataclass(frozen=True)
class RecordHead:
    """What an index and a check need of one record, read where it lies."""

    filename: str
    offset: int
    length: int
    kind: str
    record_id: str
    target_uri: str
    date: str
    payload_digest: str
    refers_to: str
    mime: str
    status: str


def closed_files(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(EXTENSION))


def open_files(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(EXTENSION + OPEN_SUFFIX))


def path_of(directory: str, filename: str) -> str | None:
    """A row names a file by its closed name; while it is being written it has `.open` after it."""
    for candidate in (filename, filename + OPEN_SUFFIX):
        path = os.path.join(directory, os.path.basename(candidate))
        if os.path.exists(path):
            return path
    return None


def _read_all(stream: Any) -> None:
    while stream.read(1 << 20):
        pass


def _head(filename: str, offset: int, length: int, record: Any) -> RecordHead:
    headers = record.rec_headers
    http = record.http_headers
    mime = "warc/revisit" if record.rec_type == "revisit" else ""
    status = "-"
    if record.rec_type == "resource":
        mime = (headers.get_header("Content-Type") or "").split(";")[0].strip() or "unk"
        status = "200"
    elif http is not None and record.rec_type in PAGE_TYPES:
        status = http.get_statuscode() or "-"
        if not mime:
            mime = (http.get_header("Content-Type") or "").split(";")[0].strip() or "unk"
    return RecordHead(
        filename=filename,
        offset=offset,
        length=length,
        kind=record.rec_type,
        record_id=headers.get_header("WARC-Record-ID") or "",
        target_uri=headers.get_header("WARC-Target-URI") or "",
        date=headers.get_header("WARC-Date") or "",
        payload_digest=headers.get_header("WARC-Payload-Digest") or "",
        refers_to=headers.get_header("WARC-Refers-To") or "",
        mime=mime,
        status=str(status),
    )


def file_problems(path: str) -> Iterator[str]:
    """Everything wrong with one file: not whole, not readable, a digest that does not match."""
    name = os.path.basename(path)
    size = os.path.getsize(path)
    with open(path, "rb") as file:
        whole = whole_length(file)
    if whole != size:
        yield f"{name}: only the first {whole} of {size} bytes are whole records"
    try:
        with open(path, "rb") as file:
            iterator = ArchiveIterator(file, check_digests=True)
            for record in iterator:
                _read_all(record.content_stream())
                if record.digest_checker.passed is False:
                    for problem in record.digest_checker.problems:
                        yield f"{name} at {iterator.get_record_offset()}: {problem}"
    except ArchiveLoadFailed as exc:
        yield f"{name}: warcio cannot read it: {str(exc).strip()}"


def heads(directory: str, filename: str) -> Iterator[RecordHead]:
    """Every record of one file, with its offset and length."""
    path = os.path.join(directory, filename)
    with open(path, "rb") as file:
        iterator = ArchiveIterator(file)
        for record in iterator:
            _read_all(record.content_stream())
            offset = iterator.get_record_offset()
            yield _head(filename, offset, iterator.get_record_length(), record)


def record_at(directory: str, filename: str, offset: int, length: int) -> tuple[RecordHead | None, str]:
    """The one record at exactly these bytes, or None and why not."""
    path = path_of(directory, filename)
    if path is None:
        return None, f"no file {filename} in {directory}"
    with open(path, "rb") as file:
        file.seek(offset)
        data = file.read(length)
    if len(data) != length:
        return None, f"{filename} ends before {offset}+{length}"
    try:
        found = []
        for record in ArchiveIterator(io.BytesIO(data), check_digests=True):
            _read_all(record.content_stream())
            if record.digest_checker.passed is False:
                return None, f"{filename} at {offset}: " + "; ".join(record.digest_checker.problems)
            found.append(_head(filename, offset, length, record))
    except ArchiveLoadFailed as exc:
        return None, f"{filename} at {offset}: not a record ({str(exc).strip()})"
    if len(found) != 1 or found[0].kind not in PAGE_TYPES:
        return None, f"{filename} at {offset}+{length}: not one response, revisit or resource record"
    return found[0], ""
