"""Restarts: the policy's pauses and its bound, and a worker pool that forks a dead worker again."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ops.crawl_processes import CrawlFailed, Processes, exit_text, last_line
from shared.supervision import RestartPolicy
from tests.fakes import FakeTime


def test_the_pause_doubles_with_each_death_up_to_a_cap() -> None:
    clock = FakeTime(1000.0)
    policy = RestartPolicy(max_restarts=10, window_s=60, first_delay_s=0.5, max_delay_s=3, clock=clock)
    delays = []
    for _ in range(5):
        delays.append(policy.after_exit())
        clock.now += 1
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_a_process_that_keeps_dying_is_given_up_after_max_restarts_in_the_window() -> None:
    clock = FakeTime(1000.0)
    policy = RestartPolicy(max_restarts=5, window_s=60, clock=clock)
    answers = []
    for _ in range(6):
        answers.append(policy.after_exit())
        clock.now += 5
    assert all(a is not None for a in answers[:5])
    assert answers[5] is None
    assert policy.describe_giving_up() == "ended 6 times within 60 s"


def test_deaths_outside_the_window_are_forgotten() -> None:
    clock = FakeTime(1000.0)
    policy = RestartPolicy(max_restarts=2, window_s=60, first_delay_s=1, clock=clock)
    assert policy.after_exit() == 1
    clock.now += 30
    assert policy.after_exit() == 2
    clock.now += 31  # the first death is now more than 60 s ago
    assert policy.after_exit() == 2  # two in the window: a second restart's pause, not a give-up
    clock.now += 1
    assert policy.after_exit() is None


def test_the_last_line_of_a_log_is_the_process_s_own_error(tmp_path: Path) -> None:
    log = tmp_path / "worker-1.log"
    log.write_text("starting\n" + "x" * 10_000 + "\nworker: error: RATE_LIMIT_RPS: expected float\n\n")
    assert last_line(log) == "worker: error: RATE_LIMIT_RPS: expected float"
    assert last_line(tmp_path / "missing.log") == ""
    assert exit_text(2) == "exited with code 2" and exit_text(-9) == "was killed by signal 9"


POOL_SCRIPT = textwrap.dedent(
    """
    import sys
    import time

    from shared.supervision import RestartPolicy
    from worker.pool import run_pool

    starts = sys.argv[1]

    def serve(index: int) -> int:
        with open(starts, "a") as f:
            f.write(f"{index}\\n")
        if index == 1:
            return 3  # worker 1 dies at once, every time
        time.sleep(30)  # worker 0 is healthy: it works until the pool stops it
        return 0

    policy = lambda: RestartPolicy(max_restarts=2, window_s=60, first_delay_s=0.01, max_delay_s=0.05)
    sys.exit(run_pool(2, serve, policy=policy))
    """
)


def test_a_pool_restarts_a_dying_worker_then_gives_up_and_stops(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    result = subprocess.run(
        [sys.executable, "-c", POOL_SCRIPT, str(starts)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    started = starts.read_text().split()
    assert started.count("1") == 3  # the first start and two restarts; the third death is the end
    assert started.count("0") == 1  # the healthy worker was never restarted
    assert result.returncode == 3  # the code of the worker that kept dying
    assert "worker 1 keeps dying (ended 3 times within 60 s, last with code 3)" in result.stderr
    assert result.stderr.count("; starting it again in") == 2


STOP_BEFORE_FORK_SCRIPT = textwrap.dedent(
    """
    import os
    import signal
    import sys
    import time

    from worker.pool import run_pool

    starts, restarted = sys.argv[1], []
    due = time.monotonic() + 1.0

    class BothAtOnce:  # both workers are due to start again at the same moment
        def after_exit(self):
            return max(0.0, due - time.monotonic())

    def serve(index: int) -> int:
        with open(starts, "a") as f:
            f.write(f"{index}\\n")
        if len(open(starts).read().split()) <= 2:
            return 1  # the first start of each dies at once
        time.sleep(5)
        return 0

    def name_of(index: int) -> str:
        if time.monotonic() >= due:  # named once the first restart is forked: a stop now
            restarted.append(index)  # comes between the next restart's check and its fork
            os.kill(os.getpid(), signal.SIGTERM)
        return f"worker {index}"

    code = run_pool(2, serve, name_of=name_of, policy=BothAtOnce)
    print(len(restarted))
    sys.exit(code)
    """
)


def test_a_stop_that_comes_just_before_a_restart_leaves_no_worker_unstopped(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", STOP_BEFORE_FORK_SCRIPT, str(tmp_path / "starts")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.split() == ["1"], result.stderr  # the second restart was not forked


SLEEPING_PARENT_SCRIPT = textwrap.dedent(
    """
    import os
    import signal
    import sys
    import threading
    import time

    from worker.pool import run_pool

    def serve(index: int) -> int:
        time.sleep(30)  # until the pool stops it
        return 0

    def wakes() -> int:
        status = open(f"/proc/self/task/{os.getpid()}/status").read()
        return int(status.split("voluntary_ctxt_switches:")[1].split()[0])

    def watch() -> None:  # the parent's main thread, while both workers run
        time.sleep(0.5)
        before = wakes()
        time.sleep(1.5)
        print(wakes() - before)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, daemon=True).start()
    sys.exit(run_pool(2, serve))
    """
)


def test_the_parent_sleeps_while_its_workers_run_and_a_stop_still_ends_them(tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", SLEEPING_PARENT_SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert int(result.stdout.split()[0]) <= 1, result.stderr  # polling every 0.1 s made 15
    assert result.returncode == 128 + 15  # the workers ended by the SIGTERM passed on to them
    assert time.monotonic() - started < 20


def test_a_crawl_process_that_keeps_dying_is_given_up_with_its_own_last_line(tmp_path: Path) -> None:
    lines: list[str] = []
    procs = Processes(
        tmp_path,
        dict(os.environ),
        say=lines.append,
        policy=lambda: RestartPolicy(max_restarts=2, window_s=60, first_delay_s=0.01, max_delay_s=0.01),
    )
    # A process that fails at once, with a one-line error, every time it starts.
    procs.start("helper", "json.tool", str(tmp_path / "missing.json"))
    with pytest.raises(CrawlFailed, match="helper keeps dying"):
        for _ in range(500):
            procs.supervise()
            time.sleep(0.01)
    procs.stop_all()
    assert [line.split(":")[0] for line in lines] == [
        "helper exited with code 2",
        "helper started again",
        "helper exited with code 2",
        "helper started again",
        "helper keeps dying (ended 3 times within 60 s, last exited with code 2",
    ]
    assert "missing.json" in lines[0]  # the process's own error line
    assert lines[-1].endswith(f"not starting it again; see {tmp_path / 'helper.log'}")
    # Each start's lines appended to the same log.
    assert (tmp_path / "helper.log").read_text().count("No such file or directory") == 3
