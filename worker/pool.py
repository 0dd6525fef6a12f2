"""Several worker processes forked from one that has done the imports once.

A worker process spends about half a CPU-second starting: the interpreter, then psycopg with
its libpq, lxml, BeautifulSoup, requests, redis and pika. With `WORKER_PROCESSES=N` (or
`--processes N`) one process pays that and forks N workers that start with everything loaded
and share those pages until they write to them. On a machine with several cores that is one
container (or one systemd unit) in place of N.

The parent only supervises, asleep until a signal (a worker ended, a stop) or a restart is
due. It forwards SIGTERM and SIGINT to the workers, which finish their messages in flight as a
lone worker does. A worker that ends on its own (killed, out of memory,
a crash) is forked again after a pause that grows with each death (shared/supervision.py);
the broker has already given back whatever it held, and the others go on working meanwhile. A
worker that keeps dying (more than 5 times within 60 s: a setting or a service that a restart
will not fix) is not forked again: the parent logs one line naming it, stops the others and
exits with that worker's code (128 + the signal for a worker killed by one), so that a restart
policy around the pool (compose, Kubernetes, systemd) sees the failure.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import select
import signal
import sys
import time
from collections.abc import Callable, Iterator

from shared.supervision import RestartPolicy

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def run_pool(
    processes: int,
    serve: Callable[[int], int],
    name_of: Callable[[int], str] = lambda index: f"worker {index}",
    policy: Callable[[], RestartPolicy] = RestartPolicy,
) -> int:
    """Fork `processes` workers, each running serve(its index), and keep them running until a
    stop signal (or one of them keeps crashing); return the exit code."""
    # Objects made so far (the imported modules) are never collected: frozen, the collector in
    # each worker leaves them alone instead of touching, and so copying, their shared pages.
    gc.freeze()
    pool = _Pool(processes, serve, name_of, policy)
    signal.signal(signal.SIGTERM, pool.stop_all)
    signal.signal(signal.SIGINT, pool.stop_all)
    with _signals_wake() as pipe:
        pool.wake_pipe = pipe
        for index in range(processes):
            pool.fork(index)
        log.info("worker pool of %d processes started: %s", processes, ", ".join(map(str, pool.children)))
        return pool.supervise()


@contextlib.contextmanager
def _signals_wake() -> Iterator[tuple[int, int]]:
    """A pipe that every signal with a Python handler writes a byte to, SIGCHLD included: the
    parent sleeps on it, until a worker ends or a stop comes, instead of looking every so often
    (ten times a second, for hours of a polite crawl). Yields (read end, write end)."""
    reader, writer = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    previous_chld = signal.signal(signal.SIGCHLD, _ignore)  # a Python handler, so that it writes
    previous_fd = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    try:
        yield reader, writer
    finally:
        signal.set_wakeup_fd(previous_fd)
        signal.signal(signal.SIGCHLD, previous_chld)
        os.close(reader)
        os.close(writer)


def _ignore(_signum: int, _frame: object) -> None:
    pass


class _Pool:
    """The parent's view: which pid runs which worker, and when each dead one is due again."""

    def __init__(
        self,
        processes: int,
        serve: Callable[[int], int],
        name_of: Callable[[int], str],
        policy: Callable[[], RestartPolicy],
    ) -> None:
        self.serve = serve
        self.name_of = name_of
        self.parent = os.getpid()
        self.children: dict[int, int] = {}  # pid -> index
        self.policies = {index: policy() for index in range(processes)}
        self.restart_at: dict[int, float] = {}  # index -> monotonic time of its next fork
        self.wake_pipe = (-1, -1)  # the pipe signals write to (_signals_wake)
        self.stopping = False
        self.code = 0

    def stop_all(self, signum: int = signal.SIGTERM, _frame: object = None) -> None:
        self.stopping = True
        for pid in self.children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def fork(self, index: int) -> bool:
        # Held back across the fork: a stop arriving now waits until the parent knows this
        # worker's pid, and until the worker has put back the default handlers (it must not
        # run the parent's, which would stop its siblings).
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        if self.stopping:  # a stop that came after the caller looked: stop_all() has been and gone
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
            return False
        pid = os.fork()
        if pid == 0:
            os._exit(
                _serve_in_child(index, self.parent, self.serve, self.wake_pipe)
            )  # never back into the parent's frames
        self.children[pid] = index
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        return True

    def supervise(self) -> int:
        """Reap and restart workers until all have ended after a stop; return the exit code."""
        while self.children or (self.restart_at and not self.stopping):
            if not self.stopping:
                self._fork_those_due()
            pid, status = _reap()
            if pid == 0:
                self._sleep()
                continue
            self._ended(pid, status)
        return self.code

    def _sleep(self) -> None:
        """Until a signal comes (a worker ended, a stop) or the next restart is due."""
        due = None if self.stopping or not self.restart_at else min(self.restart_at.values())
        timeout = None if due is None else max(0.0, due - time.monotonic())
        reader = self.wake_pipe[0]
        select.select([reader], [], [], timeout)
        # Emptied before the next look for ended workers: a signal after this writes again.
        with contextlib.suppress(BlockingIOError):
            while os.read(reader, 512):
                pass

    def _fork_those_due(self) -> None:
        for index, at in list(self.restart_at.items()):
            if time.monotonic() >= at:
                del self.restart_at[index]
                if self.fork(index):
                    log.info("%s started again", self.name_of(index))

    def _ended(self, pid: int, status: int) -> None:
        index = self.children.pop(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        worker_code = 128 - exit_code if exit_code < 0 else exit_code
        if self.stopping:
            self.code = self.code or worker_code
            return
        delay = self.policies[index].after_exit()
        if delay is None:
            log.error(
                "%s keeps dying (%s, last with code %d): not starting it again, and stopping the "
                "pool; its own lines in this log, just above, say why",
                self.name_of(index),
                self.policies[index].describe_giving_up(),
                worker_code,
            )
            self.code = worker_code
            self.stop_all()
            return
        log.warning(
            "%s (pid %d) ended with code %d; starting it again in %.1f s",
            self.name_of(index),
            pid,
            worker_code,
            delay,
        )
        self.restart_at[index] = time.monotonic() + delay


def _reap() -> tuple[int, int]:
    """(pid, wait status) of a child that ended, or (0, 0) when none has."""
    try:
        return os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:  # no children left right now (all waiting to be forked again)
        return 0, 0


def _serve_in_child(index: int, parent: int, serve: Callable[[int], int], wake_pipe: tuple[int, int]) -> int:
    code = 1
    try:
        _forget_wake_pipe(wake_pipe)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
        _die_with(parent)
        code = serve(index)
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        log.exception("worker %d failed", index)
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
    return code


def _forget_wake_pipe(pipe: tuple[int, int]) -> None:
    """In a new worker: its signals are its own, not news for the parent."""
    signal.set_wakeup_fd(-1)
    for fd in pipe:
        with contextlib.suppress(OSError):
            os.close(fd)


def _die_with(parent: int) -> None:
    """Ask Linux for a SIGTERM when the parent dies (say, SIGKILLed): no worker outlives the pool."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)
