"""What the handler holds when WARC_DIR is set: `Archive.record(response) -> WarcLocation`.

A page's records are written, and handed to the operating system, before its row is handed to
the store; the store's writer calls `sync()` before it commits a batch, so a row commits only
once its record is on disk, at the cost of one fsync a batch rather than one a record. A
redelivered URL is fetched and recorded again, and its row, rewritten, names the later record:
the earlier one stays in its file, named by no row (docs/WARC.md).

Which records a page leaves:
* fetched: `request` and `response` (WARC-Concurrent-To ties them);
* a 304 to our conditional request: `request` and a `revisit` (server-not-modified), whose
  WARC-Refers-To names the response record the cached body came from, when the cache knows it;
* a cached body used without asking the server: a `revisit` (identical-payload-digest);
* a page the renderer built in a browser (no exchange of ours gave it as it is): a `resource`
  holding the DOM it parsed.
The row points at the response, revisit or resource record.

A full disk does not lose a page: the record is cut off again, the thread waits for room (its
message stays unacked) and tries again; `problem` says why meanwhile, for `status`. An fsync
that fails means the kernel may have dropped what it held: no row may commit after it, so the
worker ends at once (`on_lost_writes`), its messages go back to the queue, and the next start
repairs the file.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from shared.errors import ConfigError, ServiceUnavailable
from shared.settings import Settings
from worker.warc import records
from worker.warc.exchange import ArchivedAs, Exchange, WarcLocation, new_record_id, sha1_digest, warc_date
from worker.warc.files import DiskFull, FileSeries, repair_orphans

log = logging.getLogger(__name__)

FULL_PAUSE_S = (0.5, 10.0)  # first and longest pause between tries on a full disk
MIN_FREE_BYTES = 16 * 1024 * 1024  # below this at start, WARC_DIR counts as full
SOFTWARE = "crawl-pipeline/0.1"


class Response(Protocol):
    """What a page's records are made of: worker.fetch.response.Response has these."""

    @property
    def final_url(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def content_type(self) -> str | None: ...
    @property
    def from_cache(self) -> bool: ...
    @property
    def not_modified(self) -> bool: ...
    @property
    def exchange(self) -> Exchange | None: ...
    @property
    def archived(self) -> ArchivedAs | None: ...


@dataclass(frozen=True)
class _Members:
    """A page's records as gzip members, built naming the warcinfo of one file."""

    warcinfo_id: str
    page: bytes  # the record the row points at
    both: bytes  # it, and the request record after it when there is one: one write


def _exit_now() -> None:
    os._exit(75)  # EX_TEMPFAIL; the pool forks the worker again


def check_directory(path: str, needed_bytes: int = MIN_FREE_BYTES) -> None:
    """WARC_DIR must be a folder we can write files in, with room: else a one-line ConfigError."""
    if not os.path.isdir(path):
        raise ConfigError(f"WARC_DIR: {path!r} is not a folder")
    probe = os.path.join(path, f".write-check-{os.getpid()}")
    try:
        with open(probe, "wb") as file:
            file.write(b"x")
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"WARC_DIR: cannot write in {path!r} ({exc.strerror or exc})") from None
    free = shutil.disk_usage(path).free
    if free < needed_bytes:
        raise ConfigError(f"WARC_DIR: {path!r} is full ({free} bytes free, {needed_bytes} needed)")


