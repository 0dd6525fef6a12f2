"""Every exception class the project defines hangs under PipelineError (shared/errors.py), so one
`except PipelineError` sees all of ours and nothing of a library's."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

from shared.errors import PipelineError

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("shared", "producer", "worker", "dlq_consumer", "ops")
# crawl_processes.Terminated, a KeyboardInterrupt on purpose: SIGTERM must unwind a crawl past
# every `except Exception`. Named, not imported, so the test does not care which package holds it.
OUTSIDE_ON_PURPOSE = {("Terminated", KeyboardInterrupt)}


def project_exceptions() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in PACKAGES:
        if not (ROOT / package / "__init__.py").exists():
            continue
        for module_info in pkgutil.walk_packages([str(ROOT / package)], prefix=f"{package}."):
            if module_info.name.endswith("__main__"):
                continue
            module = importlib.import_module(module_info.name)
            for _, value in inspect.getmembers(module, inspect.isclass):
                if issubclass(value, BaseException) and value.__module__ == module.__name__:
                    found[f"{value.__module__}.{value.__qualname__}"] = value
    return list(found.values())


def test_the_walk_finds_the_classes_it_should() -> None:
    names = {cls.__name__ for cls in project_exceptions()}
    assert {"TryLater", "FetchFailed", "SitemapError", "PublishFailed", "ParseLimitExceeded"} <= names


def test_every_exception_is_under_the_root() -> None:
    outside = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in project_exceptions()
        if not issubclass(cls, PipelineError)
        and not any(cls.__name__ == name and issubclass(cls, base) for name, base in OUTSIDE_ON_PURPOSE)
    ]
    assert outside == []
