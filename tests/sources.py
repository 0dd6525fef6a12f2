"""The project's own source, for the tests that read it: every module of the packages named,
subpackages included, so that a module moved or added inside one is read too."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parsed_modules(*packages: str) -> Iterator[tuple[Path, ast.Module]]:
    """Each module of `packages` (folders of the repository, e.g. "worker", "shared/http"), parsed."""
    for package in packages:
        for path in sorted((REPO / package).rglob("*.py")):
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def calls(*packages: str) -> Iterator[ast.Call]:
    """Every call written in the modules of `packages`."""
    for _path, tree in parsed_modules(*packages):
        yield from (node for node in ast.walk(tree) if isinstance(node, ast.Call))
