"""The pipeline's services as real processes that a scenario can kill, restart and stop.

Each process writes its log to `<log_dir>/<name>.log`; a restarted worker gets a new name
(`worker-2`, then `worker-2.2`, ...) so no log is overwritten. The producer runs in the
background, so faults can strike while it publishes.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

STOP_BOUND_S = 30.0  # what the pipeline promises for a graceful stop


@dataclass(frozen=True)
class Exit:
    code: int | None  # None: it had to be killed
    seconds: float  # from SIGTERM to exit


class Fleet:
    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = env
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self._roles: dict[str, str] = {}  # name -> the role's first name, e.g. worker-2.3 -> worker-2
        self._generations: dict[str, int] = {}
        self._files: list[IO[bytes]] = []
        self._producers: list[subprocess.Popen[bytes]] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, module: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._files.append(log)
        process = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        self.running[name] = process
        return process

    def start_services(self, workers: int) -> None:
        self.start("dlq_consumer", "dlq_consumer", "consume")
        for i in range(1, workers + 1):
            self.start(f"worker-{i}", "worker")

    def workers(self) -> list[str]:
        return [name for name in self.running if name.startswith("worker")]

    def kill(self, name: str) -> None:
        process = self.running.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def replace(self, name: str) -> str:
        """Start a new worker in place of `name` (killed or not); return the new one's name."""
        role = self._roles.get(name, name)
        generation = self._generations.get(role, 1) + 1
        self._generations[role] = generation
        new_name = f"{role}.{generation}"
        self._roles[new_name] = role
        self.start(new_name, "worker")
        return new_name

    def producer(self, run_id: str, *args: str) -> subprocess.Popen[bytes]:
        """`python -m producer` in the background; its JSON summary goes to producer-<run>.json."""
        out = (self.log_dir / f"producer-{run_id}.json").open("wb")
        err = (self.log_dir / f"producer-{run_id}.log").open("wb")
        self._files += [out, err]
        process = subprocess.Popen(
            [sys.executable, "-m", "producer", "--run-id", run_id, *args],
            env=self.env,
            stdout=out,
            stderr=err,
        )
        self._producers.append(process)
        return process

    def producer_summary(self, run_id: str) -> dict[str, Any]:
        text = (self.log_dir / f"producer-{run_id}.json").read_text().strip()
        assert text, f"the producer printed no summary; see {self.log_dir}/producer-{run_id}.log"
        summary: dict[str, Any] = json.loads(text.splitlines()[-1])
        return summary

    def assert_alive(self) -> None:
        """Fail if a process exited although nobody stopped it."""
        exited = {name: p.returncode for name, p in self.running.items() if p.poll() is not None}
        assert not exited, f"processes exited on their own: {exited}; see {self.log_dir}"

    def stop(self, extra: dict[str, subprocess.Popen[bytes]] | None = None) -> dict[str, Exit]:
        """SIGTERM to every process at once; wait for each (up to STOP_BOUND_S + 10 s, then kill)."""
        processes = {**self.running, **(extra or {})}
        started = time.monotonic()
        for process in processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        exits: dict[str, Exit] = {}
        pending = dict(processes)
        deadline = started + STOP_BOUND_S + 10
        while pending and time.monotonic() < deadline:
            for name, process in list(pending.items()):
                if process.poll() is not None:
                    exits[name] = Exit(process.returncode, time.monotonic() - started)
                    del pending[name]
            time.sleep(0.02)
        for name, process in pending.items():
            process.kill()
            process.wait()
            exits[name] = Exit(None, time.monotonic() - started)
        self.running.clear()
        return exits

    def close(self) -> None:
        """Whatever is still running is killed: a failed scenario must not leave processes behind."""
        for process in [*self.running.values(), *self._producers]:
            if process.poll() is None:
                process.kill()
            process.wait()
        self.running.clear()
        for file in self._files:
            file.close()

    def log_lines(self, prefix: str = "", containing: str = "") -> list[str]:
        """Lines of the logs whose file name starts with `prefix` that contain `containing`."""
        lines: list[str] = []
        for path in sorted(self.log_dir.glob(f"{prefix}*.log")):
            text = path.read_text(errors="replace")
            lines += [line for line in text.splitlines() if containing in line]
        return lines
