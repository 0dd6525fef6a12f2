"""What one page may cost the parser: `ParseBudget` (nodes, nesting depth, time, a tag's length),
and the error a page past it raises.

Apart from what applies it, the first look at the markup (worker/parse/markup_scan.py) and the
tree builders (worker/parse/html_builder.py, worker/parse/bs4_fastpath.py), so that each of them
depends on this and none on another.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from shared.errors import PipelineError


class ParseLimitExceeded(PipelineError):
    """A page went past its ParseBudget; the message says which limit."""


@dataclass(frozen=True)
class ParseBudget:
    """What one page may cost the parser (PARSE_MAX_NODES, PARSE_MAX_DEPTH, PARSE_DEADLINE_S)."""

    max_nodes: int = 75_000  # elements + attributes + strings + comments
    max_depth: int = 512  # open elements at once, as browsers cap nesting
    deadline_s: float = 5.0
    max_tag_bytes: int = 1024 * 1024  # from a '<' to its '>' (worker/parse/markup_scan.py)

    @property
    def max_marks(self) -> int:
        """The most '<' and '=' a page within the budget is let have (worker/parse/markup_scan.py)."""
        return 4 * self.max_nodes


UNLIMITED = ParseBudget(sys.maxsize, sys.maxsize, float("inf"), sys.maxsize)
