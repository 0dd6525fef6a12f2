"""The start-up both pooled services share (shared/service_start.py), with a fake serve and a
fake pool runner that calls each member's serve in this process instead of forking it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from shared.cli import EXIT_USER_ERROR
from shared.errors import ConfigError
from shared.service_start import PooledService, with_command_line
from shared.settings import Settings

SETTINGS = Settings(worker_id="w", metrics_port=9110)


@dataclass
class Served:
    calls: list[tuple[str, int, bool]] = field(default_factory=list)
    fail_member: str = ""

    def __call__(self, settings: Settings, *, schema_ready: bool = False) -> int:
        if settings.worker_id == self.fail_member:
            raise ConfigError("FETCH_CONCURRENCY: expected a whole number")
        self.calls.append((settings.worker_id, settings.metrics_port, schema_ready))
        return 0


@dataclass
class InlinePool:
    """Runs every member's serve here, one after another, and returns the last exit code."""

    names: list[str] = field(default_factory=list)
    codes: list[int] = field(default_factory=list)

    def __call__(self, processes: int, serve: Callable[[int], int], name_of: Callable[[int], str]) -> int:
        for index in range(processes):
            self.names.append(name_of(index))
            self.codes.append(serve(index))
        return self.codes[-1]


@pytest.fixture(autouse=True)
def root_handlers_kept() -> Iterator[None]:
    """configure_logging replaces the root logger's handlers; give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_one_process_serves_itself_and_ensures_its_own_schema() -> None:
    served, pool = Served(), InlinePool()
    prepared: list[Settings] = []
    service = PooledService("worker", served, pool, before_fork=prepared.append)
    assert service.start(SETTINGS, 1) == 0
    assert served.calls == [("w", 9110, False)]
    assert (pool.names, prepared) == ([], [])


def test_a_pool_prepares_once_then_each_member_has_an_id_and_port_of_its_own() -> None:
    served, pool = Served(), InlinePool()
    prepared: list[Settings] = []
    service = PooledService("renderer", served, pool, before_fork=prepared.append)
    assert service.start(SETTINGS, 3) == 0
    assert prepared == [SETTINGS]
    assert served.calls == [("w-0", 9110, True), ("w-1", 9111, True), ("w-2", 9112, True)]
    assert pool.names == ["renderer w-0", "renderer w-1", "renderer w-2"]


def test_without_a_metrics_port_no_member_gets_one() -> None:
    served = Served()
    PooledService("worker", served, InlinePool(), before_fork=lambda _: None).start(
        Settings(worker_id="w", metrics_port=0), 2
    )
    assert [port for _, port, _ in served.calls] == [0, 0]


def test_a_members_config_mistake_is_its_exit_code_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    served, pool = Served(fail_member="w-1"), InlinePool()
    PooledService("worker", served, pool, before_fork=lambda _: None).start(SETTINGS, 2)
    assert pool.codes == [0, EXIT_USER_ERROR]
    assert capsys.readouterr().err.strip() == "worker: error: FETCH_CONCURRENCY: expected a whole number"


def test_the_command_line_overrides_only_what_it_gives_and_is_checked() -> None:
    assert with_command_line(SETTINGS, fetch_concurrency=None) is SETTINGS
    changed = with_command_line(SETTINGS, fetch_concurrency=3, worker_processes=None)
    assert (changed.fetch_concurrency, changed.worker_processes) == (3, SETTINGS.worker_processes)
    with pytest.raises(ConfigError, match=r"^--processes: must be at least 1, got 0$"):
        with_command_line(SETTINGS, worker_processes=0)
    with pytest.raises(
        ConfigError, match=r"^--queues: expected some of priority,ttl,bulk, got 'priority,nope'$"
    ):
        with_command_line(SETTINGS, fetch_concurrency=3, worker_queues=("priority", "nope"))
    with pytest.raises(ConfigError, match=r"^--concurrency: must be at least 1, got 0$"):
        with_command_line(SETTINGS, render_concurrency=0)
