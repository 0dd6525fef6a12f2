"""What each folder of the project may import, in one table (MAY_IMPORT), and tests that fail on
every import the table does not allow:

    ops                                          operator commands, above everything
     │
    producer   worker ◀── renderer   dlq_consumer   the services (the renderer builds on the worker)
     │           │                                  worker/: politeness, fetch, parse, store, handling
    shared/amqp  consumer  redis  postgres  http    the services' library, by what it talks to
     │
    shared                                       plain modules: settings, errors, messages, metrics...
    demo_site                                    the bundled demo site, on shared

A module's folder is the deepest folder of the table that holds it, and so is an imported
module's. An import is allowed within a folder, or to a folder its row names. Every import
counts, those inside functions and under TYPE_CHECKING included. On top of the table:

- a service never imports another service, whatever the table says, unless BUILT_ON names the
  pair (the renderer is a worker whose fetch is a browser);
- no module imports itself round a circle, however long.

To extend it:
- a new package or subpackage: add a row naming what it may import (a test fails until there
  is one, and one fails for a row whose folder is gone); a new top-level package goes into
  pyproject.toml's packages too;
- a new service: add it to SERVICES as well. If it builds on another service's parts, name
  the pair in BUILT_ON and list those folders in its row; if it only shares a piece with
  another service, move that piece to shared/ instead (as proxies and TryLater went there).
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = frozenset(
    {"shared", "shared.amqp", "shared.consumer", "shared.redis", "shared.postgres", "shared.http"}
)
WORKER_PARTS = frozenset(
    {"worker.politeness", "worker.fetch", "worker.parse", "worker.store", "worker.handling", "worker.warc"}
)
SERVICES = frozenset({"producer", "worker", "dlq_consumer", "renderer"})
# A service built on another's parts: the one it may import.
BUILT_ON: dict[str, str] = {"renderer": "worker"}

# What each folder may import of the project, besides itself.
MAY_IMPORT: dict[str, frozenset[str]] = {
    # shared's plain modules reach down only where the settings check a value with the parser
    # of its own format (a Redis Cluster URL, FETCH_ALLOWLIST).
    "shared": frozenset({"shared.redis", "shared.http"}),
    "shared.redis": frozenset({"shared"}),
    "shared.postgres": frozenset({"shared"}),
    "shared.http": frozenset({"shared", "shared.redis"}),  # benched proxies are kept in Redis
    "shared.amqp": frozenset({"shared", "shared.redis"}),  # a paused run's hold exchange (runstate)
    "shared.consumer": frozenset({"shared", "shared.amqp"}),
    "demo_site": frozenset({"shared"}),
    "producer": SHARED,
    "dlq_consumer": SHARED,
    # The worker's entry points, handler and wiring compose its parts.
    "worker": SHARED | WORKER_PARTS,
    "worker.parse": frozenset({"shared"}),
    "worker.warc": frozenset({"shared"}),  # the records of what worker.fetch fetched
    "worker.fetch": frozenset({"shared", "shared.http", "shared.redis", "worker.parse", "worker.warc"}),
    "worker.politeness": frozenset({"shared", "shared.http", "shared.redis", "worker.fetch"}),
    "worker.store": frozenset({"shared", "shared.postgres"}),
    "worker.handling": frozenset(
        {"shared", "shared.amqp", "shared.consumer", "shared.redis"} | WORKER_PARTS - {"worker.handling"}
    ),
    "renderer": SHARED | {"worker", "worker.fetch", "worker.politeness", "worker.store"},
    "ops": SHARED | SERVICES | WORKER_PARTS | {"demo_site"},
    # The web dashboard: built on the operator commands' readers and the dead-letter store; no
    # other part of the project imports it (nor starlette, jinja2 or uvicorn).
    "ops.dashboard": SHARED | {"ops", "dlq_consumer"},
}


def folders(table: Mapping[str, object] = MAY_IMPORT) -> frozenset[str]:
    return frozenset(table)


def folder_of(module: str, table: Mapping[str, object] = MAY_IMPORT) -> str | None:
    """The deepest folder of the table that holds `module`; None for a module not ours."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        if (candidate := ".".join(parts[:end])) in table:
            return candidate
    return None


