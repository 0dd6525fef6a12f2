"""A first look at markup, cheap enough for every page, that refuses a page which cannot fit its
ParseBudget before the parser spends time and memory on it.

Two things are measured, as the body arrives (worker/fetch/fetcher.py) or over text from the cache
(worker/parse/page.py):

  * `<` and `=` characters. Every element and comment starts at a `<`, and every attribute with
    a value has a `=`, so far more of them than allowed nodes means far more nodes. Real pages
    have about one per node (see docs/SECURITY.md); more than four per allowed node is refused.
  * the length of a tag, from its `<` to the next `>`. lxml hands a tag's attributes over as one
    dictionary, built before the tree builder can count them: a 5 MB tag of short attributes
    costs lxml about 150 MB. A tag longer than `max_tag_bytes` is refused, and with it a single
    attribute value that long (a data: URI of a large image). Attributes whose quoted values
    hide a `>` escape this measure, but each has a `=`, which the count above bounds.

Each piece costs two counts and a few searches, all in C.
"""

from __future__ import annotations

from typing import Any

from worker.parse.budget import ParseBudget, ParseLimitExceeded

_TEXT_SLICE_CHARS = 64 * 1024


class MarkupScan:
    def __init__(self, budget: ParseBudget) -> None:
        self._budget = budget
        self._max_marks = budget.max_marks
        self._max_tag_bytes = budget.max_tag_bytes
        self.marks = 0
        self._open = False  # whether the text seen so far ends inside a tag
        self._open_length = 0  # of that tag so far

    def feed(self, chunk: bytes) -> None:
        """The next piece of a body; raises ParseLimitExceeded when it cannot fit."""
        self._feed(chunk, b"<", b"=", b">")

    def scan_text(self, text: str) -> None:
        """A whole page's text, looked at in slices (a tag may span them)."""
        for start in range(0, len(text), _TEXT_SLICE_CHARS):
            self._feed(text[start : start + _TEXT_SLICE_CHARS], "<", "=", ">")

    def _feed(self, chunk: Any, lt: Any, eq: Any, gt: Any) -> None:
        self.marks += chunk.count(lt) + chunk.count(eq)
        if self.marks > self._max_marks:
            raise ParseLimitExceeded(
                f"over {self._max_marks} '<' and '=', for at most {self._budget.max_nodes} nodes"
            )
        if self._open:  # the tag open at the end of the last piece goes on to its '>'
            close = chunk.find(gt)
            self._open_length += len(chunk) if close < 0 else close
            if self._open_length > self._max_tag_bytes:
                raise ParseLimitExceeded(f"a tag longer than {self._max_tag_bytes} characters")
            if close < 0:
                return
        last_open = chunk.rfind(lt)
        self._open = last_open > chunk.rfind(gt)
        self._open_length = len(chunk) - last_open
        if self._open and self._open_length > self._max_tag_bytes:
            raise ParseLimitExceeded(f"a tag longer than {self._max_tag_bytes} characters")
