"""The watchdog: ends the browsers of a renderer that is gone.

A renderer killed with SIGKILL runs no cleanup, and Chromium's processes live on unless
something reaps them. So each renderer starts this small process beside it (`Watchdog.start`),
in a session of its own, so that a signal to the renderer's process group does not reach it,
and tells it on a pipe the process group of every browser it launches. The watchdog only reads
that pipe. End of file means the renderer has exited, however it died: the watchdog kills every
group it was told of (and the Playwright driver), sweeps twice more for a process forked
meanwhile, and exits.

    python -m renderer.watchdog     (started by the renderer, never by hand)
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import IO

from renderer.processes import kill_group, read_process

log = logging.getLogger(__name__)

SWEEPS = 3
SWEEP_PAUSE_S = 0.5


class Watchdog:
    """The renderer's end of the pipe."""

    def __init__(self, process: subprocess.Popen[bytes] | None) -> None:
        self._process = process

    @classmethod
    def start(cls) -> Watchdog:
        process = subprocess.Popen(
            [sys.executable, "-m", "renderer.watchdog"],
            stdin=subprocess.PIPE,
            start_new_session=True,
        )
        return cls(process)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def watch_group(self, pgid: int) -> None:
        self._send(f"group {pgid}")

    def forget_group(self, pgid: int) -> None:
        self._send(f"gone {pgid}")

    def watch_process(self, pid: int) -> None:
        self._send(f"process {pid}")

    def _send(self, line: str) -> None:
        if self._process is None or self._process.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self._process.stdin.write(f"{line}\n".encode("ascii"))
            self._process.stdin.flush()

    def stop(self) -> None:
        """A renderer's orderly stop: the pipe closes, the watchdog sweeps what is left and exits."""
        if self._process is None:
            return
        with contextlib.suppress(OSError, ValueError):
            if self._process.stdin is not None:
                self._process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=SWEEPS * SWEEP_PAUSE_S + 5)


def watch(pipe: IO[bytes]) -> None:
    """Reads the renderer's lines until end of file, then kills what they named."""
    groups, processes = _read_until_closed(pipe)
    for sweep in range(SWEEPS):
        for pgid, started in groups.items():
            leader = read_process(pgid)
            if sweep == 0 and leader is not None and leader.started != started:
                continue  # the id was reused after our browser ended
            kill_group(pgid, signal.SIGKILL)
        for pid, started in processes.items():
            info = read_process(pid)
            if info is not None and info.started == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(SWEEP_PAUSE_S)


def _read_until_closed(pipe: IO[bytes]) -> tuple[dict[int, int], dict[int, int]]:
    """The groups and processes the renderer named, each with its leader's start time (an id
    reused by another process later is not ours), less the groups it said are gone."""
    groups: dict[int, int] = {}
    processes: dict[int, int] = {}
    for raw in pipe:
        what, _, number = raw.decode("ascii", "replace").strip().partition(" ")
        if not number.isdigit():
            continue
        pid = int(number)
        info = read_process(pid)
        if what == "group" and info is not None:
            groups[pid] = info.started
        elif what == "process" and info is not None:
            processes[pid] = info.started
        elif what == "gone":
            groups.pop(pid, None)
    return groups, processes


def main() -> int:
    # Only end of file on the pipe ends it: an interrupt meant for the renderer's terminal must
    # not take the watchdog away first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    watch(sys.stdin.buffer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
