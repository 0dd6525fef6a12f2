"""Process-level measurements for the benchmarks: CPU time of our children and of the services."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    cpu_s: float = 0.0
    peak_rss_mb: float = 0.0  # sampled by stop_all while the child lives
    exit_code: int | None = None


@dataclass
class Children:
    """Child processes whose CPU time and peak memory we read when we reap them (wait4)."""

    env: dict[str, str]
    log_dir: Path
    cwd: Path | None = None  # where they start: `python -m` imports the project from there
    running: list[Child] = field(default_factory=list)
    finished: list[Child] = field(default_factory=list)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(self, name: str, *argv: str, stdout: int | None = None) -> Child:
        log = (self.log_dir / f"{name}.log").open("wb")
        self._logs.append(log)
        process = subprocess.Popen(
            [sys.executable, *argv], env=self.env, stdout=stdout or log, stderr=log, cwd=self.cwd
        )
        child = Child(name, process)
        self.running.append(child)
        return child

    def reap(self, child: Child) -> Child:
        _, status, usage = os.wait4(child.process.pid, 0)
        child.process.returncode = child.exit_code = os.waitstatus_to_exitcode(status)
        # A worker pool's figure includes its workers: Linux adds the usage of the children a
        # process has reaped to its own.
        child.cpu_s = usage.ru_utime + usage.ru_stime
        # Not usage.ru_maxrss: Linux carries the peak of the memory a process had before exec
        # into it, and a child started with vfork had ours, so a large benchmark process
        # would inflate every child's figure. stop_all samples the child's own VmHWM instead.
        self.running.remove(child)
        self.finished.append(child)
        return child

    def stop_all(self, timeout_s: float = 40.0) -> None:
        for child in self.running:
            child.peak_rss_mb = _peak_rss_mb(child.process.pid)
            # os.kill, not Popen.send_signal: that polls first, and polling would reap the child
            # and lose its resource usage.
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in list(self.running):
            # waitid with WNOWAIT sees the exit without reaping, so wait4 still gets the rusage.
            while not _exited(child.process.pid) and time.monotonic() < deadline:
                child.peak_rss_mb = max(child.peak_rss_mb, _peak_rss_mb(child.process.pid))  # while it drains
                time.sleep(0.05)
            if not _exited(child.process.pid):
                os.kill(child.process.pid, signal.SIGKILL)
            self.reap(child)
        for log in self._logs:
            log.close()

    def cpu_s(self, prefix: str = "") -> float:
        return sum(c.cpu_s for c in self.finished if c.name.startswith(prefix))


def children_of(pid: int) -> list[int]:
    """The pids of a live process's children now running, whichever of its threads forked them.
    A thread or a child that ends while they are read is passed over, not an error; a process
    that has ended has none."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []
    children = []
    for task in tasks:
        with contextlib.suppress(OSError):
            children += [int(child) for child in (task / "children").read_text().split()]
    return children


def _peak_rss_mb(pid: int) -> float:
    """The peak resident memory (VmHWM) of a live process, or of the largest of the workers it
    forked (a worker pool); 0 once it has exited."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    return max([_own_peak_rss_mb(pid), *(_own_peak_rss_mb(int(child)) for child in children)])


def _own_peak_rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _exited(pid: int) -> bool:
    result = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)
    return result is not None


def _proc_cpu_s(pid: int, with_children: bool) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    # After ')' the fields start at 'state' (field 3): utime=14, stime=15, cutime=16, cstime=17.
    ticks = int(fields[11]) + int(fields[12])
    if with_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / TICKS_PER_S


def _parent_pid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def postmasters(parents: dict[int, int]) -> set[int]:
    """Of PostgreSQL's processes, given as {pid: parent pid}, the ones no other of them
    started. Not the lowest pid: once pids wrap (at 32,768 here) a new backend can have a lower
    one than its postmaster, and taking it for the postmaster turned the figure negative by the
    postmaster's whole children's CPU."""
    return {pid for pid, parent in parents.items() if parent not in parents}


def proc_cpu_s(pid: int) -> float:
    """CPU seconds a live process has used so far (0 once it is gone)."""
    return _proc_cpu_s(pid, with_children=False)


def _pids(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm == name:
                found.append(int(entry.name))
    return found


def services_cpu_s() -> dict[int, float]:
    """CPU seconds used so far by each process of RabbitMQ, Redis and PostgreSQL, by pid (the
    postmaster's figure includes its exited backends). Compare two with `services_delta`."""
    postgres = _pids("postgres")
    started_by_none = postmasters({p: _parent_pid(p) for p in postgres})
    found = {p: _proc_cpu_s(p, with_children=True) for p in _pids("beam.smp")}
    found.update({p: _proc_cpu_s(p, with_children=False) for p in _pids("redis-server")})
    found.update({p: _proc_cpu_s(p, with_children=p in started_by_none) for p in postgres})
    return found


def redis_cpu_s() -> float:
    """CPU seconds every redis-server process has used so far."""
    return sum(_proc_cpu_s(pid, with_children=False) for pid in _pids("redis-server"))


def services_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds the services spent between two readings: what each process that lived
    through both added, and all of each one that started between them. A backend that exited
    meanwhile is counted in its postmaster's figure, so it is left out here: subtracting its
    last reading from nothing made the figure negative."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def services_delta_by_name(before: dict[int, float], after: dict[int, float]) -> dict[str, float]:
    """`services_delta` split by service: beam.smp (RabbitMQ), redis-server and postgres."""
    spent: dict[str, float] = {}
    for pid, cpu in after.items():
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            name = "postgres"  # exited since the reading: only PostgreSQL's backends come and go
        spent[name] = spent.get(name, 0.0) + cpu - before.get(pid, 0.0)
    return spent


def self_children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def free_port_block(size: int) -> int:
    """The first of `size` consecutive loopback ports that are free now, below the kernel's
    ephemeral range: a block inside it could be taken, between this check and a server's bind,
    by the local end of any outgoing connection (a worker's to Redis, say)."""
    ephemeral_low = _ephemeral_low()
    for base in random.sample(range(10_000, ephemeral_low - size), 100):
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + size):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise SystemExit(f"no {size} consecutive free ports found")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default
