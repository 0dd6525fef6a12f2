"""`make crawl` runs the launch checks first, and stops if they fail."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def recipe(target: str) -> list[str]:
    lines = (REPO / "Makefile").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    body: list[str] = []
    for line in lines[start + 1 :]:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    return body


def test_make_crawl_checks_before_it_crawls() -> None:
    steps = recipe("crawl")
    check = next(i for i, step in enumerate(steps) if step == "$(PY) -m ops.check")
    crawl = next(i for i, step in enumerate(steps) if "-m ops.crawl" in step)
    assert check < crawl
    # Make stops at a failing command: neither step may swallow the other's exit code.
    assert not any(step.startswith("-") for step in steps)
