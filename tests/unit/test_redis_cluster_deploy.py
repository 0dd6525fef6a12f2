"""The local Redis Cluster: one command up, one down, loopback only, never run by `make test`."""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "local" / "redis-cluster.sh"


def test_the_script_is_executable_and_binds_loopback_only() -> None:
    text = SCRIPT.read_text()
    assert os.access(SCRIPT, os.X_OK)
    assert re.search(r"^HOST=127\.0\.0\.1$", text, re.MULTILINE)
    assert '--bind "$HOST"' in text and "6379" not in text.replace("Redis on 6379", "")
    assert "--cluster-replicas 1" in text and "cluster-enabled yes" in text


def test_make_has_one_command_up_and_one_down() -> None:
    makefile = (REPO / "Makefile").read_text()
    for target, command in (
        ("redis-cluster-up", "redis-cluster.sh up"),
        ("redis-cluster-down", "redis-cluster.sh down"),
    ):
        assert re.search(rf"^{target}:\n\t.*{command}", makefile, re.MULTILINE), target
    assert re.search(r"^faults-cluster:", makefile, re.MULTILINE)


def test_a_bare_pytest_leaves_the_cluster_tests_out() -> None:
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "not cluster" in options["addopts"]
    assert any(marker.startswith("cluster:") for marker in options["markers"])
