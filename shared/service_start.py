"""How a service that runs as one process or as a pool of forked ones starts and stops:
`python -m worker` and `python -m renderer`.

With one process, it names itself by WORKER_ID in its log lines and serves. With N, the
process that did the imports logs as `<id>-pool`, does once what every member would otherwise
do again (the schema, checks that fail the same way in each), then forks N members through the
service's pool runner (worker/pool.py). Each member clears the parent's log handler, takes an
id (`<id>-<index>`) and a metrics port (METRICS_PORT + index) of its own, and serves with the
schema already in place. A member's configuration mistake or unreachable service ends that
member with exit code 2 and one line, as it would a lone process (shared/cli.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import resource
from collections.abc import Callable
from typing import Protocol

from shared.cli import configure_logging, exit_code_of
from shared.errors import ConfigError
from shared.settings import Settings


class Serve(Protocol):
    """A service's serve(): consume until stopped, return the exit code. `schema_ready` when
    the pool's parent has already ensured the schema."""

    def __call__(self, settings: Settings, *, schema_ready: bool = False) -> int: ...


class PoolRunner(Protocol):
    """worker.pool.run_pool's shape: fork `processes` members, each running serve(its index),
    supervise them until stopped, return the exit code."""

    def __call__(self, processes: int, serve: Callable[[int], int], name_of: Callable[[int], str]) -> int: ...


@dataclasses.dataclass(frozen=True)
class PooledService:
    """One service's start-up: its name (in log lines, error lines and the pool's names of its
    members), how it serves, what runs its pool, and what the pool's parent does once."""

    name: str
    serve: Serve
    run_pool: PoolRunner
    before_fork: Callable[[Settings], None]

    def start(self, settings: Settings, processes: int) -> int:
        if processes == 1:
            configure_logging(settings.log_level, self.name, settings.log_format, settings.worker_id)
            return self.serve(settings)
        configure_logging(settings.log_level, self.name, settings.log_format, f"{settings.worker_id}-pool")
        self.before_fork(settings)
        return self.run_pool(
            processes,
            lambda index: exit_code_of(
                self.name, lambda: self.serve(self.member(settings, index), schema_ready=True)
            ),
            name_of=lambda index: f"{self.name} {settings.worker_id}-{index}",
        )

    def member(self, settings: Settings, index: int) -> Settings:
        """Member `index` of a pool: an id of its own, and the metrics port after the one before;
        its log lines name it, not the pool."""
        member = member_settings(settings, index)
        logging.getLogger().handlers.clear()  # the parent's, which name the pool
        configure_logging(member.log_level, self.name, member.log_format, member.worker_id)
        return member


def add_processes_argument(
    parser: argparse.ArgumentParser, service: str, setting: str, each_has: str
) -> None:
    """--processes N, the command line's word for `setting` (WORKER_PROCESSES, ...)."""
    parser.add_argument(
        "--processes",
        type=int,
        help=f"{service} processes, forked after start-up by one that supervises them (default: "
        f"{setting}, 1); each has its own {each_has}",
    )


# The command line's word for each setting it can give: an error names what the user typed.
FLAGS = {
    "fetch_concurrency": "--concurrency",
    "render_concurrency": "--concurrency",
    "worker_processes": "--processes",
    "renderer_processes": "--processes",
    "worker_queues": "--queues",
}


def with_command_line(settings: Settings, **given: object) -> Settings:
    """The settings from the environment with the values the command line gave (None: not
    given), checked again: a bad --processes is one line naming --processes, as a bad
    WORKER_PROCESSES is one naming WORKER_PROCESSES."""
    changed = settings
    for name, value in given.items():
        if value is None:
            continue
        changed = dataclasses.replace(changed, **{name: value})  # type: ignore[arg-type]
        try:
            changed.validate()  # the environment's values passed already: a failure is this one's
        except ConfigError as exc:
            variable, _, problem = str(exc).partition(": ")
            raise ConfigError(f"{FLAGS.get(name, variable)}: {problem}") from None
    return changed


def member_settings(settings: Settings, index: int) -> Settings:
    return dataclasses.replace(
        settings,
        worker_id=f"{settings.worker_id}-{index}",
        metrics_port=settings.metrics_port + index if settings.metrics_port else 0,
    )


def log_stopped(log: logging.Logger, service: str, worker_id: str) -> None:
    """The last line a serving process logs: what it cost at its peak, and in all."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    log.info(
        "%s %s stopped: peak_rss_mb=%.1f cpu_s=%.2f",
        service,
        worker_id,
        usage.ru_maxrss / 1024,
        usage.ru_utime + usage.ru_stime,
    )
