"""A CDXJ index of a run's WARC records, for replay tools (pywb reads it as a collection's index).

One line a record: the URL's SURT key, the 14-digit timestamp, and a JSON object with the url,
mime, status, digest, length, offset and filename. The lines are sorted, as a tool that
searches the index by binary search needs. A revisit's line is there with the response record
it refers to, which may be in another run's files: the replay tool serves that one's body.

The key is the SURT form the Internet Archive's tools make, which pywb computes for a lookup:
scheme, user info and fragment dropped, lowercased, a leading `www.` dropped, the host's labels
reversed and joined by commas, a port kept unless the scheme's own, the query's parts sorted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from urllib.parse import urlsplit

from ops.warc_read import RecordHead

_WWW = re.compile(r"^www\d*\.")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def surt(url: str) -> str:
    parts = urlsplit(url.strip())
    host = _WWW.sub("", (parts.hostname or "").lower().strip("."))
    key = ",".join(reversed(host.split(".")))
    if parts.port is not None and parts.port != _DEFAULT_PORTS.get(parts.scheme.lower()):
        key += f":{parts.port}"
    query = "&".join(sorted(p for p in parts.query.split("&") if p))
    return (key + ")" + (parts.path or "/") + (f"?{query}" if query else "")).lower()


def timestamp14(warc_date: str) -> str:
    return re.sub(r"\D", "", warc_date)[:14]


def line(head: RecordHead) -> str:
    fields = {
        "url": head.target_uri,
        "mime": head.mime,
        "status": head.status,
        "digest": head.payload_digest.removeprefix("sha1:"),
        "length": str(head.length),
        "offset": str(head.offset),
        "filename": head.filename,
    }
    return f"{surt(head.target_uri)} {timestamp14(head.date)} {json.dumps(fields)}"


def index_lines(pages: Iterable[RecordHead], originals: dict[str, RecordHead]) -> Iterator[str]:
    """The sorted lines of the pages' records and of the responses their revisits refer to."""
    chosen: dict[tuple[str, int], RecordHead] = {}
    for head in pages:
        chosen[(head.filename, head.offset)] = head
        if head.kind == "revisit" and head.refers_to in originals:
            original = originals[head.refers_to]
            chosen[(original.filename, original.offset)] = original
    yield from sorted(line(head) for head in chosen.values())
