"""The pipeline's long-running processes in the soak, one per role, on the fault scenarios' Fleet
(tests/faults/fleet.py): the nemesis kills, pauses and restarts them by role, and a process that
exits on its own is started again (as a restart policy would) and counted, for the checker.

    worker            python -m worker                 (lone workers: worker, worker-2)
    pool-parent       python -m worker --processes 2   (its children are the pool-child role)
    producer-service  python -m producer --serve
    frontier          python -m producer --frontier
    dlq_consumer      python -m dlq_consumer consume
    renderer          python -m renderer
    dashboard         python -m ops.dashboard --port P
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.fleet import Fleet

POOL_PROCESSES = 2


@dataclass
class Role:
    name: str
    module: str
    args: tuple[str, ...]
    generation: int = 1
    exits_on_own: list[int | None] = field(default_factory=list)

    @property
    def process_name(self) -> str:
        return self.name if self.generation == 1 else f"{self.name}.{self.generation}"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
    return sorted(found)


def last_line(log: Path) -> str:
    """The last line of a log, shortened: why a process ended, as it said it."""
    with contextlib.suppress(OSError):
        lines = log.read_text(errors="replace").strip().splitlines()
        return lines[-1][:240] if lines else "(an empty log)"
    return "(no log)"


def has_traceback(log: Path) -> bool:
    with contextlib.suppress(OSError):
        return "Traceback (most recent call last)" in log.read_text(errors="replace")
    return False


def rss_kb(pid: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


class Cast:
    def __init__(self, fleet: Fleet, dashboard_port: int) -> None:
        self.fleet = fleet
        self.lock = threading.RLock()
        roles = [
            Role("worker", "worker", ()),
            Role("worker-2", "worker", ()),
            Role("pool-parent", "worker", ("--processes", str(POOL_PROCESSES))),
            Role("producer-service", "producer", ("--serve",)),
            Role("frontier", "producer", ("--frontier",)),
            Role("dlq_consumer", "dlq_consumer", ("consume",)),
            Role("renderer", "renderer", ("--concurrency", "2")),
            Role("dashboard", "ops.dashboard", ("--port", str(dashboard_port))),
        ]
        self.roles = {role.name: role for role in roles}

    def start_all(self) -> None:
        for role in self.roles.values():
            self._start(role)

    def _start(self, role: Role) -> None:
        self.fleet.start(role.process_name, role.module, *role.args)

    def process(self, role_name: str) -> subprocess.Popen[bytes]:
        return self.fleet.running[self.roles[role_name].process_name]

    def pid_of(self, target: str, chaos: random.Random) -> tuple[str, int]:
        """The (role, pid) a fault on `target` strikes: a pool child is one of the pool's
        children, a `worker` one of the lone workers, picked by `chaos`."""
        with self.lock:
            if target == "pool-child":
                children = children_of(self.process("pool-parent").pid)
                if not children:
                    raise LookupError("the pool has no child right now")
                return "pool-parent", chaos.choice(children)
            role = chaos.choice(["worker", "worker-2"]) if target == "worker" else target
            return role, self.process(role).pid

    def kill(self, role_name: str) -> int:
        """SIGKILL the role's process; its pid. It stays down until restart()."""
        with self.lock:
            role = self.roles[role_name]
            pid = self.fleet.running[role.process_name].pid
            self.fleet.kill(role.process_name)
            return pid

    def restart(self, role_name: str) -> None:
        with self.lock:
            role = self.roles[role_name]
            role.generation += 1
            self._start(role)

    def revive_exited(self) -> list[str]:
        """Start again every role whose process exited although nobody killed it: a restart
        policy's job, done here so the soak goes on; each is counted as the role's exit."""
        revived = []
        with self.lock:
            for role in self.roles.values():
                process = self.fleet.running.get(role.process_name)
                if process is not None and process.poll() is not None:
                    role.exits_on_own.append(process.returncode)
                    last = last_line(self.fleet.log_dir / f"{role.process_name}.log")
                    revived.append(f"{role.process_name} (exit {process.returncode}): {last}")
                    del self.fleet.running[role.process_name]
                    role.generation += 1
                    self._start(role)
        return revived

    def logs_with_tracebacks(self) -> list[str]:
        return sorted(p.name for p in self.fleet.log_dir.glob("*.log") if has_traceback(p))

    def pids(self) -> dict[str, int]:
        """Every pipeline process running now by name, the pool's children among them."""
        with self.lock:
            found = {name: p.pid for name, p in self.fleet.running.items() if p.poll() is None}
            pool = self.roles["pool-parent"].process_name
            if pool in found:
                for child in children_of(found[pool]):
                    found[f"{pool}/child-{child}"] = child
            return found

    def signal(self, pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
