"""Every malformed setting stops every entry point with one line naming it, exit 2, no traceback,
and no password from the environment in what it prints.

Each case is checked before any service is contacted (shared/settings.py), so the entry points
run here reach no queue, key or table: the names below are unique all the same."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.teardown import remove_pipeline
from shared.settings import Settings
from tests.conftest import unique_name

REPO = Path(__file__).resolve().parents[2]
SECRET = "s3cret"
ENTRY_POINTS = {
    "worker": ["-m", "worker"],
    "producer": ["-m", "producer", "--urls", os.devnull],
    "dlq_consumer": ["-m", "dlq_consumer"],
}

# (variable, value): each a mistake someone could make. Values with a password carry SECRET.
BAD_SETTINGS: list[tuple[str, str]] = [
    ("DATABASE_URL", f"mysql://x:{SECRET}@127.0.0.1/db"),
    ("DATABASE_URL", f"host=127.0.0.1 password={SECRET} dbname"),
    ("DATABASE_URL", f"postgresql://u:{SECRET}@127.0.0.1:99999/db"),
    ("AMQP_URL", "notaurl"),
    ("AMQP_URL", f"amqp://u:{SECRET}@127.0.0.1:notaport/"),
    ("AMQP_URL", f"amqp://u:{SECRET}@127.0.0.1:5672/%2f?heartbeat=often"),
    ("AMQP_URL", f"http://u:{SECRET}@127.0.0.1:5672/"),
    ("AMQP_URL", f"amqp://u:{SECRET}@/"),
    ("REDIS_URL", "bogus"),
    ("REDIS_URL", f"redis://:{SECRET}@127.0.0.1:port/0"),
    ("RABBITMQ_MANAGEMENT_URL", f"ftp://u:{SECRET}@127.0.0.1/"),
    ("MAX_ATTEMPTS", "many"),
    ("MAX_ATTEMPTS", "0"),
    ("FETCH_CONCURRENCY", "-3"),
    ("FETCH_DEADLINE_S", "nan"),
    ("FETCH_DEADLINE_S", "-1"),
    ("CACHE_TTL_S", "inf"),
    ("HEARTBEAT_S", "-5"),
    ("METRICS_PORT", "70000"),
    ("RETRY_DELAYS_S", "5,soon"),
    ("RETRY_DELAYS_S", ","),
    ("RESPECT_ROBOTS", "maybe"),
    ("QUEUE_TYPE", "stream"),
    ("LOG_LEVEL", "LOUD"),
    ("LOG_FORMAT", "xml"),
    ("CRAWL_NAMESPACE", "a b"),
    ("FETCH_ALLOWLIST", "999.1.1.1/40"),
    ("ROUTING_FILE", "/nonexistent/routing.toml"),
    ("POLITENESS_FILE", "/etc"),
    ("EXTRACTION_PROFILES_FILE", sys.executable),  # a binary
    ("POLITENESS_FILE", "BAD_TOML"),  # replaced by a file of broken TOML
]
# Settings only the worker reads, and checks as it starts.
WORKER_ONLY_SETTINGS: list[tuple[str, str]] = [
    ("PROXIES", f"http://u:{SECRET}@:notaport"),
    ("PROXIES", "bogus"),
]


def run(entry: str, variable: str, value: str, bad_toml: Path) -> subprocess.CompletedProcess[str]:
    name = unique_name("cfg")
    env = {
        **os.environ,
        "CRAWL_NAMESPACE": name,
        "REDIS_PREFIX": name,
        "PG_SCHEMA": name,
        "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/crawler_test",
        variable: str(bad_toml) if value == "BAD_TOML" else value,
    }
    try:
        return subprocess.run(
            [sys.executable, *ENTRY_POINTS[entry]],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired as exc:  # it started instead of refusing: a failure, reported below
        return subprocess.CompletedProcess(exc.cmd, -1, "", f"still running after {exc.timeout} s")
    finally:
        # Nothing should have been made under these names; if a case got that far, clean up.
        remove_pipeline(
            Settings(
                crawl_namespace=name, redis_prefix=name, pg_schema=name, database_url=env["DATABASE_URL"]
            )
        )


@pytest.mark.timeout(300)
def test_every_bad_setting_is_one_line_and_exit_2_in_every_entry_point(tmp_path: Path) -> None:
    bad_toml = tmp_path / "rules.toml"
    bad_toml.write_text('[domains."a.test"\nrate_limit_rps = \n')
    cases: list[tuple[str, str, str]] = [
        (entry, variable, value) for variable, value in BAD_SETTINGS for entry in ENTRY_POINTS
    ]
    cases += [("worker", variable, value) for variable, value in WORKER_ONLY_SETTINGS]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda case: run(case[0], case[1], case[2], bad_toml), cases))
    wrong = []
    for (entry, variable, value), result in zip(cases, results, strict=True):
        output = (result.stdout + result.stderr).strip()
        lines = output.splitlines()
        if (
            result.returncode != 2
            or len(lines) != 1
            or "Traceback" in output
            or SECRET in output
            or variable not in lines[0]
        ):
            wrong.append(f"{entry} {variable}={value!r}: exit {result.returncode}: {output[:300]!r}")
    settings_tried = len(BAD_SETTINGS) + len(WORKER_ONLY_SETTINGS)
    print(f"{len(cases)} runs of {settings_tried} bad settings: {len(cases) - len(wrong)} refused in a line")
    assert wrong == []
