"""What the site remembers while it runs: request counts per page, whether broken pages are fixed,
and the request log. Handler threads share one `SiteState`, so every change holds its lock."""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import TextIO


@dataclass(frozen=True)
class RequestRecord:
    t: float  # seconds since the epoch, when the answer was decided
    host: str  # host:port as the site names it in URLs
    method: str
    path: str
    status: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))


class SiteState:
    def __init__(self, log_file: TextIO | None = None) -> None:
        self._lock = threading.Lock()
        self._hits: Counter[tuple[str, str]] = Counter()
        self._fixed = False
        self._records: list[RequestRecord] = []
        self._log_file = log_file

    def count_hit(self, host: str, path: str) -> int:
        """Count one more request for this page and return how many there have been."""
        with self._lock:
            self._hits[(host, path)] += 1
            return self._hits[(host, path)]

    @property
    def fixed(self) -> bool:
        with self._lock:
            return self._fixed

    def fix(self) -> None:
        with self._lock:
            self._fixed = True

    def reset(self) -> None:
        """Forget request counts and the fix; the request log is history and stays."""
        with self._lock:
            self._hits.clear()
            self._fixed = False

    def record(self, record: RequestRecord) -> None:
        with self._lock:
            self._records.append(record)
            if self._log_file is not None:
                # One flushed line per request: a test or a person tailing the file sees it at once.
                self._log_file.write(record.to_json() + "\n")
                self._log_file.flush()

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)
