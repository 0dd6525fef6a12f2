"""The nemesis: carries out a schedule (tests/soak/schedule.py) against the soak's processes
(cast.py), its own services (services.py) and the fault proxies on the links to them (proxy.py),
each fault on a thread of its own so that they overlap as drawn, and writes down what it did.

The history is the schedule as carried out: when each fault really began and ended, whom it
struck (a pid), and anything that went otherwise than planned (a process gone when its pause
came). It is printed at the end beside the schedule, one line per fault.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.soak.cast import Cast
from tests.soak.proxy import FaultProxy
from tests.soak.schedule import Fault


@dataclass
class Done:
    fault: Fault
    began_s: float
    ended_s: float = 0.0
    struck: str = ""
    error: str = ""

    def line(self) -> str:
        outcome = f"  ERROR {self.error}" if self.error else ""
        carried_out = f"[began {self.began_s:7.1f}s ended {self.ended_s:7.1f}s]"
        return f"{self.fault.describe()}  {carried_out} {self.struck}{outcome}"


@dataclass
class History:
    done: list[Done] = field(default_factory=list)
    revived: list[tuple[float, str]] = field(default_factory=list)  # processes that exited on their own
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, entry: Done) -> None:
        with self.lock:
            self.done.append(entry)

    def by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for entry in self.done:
            if not entry.error:
                counts[entry.fault.kind] = counts.get(entry.fault.kind, 0) + 1
        return dict(sorted(counts.items()))


class Nemesis:
    def __init__(
        self,
        schedule: list[Fault],
        cast: Cast,
        outage: Callable[[str, float], None],
        proxies: dict[str, FaultProxy],
        seed: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.schedule = schedule
        self.cast = cast
        self.outage = outage
        self.proxies = proxies
        self.history = History()
        self._chaos = random.Random(seed ^ 0x5EED)  # which pid of a role: drawn too, replayable
        self._chaos_lock = threading.Lock()
        self._clock = clock
        self._started = 0.0
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()

    def now_s(self) -> float:
        return self._clock() - self._started

    def start(self) -> None:
        self._started = self._clock()
        for fault in self.schedule:
            thread = threading.Thread(
                target=self._at, args=(fault,), daemon=True, name=f"nemesis-{fault.kind}"
            )
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Faults not begun are dropped; those under way end now (each heals what it broke)."""
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=300)
        for proxy in self.proxies.values():
            proxy.heal()

    def _at(self, fault: Fault) -> None:
        if self._stopping.wait(max(0.0, fault.at_s - self.now_s())):
            return
        entry = Done(fault, began_s=self.now_s())
        try:
            entry.struck = getattr(self, f"_{fault.kind}")(fault)
        except Exception as exc:  # written down, the soak goes on: the checker judges the end
            entry.error = f"{type(exc).__name__}: {exc}"
        entry.ended_s = self.now_s()
        self.history.add(entry)

    def _hold(self, seconds: float) -> None:
        self._stopping.wait(seconds)

    def _pick(self, target: str) -> tuple[str, int]:
        with self._chaos_lock:
            return self.cast.pid_of(target, self._chaos)

    # ---- the kinds ------------------------------------------------------------------------------

    def _kill(self, fault: Fault) -> str:
        role, pid = self._pick(fault.target)
        if fault.target == "pool-child":
            self.cast.signal(pid, signal.SIGKILL)  # its pool forks it again
            return f"pid {pid} (the pool forks another)"
        self.cast.kill(role)
        self._hold(fault.hold_s)
        self.cast.restart(role)
        return f"{role} pid {pid}, restarted"

    def _pause(self, fault: Fault) -> str:
        role, pid = self._pick(fault.target)
        self.cast.signal(pid, signal.SIGSTOP)
        try:
            self._hold(fault.hold_s)
        finally:
            self.cast.signal(pid, signal.SIGCONT)
        return f"{role} pid {pid}"

    def _outage(self, fault: Fault) -> str:
        self.outage(fault.target, 0.0 if self._stopping.is_set() else fault.hold_s)
        return "down, then up and answering"

    def _delay(self, fault: Fault) -> str:
        proxy = self.proxies[fault.target]
        proxy.delay(fault.delay_ms / 1000)
        try:
            self._hold(fault.hold_s)
        finally:
            proxy.delay(0.0)
        return f"{proxy.open_connections()} connections"

    def _stall(self, fault: Fault) -> str:
        proxy = self.proxies[fault.target]
        proxy.stall(True)
        try:
            self._hold(fault.hold_s)
        finally:
            proxy.stall(False)
        return f"{proxy.open_connections()} connections"

    def _reset(self, fault: Fault) -> str:
        return f"{self.proxies[fault.target].reset()} connections reset"
