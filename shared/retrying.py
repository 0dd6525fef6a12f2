"""The one retry policy for calls that wait out an outage of RabbitMQ, Redis or PostgreSQL.

Every such loop pauses 1 s, then 2, 4, 8 and 15 s at most between tries (`BACKOFF`), tries again
only on the errors it names, and, once it gives up, raises the last error itself rather than
tenacity's RetryError, so callers keep catching ServiceUnavailable and the like. What differs
from loop to loop is when it gives up (a stop Event, a deadline, a sum of pauses), what it sleeps
with, and its log line: those are the arguments.

A loop that must stop promptly passes `sleep=event.wait`: a stop request then cuts the pause
short, and a stop condition that looks at the same Event ends the loop before its next pause.
"""

from __future__ import annotations

from collections.abc import Callable

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential
from tenacity.stop import StopBaseT

FIRST_PAUSE_S = 1.0
MAX_PAUSE_S = 15.0
# Attempt n is followed by a pause of FIRST_PAUSE_S * 2**(n-1), at most MAX_PAUSE_S.
BACKOFF = wait_exponential(multiplier=FIRST_PAUSE_S, max=MAX_PAUSE_S)

OnPause = Callable[[BaseException, float], None]  # the error just met, the pause about to start


def patiently(
    retry_on: type[BaseException] | tuple[type[BaseException], ...],
    stop: StopBaseT,
    sleep: Callable[[float], object],
    on_pause: OnPause,
) -> Retrying:
    """A Retrying that tries a call again after `retry_on` errors, with BACKOFF pauses taken by
    `sleep`, until `stop` says so; then the last error is raised. `on_pause` logs each pause."""

    def before_sleep(state: RetryCallState) -> None:
        assert state.outcome is not None  # tenacity only sleeps after an attempt
        error = state.outcome.exception()
        assert error is not None  # only errors are retried here
        on_pause(error, state.upcoming_sleep)

    return Retrying(
        retry=retry_if_exception_type(retry_on),
        stop=stop,
        wait=BACKOFF,
        sleep=sleeping_with(sleep),
        before_sleep=before_sleep,
        reraise=True,
    )


def stop_after_pausing(limit_s: float) -> Callable[[RetryCallState], bool]:
    """Give up once the pauses taken add up to `limit_s`. Counts the pauses, not the time the
    attempts took: an attempt that hangs on a connect timeout does not shorten the wait."""
    return lambda state: state.idle_for >= limit_s


def stop_before(deadline: float, clock: Callable[[], float]) -> Callable[[RetryCallState], bool]:
    """Give up when the next pause would end after `deadline`, read on `clock`."""
    return lambda state: clock() + state.upcoming_sleep > deadline


def sleeping_with(sleep: Callable[[float], object]) -> Callable[[float], None]:
    """`sleep` as tenacity takes it; what it returns (Event.wait's flag, say) is dropped."""

    def pause(seconds: float) -> None:
        sleep(seconds)

    return pause
