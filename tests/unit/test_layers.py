"""The project's packages import only downwards:

    ops                              operator commands: crawl, status, runs, export, run_report
     │
    producer  worker  dlq_consumer   the services (and, for ops.crawl --demo, demo_site)
     │                │
    shared            demo_site      the services' library; the bundled demo site

A service never imports ops or the demo site, and shared imports nothing of the project but
shared. The services sit on one level. Every import counts, those inside functions included.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SERVICES = frozenset({"producer", "worker", "dlq_consumer"})
# What each installed package may import of the project, itself included.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "shared": frozenset({"shared"}),
    "demo_site": frozenset({"demo_site", "shared"}),
    **{service: SERVICES | {"shared"} for service in SERVICES},
    "ops": SERVICES | {"shared", "demo_site", "ops"},
    # The renderer is a worker whose fetch is a browser: it builds on the worker's handling,
    # store, retries and dead letters, so it may import worker and shared (nothing imports it).
    "renderer": frozenset({"renderer", "worker", "shared"}),
}


def imported_packages(source: str) -> set[str]:
    """Top-level names of every absolute import in a module's source (relative ones stay inside
    their package)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def upward_imports(package: str, source: str) -> set[str]:
    """The project packages `source`, a module of `package`, imports but may not."""
    return (imported_packages(source) & MAY_IMPORT.keys()) - MAY_IMPORT[package]


def installed_packages() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in patterns}


def test_every_installed_package_has_a_layer() -> None:
    assert installed_packages() == MAY_IMPORT.keys()


def test_no_module_imports_up_the_layers() -> None:
    wrong = {
        str(path.relative_to(REPO)): sorted(upward)
        for package in MAY_IMPORT
        for path in sorted((REPO / package).rglob("*.py"))
        if (upward := upward_imports(package, path.read_text(encoding="utf-8")))
    }
    assert wrong == {}


@pytest.mark.parametrize(
    ("package", "source", "upward"),
    [
        ("shared", "from ops.status import gather", {"ops"}),
        ("shared", "def serve():\n    from demo_site.runner import serve_demo_site\n", {"demo_site"}),
        ("shared", "import worker.store", {"worker"}),
        ("worker", "from ops import management", {"ops"}),
        ("producer", "import demo_site", {"demo_site"}),
        ("demo_site", "from producer.sources import Source", {"producer"}),
        ("producer", "from worker.proxies import ProxyPool\nfrom shared import db", set()),
        ("ops", "from demo_site.runner import serve_demo_site\nimport worker.store", set()),
        ("shared", "import redis\nfrom . import errors", set()),
    ],
)
def test_upward_imports_are_found(package: str, source: str, upward: set[str]) -> None:
    assert upward_imports(package, source) == upward
