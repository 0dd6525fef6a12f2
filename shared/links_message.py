"""The message a worker sends the frontier for a page it stored in a discovery run: the page's
follow-able links, all at the same depth (the page's + 1), as one message.

One message a page, not one a link: a page's links are claimed in one Redis call and the
message is acked once all of them are on their way (producer/frontier.py). Bounded where it is
decoded, as tasks are (shared/message_bounds.py): the frontier drops a body out of bounds, with
a log line (it is no URL of the run yet; producer/frontier_service.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.errors import DecodeError, InvalidMessage
from shared.message_bounds import MAX_TASK_DEPTH as MAX_DEPTH
from shared.message_bounds import RUN_ID_PATTERN
from shared.urls import MAX_URL_CHARS

MAX_LINKS_A_PAGE = 1_000  # as many as the parser keeps of a page (worker.parse.MAX_LINKS)
MAX_LINKS_MESSAGE_BYTES = (MAX_LINKS_A_PAGE + 1) * (MAX_URL_CHARS + 8) + 1024


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
    def decode(cls, body: bytes) -> PageLinks:
        if len(body) > MAX_LINKS_MESSAGE_BYTES:
            raise InvalidMessage(f"links message of {len(body)} bytes, over {MAX_LINKS_MESSAGE_BYTES}")
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
            raise DecodeError(f"body is not JSON ({exc.__class__.__name__})") from None
        if not isinstance(data, dict):
            raise DecodeError("body is not a JSON object")
        return cls(_run_id(data), _depth(data), _url(data.get("page"), "page"), _links(data))


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
