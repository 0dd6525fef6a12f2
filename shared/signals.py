"""Acting on a signal without waiting on a lock from inside its handler.

A Python signal handler runs on the main thread between two of its bytecodes, maybe while that
thread holds a lock: the one inside a threading.Event that it is setting or waiting on, for
example when Ctrl-C (to the whole process group) and the supervisor's SIGTERM arrive together.
A handler that then takes the same lock waits for itself forever. Handlers here hand such work
to a short thread of its own instead.
"""

from __future__ import annotations

import threading
from collections.abc import Callable


def off_the_handler(action: Callable[[], None]) -> None:
    """Run `action` (an Event's set(), say) on a new thread, so the handler never blocks on it."""
    threading.Thread(target=action, name="signal-action", daemon=True).start()
