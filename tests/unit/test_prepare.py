"""`make test`'s preparation of the local services, with a fake broker and clock."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

from tests.fakes import FakeTime
from tests.prepare import PLUGIN, prepare_management_api


class Broker:
    """The management plugin: off until enabled, then answering after `answers_after` asks."""

    def __init__(self, enabled: bool = False, answers_after: int = 0, exit_code: int = 0) -> None:
        self.enabled = enabled
        self.answers_after = answers_after
        self.exit_code = exit_code
        self.commands: list[list[str]] = []

    def answers(self) -> bool:
        if not self.enabled:
            return False
        if self.answers_after > 0:
            self.answers_after -= 1
            return False
        return True

    def run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        self.commands.append(list(argv))
        if self.exit_code == 0:
            self.enabled = True
        return subprocess.CompletedProcess(
            argv, self.exit_code, "", "Error: unable to perform an operation\n"
        )


def prepare(broker: Broker, tool: str | None = "/usr/sbin/rabbitmq-plugins") -> tuple[bool, str]:
    clock = FakeTime()
    return prepare_management_api(
        broker.answers, lambda _name: tool, broker.run, clock.sleep, clock, wait_s=10
    )


def test_an_api_that_answers_is_left_alone() -> None:
    broker = Broker(enabled=True)

    assert prepare(broker) == (True, "the RabbitMQ management API answers")
    assert broker.commands == []


def test_an_off_plugin_is_enabled_and_waited_for() -> None:
    broker = Broker(answers_after=3)

    ok, said = prepare(broker)

    assert ok
    assert broker.commands == [["/usr/sbin/rabbitmq-plugins", "enable", "--quiet", PLUGIN]]
    assert said == f"enabled {PLUGIN}; the management API answers"


def test_without_rabbitmq_plugins_it_says_why_the_tests_will_skip() -> None:
    broker = Broker()

    ok, said = prepare(broker, tool=None)

    assert not ok
    assert broker.commands == []
    assert "rabbitmq-plugins is not on PATH" in said and "skipped" in said


def test_a_failing_enable_is_reported_with_its_own_message() -> None:
    ok, said = prepare(Broker(exit_code=69))

    assert not ok
    assert "exit 69: Error: unable to perform an operation" in said


def test_an_api_that_never_comes_up_is_given_up_on_after_the_wait() -> None:
    ok, said = prepare(Broker(answers_after=1_000))

    assert not ok
    assert "did not answer within 10 s" in said
