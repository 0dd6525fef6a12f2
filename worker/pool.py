"""Several worker processes forked from one that has done the imports once.

A worker process spends about half a CPU-second starting: the interpreter, then psycopg with
its libpq, lxml, BeautifulSoup, requests, redis and pika. With `WORKER_PROCESSES=N` (or
`--processes N`) one process pays that and forks N workers that start with everything loaded
and share those pages until they write to them. On a machine with several cores that is one
container (or one systemd unit) in place of N.

The parent only supervises. It forwards SIGTERM and SIGINT to the workers, which finish their
messages in flight as a lone worker does. When one worker ends for any reason, the parent stops
the others and exits with that worker's code (128 + the signal for a worker killed by one): the
pool lives and dies as one, so a restart policy sees a failure exactly as it would from a
single worker, and the broker gives back whatever the stopped workers held.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import signal
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def run_pool(processes: int, serve: Callable[[int], int]) -> int:
    """Fork `processes` workers, each running serve(its index); wait for them; return the code."""
    # Objects made so far (the imported modules) are never collected: frozen, the collector in
    # each worker leaves them alone instead of touching, and so copying, their shared pages.
    gc.freeze()
    children: dict[int, int] = {}  # pid -> index
    stopping = False

    def stop_all(signum: int = signal.SIGTERM, _frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    parent = os.getpid()
    signal.signal(signal.SIGTERM, stop_all)
    signal.signal(signal.SIGINT, stop_all)
    for index in range(processes):
        # Held back across the fork: a stop arriving now waits until the parent knows this
        # worker's pid, and until the worker has put back the default handlers (it must not
        # run the parent's, which would stop its siblings).
        signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
        pid = os.fork()
        if pid == 0:
            os._exit(_serve_in_child(index, parent, serve))  # never back into the parent's frames
        children[pid] = index
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOP_SIGNALS)
    log.info("worker pool of %d processes started: %s", processes, ", ".join(map(str, children)))
    code = 0
    while children:
        pid, status = os.wait()  # retried by Python when a signal handler ran
        index = children.pop(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        worker_code = 128 - exit_code if exit_code < 0 else exit_code
        if not stopping:
            log.error("worker %d (pid %d) ended with code %d; stopping the pool", index, pid, worker_code)
            stop_all()
        code = code or worker_code
    return code


def _serve_in_child(index: int, parent: int, serve: Callable[[int], int]) -> int:
    code = 1
    try:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
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


def _die_with(parent: int) -> None:
    """Ask Linux for a SIGTERM when the parent dies (say, SIGKILLed): no worker outlives the pool."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)
