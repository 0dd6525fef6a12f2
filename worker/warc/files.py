"""The WARC files of one worker process: named as Heritrix names them, `.open` while written,
rotated by size, closed on a clean stop, and repaired when a killed writer left one open.

A name is `<prefix>-<17-digit UTC timestamp>-<serial>-<worker id>.warc.gz`: the namespace, when
the file was opened, a counter of this process's files, and the worker (its host and pid). The
file being written is that name with `.open` after it, and holds an exclusive flock(2) for as
long as its writer lives; the kernel lets the lock go when the process dies, however it dies.
So the next worker to start in the folder knows a `.open` file it can lock has no writer: it
cuts it after its last whole record (a record cut short by a kill is never kept) and takes the
`.open` off. A file without `.open` is always whole.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import re
import time
import zlib
from collections.abc import Callable, Iterator
from typing import BinaryIO

from shared.errors import PipelineError
from worker.warc import records
from worker.warc.exchange import new_record_id, warc_date

log = logging.getLogger(__name__)

OPEN_SUFFIX = ".open"
EXTENSION = ".warc.gz"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_READ_BYTES = 1 << 20
_GZIP_WBITS = 16 + zlib.MAX_WBITS
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)

Write = Callable[[int, memoryview], int]  # os.write's shape: the seam a test fills a disk through


class DiskFull(PipelineError):
    """A write found no room; nothing of the record stays in the file."""

    def __init__(self, directory: str, strerror: str) -> None:
        self.strerror = strerror
        super().__init__(f"{directory}: {strerror}")


def file_name(prefix: str, opened_at: float, serial: int, worker_id: str) -> str:
    stamp = time.strftime("%Y%m%d%H%M%S", time.gmtime(opened_at)) + f"{int(opened_at * 1000) % 1000:03d}"
    return f"{_UNSAFE.sub('_', prefix)}-{stamp}-{serial:05d}-{_UNSAFE.sub('_', worker_id)}{EXTENSION}"


def _sync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class OpenFile:
    """One file being written: appends whole records, knows its size."""

    def __init__(self, directory: str, name: str, write: Write = os.write) -> None:
        self.directory = directory
        self._write = write
        self.name = name
        self.path = os.path.join(directory, name)
        self.fd = os.open(self.path + OPEN_SUFFIX, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self.size = 0
        self.synced_size = 0  # what the last fsync made durable (Archive.sync)
        self.records = 0

    def append(self, data: bytes) -> int:
        """Write `data` at the end; return its offset. On a full disk the part written is cut off
        again and DiskFull raised, so the file still ends with a whole record."""
        offset = self.size
        view = memoryview(data)
        try:
            while view:
                written = self._write(self.fd, view)
                view = view[written:]
        except OSError as exc:
            os.ftruncate(self.fd, offset)
            os.lseek(self.fd, offset, os.SEEK_SET)
            if exc.errno in DISK_FULL:
                raise DiskFull(self.directory, exc.strerror or str(exc)) from None
            raise
        self.size += len(data)
        self.records += 1
        return offset

    def close(self) -> None:
        """Durable, then renamed to its final name; the lock goes with the descriptor."""
        try:
            os.fsync(self.fd)
            os.rename(self.path + OPEN_SUFFIX, self.path)
            _sync_directory(self.directory)
        finally:
            os.close(self.fd)


class FileSeries:
    """The files of one writer, one open at a time. Not thread-safe: the archive holds a lock."""

    def __init__(
        self,
        directory: str,
        prefix: str,
        worker_id: str,
        max_bytes: int,
        info: records.Fields,
        clock: Callable[[], float] = time.time,
        write: Write = os.write,
    ) -> None:
        self.directory = directory
        self._write = write
        self._prefix = prefix
        self._worker_id = worker_id
        self._max_bytes = max_bytes
        self._info = info
        self._clock = clock
        self._serial = 0
        self.current: OpenFile | None = None
        self.warcinfo_id = ""

    def ready(self) -> str:
        """Open a file if none is: return the warcinfo id its records name."""
        if self.current is None:
            self._open()
        return self.warcinfo_id

    def would_overflow(self, size: int) -> bool:
        """Whether `size` more bytes would take the current file, which holds a record besides
        its warcinfo, past the size limit."""
        current = self.current
        return current is not None and current.records > 1 and current.size + size > self._max_bytes

    def append(self, data: bytes) -> tuple[str, int]:
        """Append whole records' gzip members to the current file (opened by `ready`); return the
        file's final name and the offset."""
        current = self.current or self._open()
        return current.name, current.append(data)

    def rotate(self) -> None:
        if self.current is not None:
            current, self.current = self.current, None
            current.close()
            log.info("closed WARC file %s (%d bytes)", current.name, current.size)

    def _open(self) -> OpenFile:
        while True:
            opened_at = self._clock()
            name = file_name(self._prefix, opened_at, self._serial, self._worker_id)
            self._serial += 1
            try:
                opened = OpenFile(self.directory, name, self._write)
                break
            except FileExistsError:  # the same worker id in the same millisecond: next serial
                continue
            except OSError as exc:
                if exc.errno in DISK_FULL:  # no inode, or no block for the directory entry
                    raise DiskFull(self.directory, exc.strerror or str(exc)) from None
                raise
        self.warcinfo_id = new_record_id()
        info = records.warcinfo(self.warcinfo_id, warc_date(opened_at), name, self._info)
        try:
            opened.append(records.gzip_member(info))
        except (OSError, DiskFull):
            opened.close()
            with contextlib.suppress(OSError):
                os.unlink(opened.path)
            raise
        self.current = opened
        return opened


