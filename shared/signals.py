"""Acting on a signal without waiting on a lock from inside its handler.

A Python signal handler runs on the main thread between two of its bytecodes, maybe while that
thread holds a lock: the one inside a threading.Event that it is setting or waiting on, for
example when Ctrl-C (to the whole process group) and the supervisor's SIGTERM arrive together.
A handler that then takes the same lock waits for itself forever. Handlers here hand such work
to a short thread of its own instead.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator


def off_the_handler(action: Callable[[], None]) -> None:
    """Run `action` (an Event's set(), say) on a new thread, so the handler never blocks on it."""
    threading.Thread(target=action, name="signal-action", daemon=True).start()


@contextlib.contextmanager
def stop_signals_call(action: Callable[[], None], received: list[int]) -> Iterator[None]:
    """While inside, SIGTERM and SIGINT append their number to `received` and run `action` off
    the handler, instead of ending the process; the previous handlers come back on the way out.
    Off the main thread, where handlers cannot be set, it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        off_the_handler(action)

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