class Archive:
    def __init__(
        self,
        series: FileSeries,
        clock: Callable[[], float] = time.time,
        on_lost_writes: Callable[[], None] = _exit_now,
        pause: Callable[[float], bool] | None = None,
        fsync: Callable[[int], None] = os.fsync,
    ) -> None:
        self._series = series
        self._fsync = fsync
        self._clock = clock
        self._on_lost_writes = on_lost_writes
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        # Waits out a pause on a full disk; True when the worker stops meanwhile.
        self._pause = pause or self._stopping.wait
        self.problem: str | None = None  # why writes wait, for status
        self._pause_s = FULL_PAUSE_S[0]

    @classmethod
    def from_settings(cls, settings: Settings) -> Archive | None:
        """The worker's archive, or None when WARC_DIR is not set. Checks the folder and repairs
        the files that killed writers left open."""
        if not settings.warc_dir:
            return None
        directory = os.path.abspath(settings.warc_dir)
        check_directory(directory, max(MIN_FREE_BYTES, 2 * settings.max_body_bytes))
        repair_orphans(directory)
        info = [
            ("software", SOFTWARE),
            ("format", "WARC File Format 1.1"),
            ("conformsTo", "https://iipc.github.io/warc-specifications/specifications/warc-format/warc-1.1/"),
            ("hostname", socket.gethostname()),
            ("operator-worker", settings.worker_id),
            ("robots", "obey" if settings.respect_robots else "ignore"),
            ("http-header-user-agent", settings.user_agent),
        ]
        series = FileSeries(
            directory, settings.crawl_namespace, settings.worker_id, settings.warc_max_bytes, info
        )
        return cls(series)

    @property
    def directory(self) -> str:
        return self._series.directory

    def record(self, response: Response) -> WarcLocation:
        """Write the page's records; return where its response or revisit record is."""
        exchange = response.exchange
        date = warc_date(exchange.started_at if exchange is not None else self._clock())
        # A fetched page's response record has the id its cache entry already names.
        fetched = exchange is not None and not response.not_modified
        page_id = exchange.record_id if fetched and exchange is not None else new_record_id()
        # Digests and compression, nearly all of the writer's CPU, are done before the lock is
        # taken, so no thread waits on another's; they name the current file's warcinfo, and
        # `_write` builds them again in the rare case that a file was opened meanwhile.
        built = self._members(response, page_id, date, self._series.warcinfo_id)
        with self._lock:  # one writer at a time; each record names its own file's warcinfo
            while True:
                try:
                    return self._write(response, page_id, date, built)
                except DiskFull as full:
                    self._wait_for_room(full)
                except OSError as exc:  # not the page's fault: it goes back to its queue, not to the dead
                    raise ServiceUnavailable("WARC_DIR", self.directory, exc.strerror or str(exc)) from None

    def _write(self, response: Response, page_id: str, date: str, built: _Members) -> WarcLocation:
        # The page's record and its request go in one write: in one file, together or not at all.
        warcinfo_id = self._series.ready()
        if self._series.would_overflow(len(built.both)):
            self._rotate()
            warcinfo_id = self._series.ready()
        if built.warcinfo_id != warcinfo_id:
            built = self._members(response, page_id, date, warcinfo_id)
        name, offset = self._series.append(built.both)
        if self.problem is not None:
            log.warning("WARC writes go on in %s: there is room again", self.directory)
            self.problem = None
            self._pause_s = FULL_PAUSE_S[0]
        return WarcLocation(name, offset, len(built.page), page_id)

    def _members(self, response: Response, page_id: str, date: str, warcinfo_id: str) -> _Members:
        """The page's record, and it with its request record after it, as gzip members."""
        page = records.gzip_member(self._page_record(response, page_id, date, warcinfo_id))
        if response.exchange is None:
            return _Members(warcinfo_id, page, page)
        request = records.request(response.exchange, new_record_id(), date, warcinfo_id, page_id)
        return _Members(warcinfo_id, page, page + records.gzip_member(request))

    def _page_record(self, response: Response, page_id: str, date: str, warcinfo_id: str) -> records.Pieces:
        exchange = response.exchange
        if exchange is not None and not response.not_modified:
            return records.response(exchange, page_id, date, warcinfo_id)
        if exchange is None and not response.from_cache:  # rendered by a browser: its DOM
            content_type = response.content_type or "text/html"
            return records.resource(
                response.final_url, page_id, date, warcinfo_id, content_type, response.body
            )
        known = response.archived
        digest = known.payload_digest if known is not None else None
        if digest is None and not response.not_modified:
            digest = sha1_digest(response.body)  # cached before WARC was on: the body as kept
        return records.revisit(response.final_url, page_id, date, warcinfo_id, known, digest, exchange)

    def _wait_for_room(self, full: DiskFull) -> None:
        """Called holding the lock: every writer waits, which is what a full disk asks."""
        if self.problem is None:
            log.error(
                "WARC writes wait: %s is full; the pages stay unacked until there is room", self.directory
            )
        self.problem = f"WARC_DIR {self.directory} is full ({full.strerror})"
        if self._pause(self._pause_s):
            raise ServiceUnavailable("WARC_DIR", self.directory, "disk full") from None
        self._pause_s = min(self._pause_s * 2, FULL_PAUSE_S[1])

    def sync(self) -> None:
        """Make every record written so far durable (the store calls it before each commit)."""
        with self._lock:
            current = self._series.current
            if current is None or current.synced_size == current.size:
                return  # nothing written since the last sync: no fsync to pay for
            fd, size = os.dup(current.fd), current.size
        try:
            self._fsync(fd)
            with self._lock:
                current.synced_size = max(current.synced_size, size)
        except OSError as exc:
            log.critical("WARC fsync failed in %s (%s): stopping this worker now", self.directory, exc)
            if exc.errno != errno.EBADF:
                self._on_lost_writes()
            raise ServiceUnavailable("WARC_DIR", self.directory, f"fsync failed: {exc.strerror}") from None
        finally:
            os.close(fd)

    def _rotate(self) -> None:
        """Close the full file. Its fsync failing is a sync failing: rows may wait on its records."""
        try:
            self._series.rotate()
        except OSError as exc:
            log.critical(
                "closing a WARC file in %s failed (%s): stopping this worker now", self.directory, exc
            )
            self._on_lost_writes()
            raise ServiceUnavailable("WARC_DIR", self.directory, f"close failed: {exc.strerror}") from None

    def close(self) -> None:
        """Close the file being written (a clean stop): it loses its `.open`. Every row is stored
        by now; a file that cannot be closed stays `.open`, for the next start to repair."""
        self._stopping.set()
        with self._lock:
            try:
                self._series.rotate()
            except OSError as exc:
                log.error(
                    "could not close the WARC file in %s (%s): the next start repairs it", self.directory, exc
                )
