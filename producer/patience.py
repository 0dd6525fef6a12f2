"""How the producer waits: for RabbitMQ or Redis to come back, and between publishes the broker
refused.

When RabbitMQ or Redis goes away (a restart, a lost connection), nothing is given up at once:
each call that needs them is tried again with a growing pause for up to `patience_s`, and once
that runs out, every later call fails at once. Only a refusal by the broker (a nack, an
unroutable message) uses up one of the PUBLISH_ATTEMPTS, a growing pause apart: a cluster
without a majority nacks until it has one again. A stop request ends the waiting at once.

Apart from the loop (producer/pipeline.py) and the batches it has in flight
(producer/in_flight.py), which both wait this way and share one Patience: the policy is tuned
against outages, the flow against throughput.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_attempt, wait_exponential

from shared import retrying
from shared.errors import ServiceUnavailable

# The producer's log lines keep the logger they have always had, whichever of its modules writes
# them: log filters and alerts select on it (the `logger` of docs/OPERATING.md's JSON logs).
log = logging.getLogger("producer.pipeline")

T = TypeVar("T")

# The first try and seven retries, the pause doubling from RETRY_PAUSE_S up to
# MAX_RECONNECT_PAUSE_S: about a minute. A quorum queue that has lost its majority (two nodes of
# three down) nacks every publish until a majority is back, which takes a node's restart; three
# attempts a second apart ran out within 4 s (docs/SCALING.md, "RabbitMQ cluster").
PUBLISH_ATTEMPTS = 8
RETRY_PAUSE_S = 1.0
# How long to wait for an unreachable RabbitMQ or Redis before giving up. The claims stay ours
# meanwhile as long as the heartbeat reaches Redis (producer/liveness.py).
RECONNECT_PATIENCE_S = 240.0
MAX_RECONNECT_PAUSE_S = retrying.MAX_PAUSE_S


class Patience:
    """The producer's waits for one run: once patience has run out for one call, every later
    call fails at once."""

    def __init__(
        self,
        clock: Callable[[], float],
        sleep: Callable[[float], object],
        should_stop: Callable[[], bool],
        patience_s: float,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._should_stop = should_stop
        self._patience_s = patience_s
        self._gave_up = False  # patience ran out once: later calls fail at once

    def call(self, what: str, call: Callable[[], T]) -> T:
        """`call()`, tried again with a growing pause while RabbitMQ or Redis is unreachable.
        Raises its ServiceUnavailable once patience runs out, or at once after a stop request."""
        next_pause_too_late = retrying.stop_before(self._clock() + self._patience_s, self._clock)

        def give_up(state: RetryCallState) -> bool:
            if self._gave_up or self._should_stop() or next_pause_too_late(state):
                self._gave_up = True  # later calls fail at once
            return self._gave_up

        def on_pause(error: BaseException, pause_s: float) -> None:
            log.warning("%s: %s; trying again in %.0f s", what, error, pause_s)

        return retrying.patiently(ServiceUnavailable, give_up, self._sleep, on_pause)(call)

    def publish_attempts(self) -> Retrying:
        """Up to PUBLISH_ATTEMPTS tries, the pause doubling from RETRY_PAUSE_S, while some
        publishes of a batch are not confirmed (each try's result: the indexes of those); then the
        rest are given up."""

        def before_retry(state: RetryCallState) -> None:
            assert state.outcome is not None
            unconfirmed = len(state.outcome.result())
            next_attempt = state.attempt_number + 1
            log.warning(
                "%d publishes not confirmed: attempt %d of %d", unconfirmed, next_attempt, PUBLISH_ATTEMPTS
            )

        return Retrying(
            retry=retry_if_result(bool),
            stop=stop_after_attempt(PUBLISH_ATTEMPTS),
            wait=wait_exponential(multiplier=RETRY_PAUSE_S, max=MAX_RECONNECT_PAUSE_S),
            sleep=retrying.sleeping_with(self._sleep),
            before_sleep=before_retry,
            retry_error_callback=lambda _state: None,  # what is still unconfirmed is settled as failed
        )
