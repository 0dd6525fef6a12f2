"""python -m ops.check against the real services: one line each, exit 0 when all are ok and 2
when any is not, credentials never shown."""

from __future__ import annotations

import io
import os
import socket
import subprocess
import sys
from pathlib import Path

from ops import management
from ops.check import checks_for, run_checks
from shared.settings import Settings
from tests.e2e.conftest import service_env


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_every_line_is_ok_on_a_working_machine(settings: Settings, tmp_path: Path) -> None:
    with socket.socket() as proxy:  # a listener stands in for a proxy: the check only connects
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        env = service_env(
            settings,
            WARC_DIR=str(tmp_path),
            PROXIES=f"socks5h://user:s3cret@127.0.0.1:{proxy.getsockname()[1]}",
        )
        done = subprocess.run(
            [sys.executable, "-m", "ops.check"], env=env, capture_output=True, text=True, timeout=60
        )
    lines = done.stdout.splitlines()
    names = [line.split()[1] for line in lines]
    assert names[:5] == ["settings", "rabbitmq", "management", "redis", "postgresql"]
    assert {"proxies", "proxy", "routing", "politeness", "profiles", "warc_dir"} <= set(names)
    # `make test` turns the management plugin on (tests/prepare.py); run alone, it may be off.
    failing = [] if management.answers(settings) else ["management"]
    assert [name for name, line in zip(names, lines, strict=True) if not line.startswith("ok ")] == failing
    assert done.returncode == (2 if failing else 0), done.stdout + done.stderr
    assert "s3cret" not in done.stdout and "guest:guest" not in done.stdout
    assert list(tmp_path.iterdir()) == []  # the probe file is gone


def test_each_failure_is_its_own_line_and_the_exit_is_2(settings: Settings, tmp_path: Path) -> None:
    read_only = tmp_path / "ro"
    read_only.mkdir()
    read_only.chmod(0o500)
    os.environ["WARC_DIR"] = str(read_only)
    try:
        broken = Settings.from_env(
            {
                **service_env(settings),
                "REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0",
                "RABBITMQ_MANAGEMENT_URL": f"http://127.0.0.1:{closed_port()}",
                "PROXIES": f"http://u:s3cret@127.0.0.1:{closed_port()}",
            }
        )
        checks = checks_for(broken)
    finally:
        del os.environ["WARC_DIR"]
    out = io.StringIO()
    assert run_checks(checks, out) == 2
    by_name = {line.split()[1]: line for line in out.getvalue().splitlines()}
    assert by_name["rabbitmq"].startswith("ok ")
    assert by_name["postgresql"].startswith("ok ")
    assert by_name["redis"].startswith("FAIL ")
    assert by_name["management"].startswith("FAIL ") and "rabbitmq-plugins enable" in by_name["management"]
    assert by_name["proxy"].startswith("FAIL ") and "http://127.0.0.1:" in by_name["proxy"]
    assert by_name["proxies"] == "ok    proxies       1 listed"
    if os.geteuid() != 0:  # root writes anywhere
        assert by_name["warc_dir"].startswith("FAIL ")
    assert "s3cret" not in out.getvalue()


def test_bad_settings_are_one_failing_line(tmp_path: Path) -> None:
    env = {**os.environ, "RATE_LIMIT_RPS": "-1"}
    done = subprocess.run(
        [sys.executable, "-m", "ops.check"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout == "FAIL  settings      RATE_LIMIT_RPS: must be positive, got -1.0\n"


def test_a_routing_file_that_does_not_load_fails_its_line(settings: Settings, tmp_path: Path) -> None:
    routing = tmp_path / "routing.toml"
    routing.write_text('[[rule]]\nqueue = "nowhere"\n', encoding="utf-8")
    checks = [
        check
        for check in checks_for(Settings.from_env({**service_env(settings), "ROUTING_FILE": str(routing)}))
    ]
    out = io.StringIO()
    assert run_checks([c for c in checks if c[0] == "routing"], out) == 2
    assert out.getvalue().startswith("FAIL  routing ")


def test_a_proxy_file_that_cannot_be_read_fails_its_line(settings: Settings, tmp_path: Path) -> None:
    missing = Settings.from_env({**service_env(settings), "PROXY_FILE": str(tmp_path / "none.txt")})
    out = io.StringIO()
    assert run_checks([c for c in checks_for(missing) if c[0].startswith("prox")], out) == 2
    reason = f"PROXY_FILE: cannot read '{tmp_path / 'none.txt'}' (No such file or directory)"
    assert out.getvalue() == f"FAIL  proxies       {reason}\n"
