"""The message a worker sends the frontier for the pages it stored in a discovery run: each page's
follow-able links, all at the same depth (the page's + 1).

A page's links are one object, never one message a link. A worker joins the objects of the
pages that its consumer loop settles together (the rows of one commit, mostly) into one message,
`{"pages": [...]}`, up to MAX_LINKS_MESSAGE_BYTES (join_pages); a lone page goes as its own
object, as every page did before pages were joined, and the frontier takes either. The frontier
claims a message's links in one Redis call and acks it once all of them are on their way
(producer/frontier.py). Bounded where it is decoded, as tasks are (shared/message_bounds.py):
the frontier drops a body out of bounds, with a log line (it is no URL of the run yet;
producer/frontier_service.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shared.errors import DecodeError, InvalidMessage
from shared.message_bounds import MAX_TASK_DEPTH as MAX_DEPTH
from shared.message_bounds import RUN_ID_PATTERN
from shared.urls import MAX_URL_CHARS

MAX_LINKS_A_PAGE = 1_000  # as many as the parser keeps of a page (worker.parse.MAX_LINKS)
MAX_LINKS_MESSAGE_BYTES = (MAX_LINKS_A_PAGE + 1) * (MAX_URL_CHARS + 8) + 1024
# A joined message's pages: a bound on the frontier's work for one ack, and on what a crash
# before it hands the next frontier to do again.
MAX_PAGES_A_MESSAGE = 200
_JOINED_HEAD, _JOINED_TAIL = b'{"pages":[', b"]}"


@dataclass(frozen=True)
class PageLinks:
    run_id: str
    depth: int  # of the links: the page's depth + 1
    page: str  # the page's URL, for the log and as the links' source
    links: tuple[str, ...]

    def encode(self) -> bytes:
        return json.dumps(
            {"run_id": self.run_id, "depth": self.depth, "page": self.page, "links": self.links},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: object) -> PageLinks:
        if not isinstance(data, dict):
            raise DecodeError("a page is not a JSON object")
        return cls(_run_id(data), _depth(data), _url(data.get("page"), "page"), _links(data))


def join_pages(bodies: Sequence[bytes]) -> bytes:
    """One message of pages each encoded by PageLinks.encode, without decoding them again."""
    return _JOINED_HEAD + b",".join(bodies) + _JOINED_TAIL


def decode_pages(body: bytes) -> list[PageLinks]:
    """The pages of a links message: a joined one (join_pages) or a lone page's object."""
    if len(body) > MAX_LINKS_MESSAGE_BYTES:
        raise InvalidMessage(f"links message of {len(body)} bytes, over {MAX_LINKS_MESSAGE_BYTES}")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise DecodeError(f"body is not JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise DecodeError("body is not a JSON object")
    if "pages" not in data:
        return [PageLinks.decode(data)]
    pages = data["pages"]
    if type(pages) is not list or not 0 < len(pages) <= MAX_PAGES_A_MESSAGE:
        raise InvalidMessage(f"field 'pages': expected a list of 1 to {MAX_PAGES_A_MESSAGE} pages")
    return [PageLinks.decode(page) for page in pages]


def _run_id(data: dict[str, Any]) -> str:
    run_id = data.get("run_id")
    if type(run_id) is not str or not RUN_ID_PATTERN.fullmatch(run_id):
        raise InvalidMessage("field 'run_id': not a run id")
    return run_id


def _depth(data: dict[str, Any]) -> int:
    depth = data.get("depth")
    if type(depth) is not int or not 0 < depth <= MAX_DEPTH:
        raise InvalidMessage(f"field 'depth': expected 1 to {MAX_DEPTH}")
    return depth


def _url(value: object, name: str) -> str:
    if type(value) is not str or not 0 < len(value) <= MAX_URL_CHARS:
        raise InvalidMessage(f"field {name!r}: expected 1 to {MAX_URL_CHARS} characters")
    return value


def _links(data: dict[str, Any]) -> tuple[str, ...]:
    links = data.get("links")
    if type(links) is not list or len(links) > MAX_LINKS_A_PAGE:
        raise InvalidMessage(f"field 'links': expected a list of up to {MAX_LINKS_A_PAGE} URLs")
    return tuple(_url(link, "links") for link in links)
