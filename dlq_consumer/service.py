"""The consuming side: every message in the dead-letter queue becomes a row, then is acked.

The ack waits for the commit: a message whose row was not committed stays in the queue. Rejecting
here would lose it for good (the dead-letter queue has nowhere further to send it), so a database
that cannot be reached raises ServiceUnavailable and the runtime retries the same message. A row
PostgreSQL refuses for its data (`db.is_data_error`) is stored in bounded form instead
(`record.bounded_record`): retrying it would only park the queue behind it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dlq_consumer import store
from dlq_consumer.record import DeadLetterRecord, bounded_record, record_from_delivery
from shared.amqp.topology import dead_letter_queue
from shared.consumer import Delivery, Outcome, Subscription, run_consumers
from shared.metrics import DEAD_LETTERS, start_metrics_server
from shared.postgres import db
from shared.settings import Settings

log = logging.getLogger(__name__)

SERVICE_NAME = "dlq-consumer"

Connect = Callable[[Settings], store.RecordWriter]


class DeadLetterRecorder:
    """The handler: one database connection, opened on first use and reopened after a loss.
    Runs on one handler thread (concurrency 1), so the connection is never shared."""

    def __init__(self, settings: Settings, connect: Connect = db.connect) -> None:
        self._settings = settings
        self._connect = connect
        self._conn: store.RecordWriter | None = None

    def __call__(self, delivery: Delivery) -> Outcome:
        record = record_from_delivery(delivery, self._settings.crawl_namespace)
        try:
            self._store(record)
        except Exception as exc:
            if not db.is_data_error(exc):
                raise
            log.warning(
                "PostgreSQL refused dead letter %s: %s; storing it bounded",
                record.url[:200],
                db.error_line(exc),
            )
            record = bounded_record(record, db.error_line(exc))
            self._store(record)
        # Counted once committed, like the row: a delivery that fails here is counted on its retry.
        DEAD_LETTERS.labels(record.reason).inc()
        log.info(
            "dead letter %s run=%s reason=%s attempts=%d replays=%d",
            record.url[:200],
            record.run_id[:64],
            record.reason,
            record.attempts,
            record.replays,
        )
        return Outcome.done()

    def close(self) -> None:
        self._discard_connection()

    def _store(self, record: DeadLetterRecord) -> None:
        try:
            with db.translate(self._settings):
                conn = self._connection()
                store.upsert(conn, record)
                conn.commit()
        except BaseException:
            self._discard_connection()  # it may be mid-transaction or broken: start clean
            raise

    def _connection(self) -> store.RecordWriter:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect(self._settings)
        return self._conn

    def _discard_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection can fail; there is nothing to keep
                log.debug("closing a broken database connection failed", exc_info=True)


def consume(settings: Settings) -> int:
    """Run the dead-letter consumer until SIGTERM/SIGINT; return the exit code."""
    db.ensure_schema(settings)
    start_metrics_server(settings)
    recorder = DeadLetterRecorder(settings)
    try:
        return run_consumers(
            settings,
            SERVICE_NAME,
            [Subscription(dead_letter_queue(settings.crawl_namespace))],
            recorder,
            concurrency=1,
        )
    finally:
        recorder.close()