def whole_length(file: BinaryIO) -> int:
    """How many leading bytes of `file` are whole gzip members, each holding one whole record."""
    good = position = 0
    inflater = zlib.decompressobj(_GZIP_WBITS)
    member = bytearray()
    while chunk := file.read(_READ_BYTES):
        data = chunk
        while data:
            try:
                member += inflater.decompress(data)
            except zlib.error:
                return good
            if not inflater.eof:
                position += len(data)
                break
            position += len(data) - len(inflater.unused_data)
            if not is_whole_record(bytes(member)):
                return good
            good = position
            data = inflater.unused_data
            inflater = zlib.decompressobj(_GZIP_WBITS)
            member = bytearray()
    return good


def is_whole_record(record: bytes) -> bool:
    """A WARC record whose block is as long as its Content-Length says, ended by two CRLFs."""
    if not record.startswith(b"WARC/"):
        return False
    head_end = record.find(b"\r\n\r\n")
    if head_end < 0:
        return False
    match = re.search(rb"\r\nContent-Length:\s*(\d+)\r\n", record[: head_end + 2], re.IGNORECASE)
    if match is None:
        return False
    return len(record) == head_end + 4 + int(match.group(1)) + 4 and record.endswith(b"\r\n\r\n")


def open_files(directory: str) -> Iterator[str]:
    for name in sorted(os.listdir(directory)):
        if name.endswith(EXTENSION + OPEN_SUFFIX):
            yield name


def repair_orphans(directory: str) -> list[str]:
    """Close every `.open` file in `directory` whose writer is gone: cut after its last whole
    record and renamed; one with no whole record is removed. Returns the names repaired."""
    repaired = []
    for name in open_files(directory):
        path = os.path.join(directory, name)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:  # another worker repaired it meanwhile
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its writer is alive
                continue
            if not os.path.exists(path):  # repaired between our open and our lock
                continue
            with os.fdopen(os.dup(fd), "rb") as reader:
                keep = whole_length(reader)
            size = os.fstat(fd).st_size
            final = path[: -len(OPEN_SUFFIX)]
            if keep == 0:
                os.unlink(path)
            else:
                os.ftruncate(fd, keep)
                os.fsync(fd)
                os.rename(path, final)
            _sync_directory(directory)
            log.warning(
                "repaired WARC file %s left open by a writer that died: kept %d of %d bytes",
                os.path.basename(final),
                keep,
                size,
            )
            repaired.append(os.path.basename(final))
        finally:
            os.close(fd)
    return repaired