def imported_modules(source: str, module: str, is_package: bool = False) -> set[str]:
    """Every module `source` (the source of `module`) imports, as dotted names: `from a import b`
    gives a.b, which folder_of places in b's folder when b is a submodule and in a's otherwise.
    Relative imports are resolved against `module`'s package."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def leaks(module: str, source: str, is_package: bool = False) -> set[str]:
    """The imports of `module` that the table, or the rule on services, does not allow."""
    own = folder_of(module)
    assert own is not None, f"{module} is in no folder of the table"
    service = module.split(".")[0]
    wrong = set()
    for imported in imported_modules(source, module, is_package):
        target = folder_of(imported)
        if target is None or target == own:
            continue
        target_service = target.split(".")[0]
        crosses_services = (
            service in SERVICES
            and target_service in SERVICES
            and target_service not in {service, BUILT_ON.get(service)}
        )
        if crosses_services or target not in MAY_IMPORT[own]:
            wrong.add(imported)
    return wrong


def project_modules() -> Iterator[tuple[str, Path]]:
    """Every module of the installed packages, by dotted name (a package by its own name)."""
    for top in installed_packages():
        for path in sorted((REPO / top).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def installed_packages() -> set[str]:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*") for pattern in patterns}


def package_folders() -> set[str]:
    return {
        ".".join(init.parent.relative_to(REPO).parts)
        for top in installed_packages()
        for init in (REPO / top).rglob("__init__.py")
    }


def test_every_folder_has_a_row_and_every_row_a_folder() -> None:
    assert package_folders() == folders()


def test_the_table_names_only_folders_and_lets_no_service_import_another() -> None:
    for folder, allowed in MAY_IMPORT.items():
        assert allowed <= folders(), f"{folder} names a folder that is not in the table"
        service = folder.split(".")[0]
        if service in SERVICES:
            others = {f for f in allowed if f.split(".")[0] in SERVICES - {service, BUILT_ON.get(service)}}
            assert others == set(), f"{folder} may import another service"


def test_no_module_imports_what_its_folder_may_not() -> None:
    wrong = {
        str(path.relative_to(REPO)): sorted(found)
        for module, path in project_modules()
        if (found := leaks(module, path.read_text(encoding="utf-8"), path.name == "__init__.py"))
    }
    assert wrong == {}


def reachable(graph: Mapping[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph.get(start, ()))
    while todo:
        if (node := todo.pop()) not in seen:
            seen.add(node)
            todo.extend(graph.get(node, ()))
    return seen


def circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The groups of two or more modules that each reach the others through their imports."""
    reach = {node: reachable(graph, node) for node in graph}
    groups = {
        frozenset({node} | {other for other in reach[node] if node in reach[other]})
        for node in graph
        if node in reach[node]
    }
    return sorted(sorted(group) for group in groups if len(group) > 1)


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (`from a import b`: a.b when that is a module,
    else a)."""
    sources = {module: path for module, path in project_modules()}
    graph: dict[str, set[str]] = {}
    for module, path in sources.items():
        named = imported_modules(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        targets = {name if name in sources else name.rpartition(".")[0] for name in named}
        graph[module] = {target for target in targets if target in sources and target != module}
    return graph


def test_no_module_imports_itself_round_a_circle() -> None:
    assert circles(import_graph()) == []


@pytest.mark.parametrize(
    ("module", "source", "leaked"),
    [
        ("producer.fetch", "from worker.fetch.fetcher import Fetcher", {"worker.fetch.fetcher.Fetcher"}),
        ("dlq_consumer.store", "def f():\n    import producer.tasks\n", {"producer.tasks"}),
        ("worker.handler", "from renderer.engine import RenderEngine", {"renderer.engine.RenderEngine"}),
        ("shared.settings", "from ops.status import gather", {"ops.status.gather"}),
        ("shared.redis.keys", "from shared.amqp import broker", {"shared.amqp.broker"}),
        ("shared.consumer.runtime", "import worker.store", {"worker.store"}),
        (
            "worker.parse.page",
            "from worker.fetch.response import Response",
            {"worker.fetch.response.Response"},
        ),
        ("worker.store.writer", "from shared.http import netguard", {"shared.http.netguard"}),
        ("demo_site.server", "from producer.sources import Source", {"producer.sources.Source"}),
        (
            "worker.parse.page",
            "from .fast_fields import scan_lxml\nfrom ..fetch import verdicts",
            {"worker.fetch.verdicts"},
        ),
        ("renderer.engine", "from worker.handler import CrawlHandler\nfrom shared.postgres import db", set()),
        ("ops.runs", "from demo_site.runner import serve\nimport worker.store.writer", set()),
        (
            "worker.handling.storing",
            "from worker.store.rows import PageRow\nfrom shared import metrics",
            set(),
        ),
        ("shared.http.netguard", "import redis\nfrom shared.http.addresses import AddressPolicy", set()),
    ],
)
def test_leaks_are_found(module: str, source: str, leaked: set[str]) -> None:
    assert leaks(module, source) == leaked


def test_circles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e", "d"}, "f": {"g"}, "g": {"f"}}
    assert circles(graph) == [["a", "b", "c"], ["f", "g"]]
