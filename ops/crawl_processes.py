"""The processes of a crawl on one machine, supervised: `ops.crawl` starts the dead-letter
consumer and the workers here, each logging to a file of its own, and calls `supervise()` while
it waits.

A worker or consumer that dies is started again after a pause that grows with each death
(shared/supervision.py), as compose or Kubernetes would restart it; the broker has given back
what it held, so nothing is lost meanwhile. Each death gets one line with the process's own last
words (the last line of its log). A process that keeps dying is left stopped, with one line
naming its log; the crawl fails only when no worker is left, or the dead-letter consumer is gone.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shared.errors import PipelineError
from shared.signals import stop_signals_call
from shared.supervision import RestartPolicy

STOP_TIMEOUT_S = 30.0
ALREADY_STOPPING_S = 10.0  # within STOP_TIMEOUT_S
_TAIL_BYTES = 4096


class CrawlFailed(PipelineError):
    """The crawl cannot finish: a service keeps dying, the run timed out, a backing service
    stayed away too long. `str()` is the one line shown."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (`docker stop`, a k8s eviction, `kill`): a crawl stops as on Ctrl-C."""


class StopRequest:
    """Ctrl-C or SIGTERM, noted by the signal handler and acted on where the crawl looks for it.

    Raised from the handler, the KeyboardInterrupt lands in whatever runs at that moment, and
    inside a client library (Redis, PostgreSQL) it can be lost there: the crawl then went on and
    started again the processes the same Ctrl-C had stopped. So the handler only notes the
    signal, and `raise_if_stopped()` raises at a point the crawl controls."""

    def __init__(self) -> None:
        self.signals: list[int] = []  # a list, not an Event: its lock may be the main thread's

    def raise_if_stopped(self) -> None:
        if self.signals:
            raise Terminated if self.signals[0] == signal.SIGTERM else KeyboardInterrupt


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[StopRequest]:
    """While inside, Ctrl-C and SIGTERM are noted in the StopRequest yielded, which raises
    KeyboardInterrupt (Terminated for SIGTERM) when asked: the crawl stops the same way for both.
    A stop noted once the crawl is done and stopping changes nothing."""
    request = StopRequest()
    with stop_signals_call(_nothing, request.signals):
        yield request


def _nothing() -> None:
    pass


@contextlib.contextmanager
def stop_signals_ignored() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM must not cut a stop short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class Processes:
    log_dir: Path
    env: dict[str, str]
    say: Callable[[str], None] = _to_stderr
    policy: Callable[[], RestartPolicy] = RestartPolicy
    running: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    given_up: dict[str, int] = field(default_factory=dict)  # name -> its last exit code
    _commands: dict[str, tuple[list[str], dict[str, str]]] = field(default_factory=dict)
    _policies: dict[str, RestartPolicy] = field(default_factory=dict)
    _restart_at: dict[str, float] = field(default_factory=dict)
    _logs: list[IO[bytes]] = field(default_factory=list)

    def start(
        self, name: str, module: str, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """Start `python -m module args` as `name`, in `env` (default: the crawl's)."""
        self._commands[name] = ([sys.executable, "-m", module, *args], dict(self.env if env is None else env))
        self._policies[name] = self.policy()
        return self._launch(name)

    def adopt(self, name: str, process: subprocess.Popen[bytes]) -> None:
        """A process started elsewhere, stopped with the others but never started again."""
        self.running[name] = process

    def log_of(self, name: str) -> Path:
        return self.log_dir / f"{name}.log"

    def _launch(self, name: str) -> subprocess.Popen[bytes]:
        log = self.log_of(name).open("ab")  # a restart writes on below its predecessor's lines
        self._logs.append(log)
        command, env = self._commands[name]  # a restart gets the environment of the first start
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.running[name] = process
        return process

    def supervise(self) -> None:
        """Start again what is due; note what died since the last call. Raises CrawlFailed when
        the crawl cannot go on: every worker, or another process, has stopped for good."""
        now = time.monotonic()
        for name, at in list(self._restart_at.items()):
            if now >= at:
                del self._restart_at[name]
                self._launch(name)
                self.say(f"{name} started again")
        for name, process in self.running.items():
            code = process.poll()
            if (
                code is None
                or name not in self._commands
                or name in self._restart_at
                or name in self.given_up
            ):
                continue
            last_words = last_line(self.log_of(name)) or "(its log is empty)"
            delay = self._policies[name].after_exit()
            if delay is None:
                self.given_up[name] = code
                history = self._policies[name].describe_giving_up()
                self.say(
                    f"{name} keeps dying ({history}, last {exit_text(code)}: {last_words}); "
                    f"not starting it again; see {self.log_of(name)}"
                )
            else:
                self.say(f"{name} {exit_text(code)}: {last_words}; starting it again in {delay:.1f} s")
                self._restart_at[name] = now + delay
        workers = [name for name in self._commands if self._is_worker(name)]
        if workers and all(name in self.given_up for name in workers):
            raise CrawlFailed(f"every worker keeps dying; see {self.log_dir}/")
        others = [name for name in self.given_up if not self._is_worker(name)]
        if others:
            raise CrawlFailed(f"{others[0]} keeps dying; see {self.log_of(others[0])}")

    check_alive = supervise

    def _is_worker(self, name: str) -> bool:
        return self._commands[name][0][2] == "worker"

    def stop_all(self, signalled_too: bool = False) -> dict[str, int | None]:
        """SIGTERM every process still running and wait for them (SIGKILL after STOP_TIMEOUT_S).
        `signalled_too`: they had the same signal as the crawl (Ctrl-C reaches the terminal's
        whole process group) and are stopping already: give them ALREADY_STOPPING_S first, so
        that a SIGTERM does not land in an interpreter's last moments, when Python has put the
        default handlers back and the signal kills it."""
        self._restart_at.clear()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        if signalled_too:
            own_stop = time.monotonic() + ALREADY_STOPPING_S
            while time.monotonic() < own_stop and any(p.poll() is None for p in self.running.values()):
                time.sleep(0.05)
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes: dict[str, int | None] = {}
        for name, process in self.running.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = None
        for log in self._logs:
            log.close()
        self._logs.clear()
        return codes


def exit_text(code: int) -> str:
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def last_line(path: Path) -> str:
    """The last non-empty line of a log: a process's one-line error, or its last words."""
    try:
        with path.open("rb") as log:
            log.seek(0, 2)
            log.seek(max(0, log.tell() - _TAIL_BYTES))
            tail = log.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return lines[-1] if lines else ""
