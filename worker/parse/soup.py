"""BeautifulSoup's tree for an HTML page, from lxml's parse, within a budget.

`new_soup(markup)` gives the BeautifulSoup(markup, "lxml") makes. It builds it with
worker/parse/bs4_fastpath.py, which sets each node's fields itself at a third of the cost, where
that module's check passes (the installed beautifulsoup4 is one it was checked on, and it builds
the same tree as bs4 on sample pages); otherwise with `BudgetedTreeBuilder`
(worker/parse/html_builder.py), bs4's own lxml builder through its public API, and a warning says
so once. `private_api=False` asks for the latter.

One builder, and with it one lxml parser, serves each thread (making the parser checks the
target's methods with `inspect`, a tenth of a page's parse).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from bs4 import BeautifulSoup

from worker.parse import bs4_fastpath
from worker.parse.budget import UNLIMITED, ParseBudget
from worker.parse.html_builder import BudgetedTreeBuilder

_builders = threading.local()


def new_soup(
    markup: str,
    *,
    multi_valued_attributes: bool = True,
    budget: ParseBudget = UNLIMITED,
    clock: Callable[[], float] = time.monotonic,
    private_api: bool = True,
) -> BeautifulSoup:
    """The BeautifulSoup of `markup`, as BeautifulSoup(markup, "lxml") makes it. Without
    multi-valued attributes, `class` and `rel` stay strings instead of lists of words. Past the
    `budget`, raises ParseLimitExceeded, with the part-built tree already taken apart.
    `private_api=False`: built through bs4's public API only (slower, the same tree)."""
    builder = _thread_builder(multi_valued_attributes, private_api)
    builder.set_budget(budget, clock)
    return BeautifulSoup(markup, builder=builder)


def _thread_builder(multi_valued_attributes: bool, private_api: bool) -> BudgetedTreeBuilder:
    key = (multi_valued_attributes, private_api)
    builders: dict[tuple[bool, bool], BudgetedTreeBuilder] = _builders.__dict__.setdefault("by_kind", {})
    builder = builders.get(key)
    if builder is None:
        kind = bs4_fastpath.HtmlTreeBuilder if private_api and bs4_fastpath.usable() else BudgetedTreeBuilder
        options = {} if multi_valued_attributes else {"multi_valued_attributes": None}
        builder = builders[key] = kind(**options)
    return builder
