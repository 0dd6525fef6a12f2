"""Every metric declared in shared/metrics.py is updated somewhere in the services' code.

A metric that is declared, documented and put on the dashboard but never counted stays at zero
and looks like "nothing happened". This reads the code (no process runs): for each metric
object of shared/metrics.py there must be an update call on it (`inc`, `observe`, `set`, ...,
possibly through `.labels(...)`) in producer/, worker/, dlq_consumer/ or shared/ outside
metrics.py, or inside a helper of metrics.py that such code calls. tests/e2e/test_metrics.py
checks the same at run time: each one moves in a real crawl.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from shared import metrics

REPO = Path(__file__).resolve().parents[2]
SERVICE_PACKAGES = ("producer", "worker", "dlq_consumer", "renderer", "shared")
METRICS_MODULE = REPO / "shared" / "metrics.py"
UPDATES = {"inc", "dec", "set", "observe", "track_inprogress", "time", "set_to_current_time", "set_function"}

# Declared metrics that no code updates yet, each with the reason. Keep it empty: an entry here
# is a known gap, and the test below fails as soon as the metric is counted, so that the entry
# goes.
NOT_YET_COUNTED: dict[str, str] = {}


def declared() -> set[str]:
    return {name for name, value in vars(metrics).items() if isinstance(value, MetricWrapperBase)}


def service_files() -> Iterator[Path]:
    for package in SERVICE_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path != METRICS_MODULE:
                yield path


def base_name(node: ast.expr) -> str | None:
    """The metric name at the root of `X`, `metrics.X`, `X.labels(...)`, `metrics.X.labels(...)`."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "labels":
        return base_name(node.func.value)
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def updated_in(tree: ast.AST) -> set[str]:
    """Names whose value gets an update call somewhere in `tree`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in UPDATES:
            name = base_name(node.func.value)
            if name is not None:
                found.add(name)
    return found


def names_used_in(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
    }


def counted_metrics() -> set[str]:
    counted: set[str] = set()
    used: set[str] = set()
    for path in service_files():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        counted |= updated_in(tree)
        used |= names_used_in(tree)
    # Helpers of metrics.py (observe_fetch) count for the metrics they update, if they are called.
    module = ast.parse(METRICS_MODULE.read_text(encoding="utf-8"))
    for function in module.body:
        if isinstance(function, ast.FunctionDef) and function.name in used:
            counted |= updated_in(function)
    return counted & declared()


def test_the_check_sees_the_metrics_and_the_updates() -> None:
    assert {"PAGES_STORED", "DEAD_LETTERS", "URLS_ENQUEUED", "FETCH_SECONDS"} <= declared()
    sample = ast.parse(
        "metrics.A.labels('x').inc()\nB.observe(1)\nwith metrics.C.track_inprogress(): pass\nD.labels('y')\n"
    )
    assert updated_in(sample) == {"A", "B", "C"}  # D only gets a child, never a count


def test_every_declared_metric_is_updated_by_the_services() -> None:
    never = declared() - counted_metrics() - set(NOT_YET_COUNTED)
    assert not never, f"declared in shared/metrics.py but never updated: {sorted(never)}"


def test_the_list_of_known_gaps_is_not_stale() -> None:
    assert set(NOT_YET_COUNTED) <= declared(), "an entry names no metric of shared/metrics.py"
    now_counted = set(NOT_YET_COUNTED) & counted_metrics()
    assert not now_counted, f"counted now: remove {sorted(now_counted)} from NOT_YET_COUNTED"
