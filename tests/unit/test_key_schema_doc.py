"""docs/OPERATING.md's key table lists every kind of key shared/redis/keys.py builds."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from shared.redis.keys import Keys

DOC = Path(__file__).resolve().parents[2] / "docs" / "OPERATING.md"


def test_every_key_kind_has_a_row_in_the_table() -> None:
    section = DOC.read_text(encoding="utf-8").split("## Inspecting with redis-cli", 1)[1].split("\n## ", 1)[0]
    rows = set(re.findall(r"^\| `<p>:([a-z-]+)[:`]", section, re.MULTILINE))
    keys = Keys("P")
    kinds = set()
    for name, method in inspect.getmembers(keys, inspect.ismethod):
        if name.startswith("_") or name.endswith("pattern"):
            continue
        arguments = ["x"] * (len(inspect.signature(method).parameters))
        kinds.add(method(*arguments).split(":")[1])
    assert kinds and kinds <= rows, f"not in the table: {kinds - rows}"
