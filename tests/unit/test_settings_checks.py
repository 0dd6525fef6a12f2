"""Settings that cannot work are refused in one line, with passwords masked."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from shared.errors import ConfigError
from shared.settings import AT_LEAST_ONE, CHOICES, NAME_SETTINGS, NOT_NEGATIVE, POSITIVE, Settings, redact


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("amqp://guest:guest@127.0.0.1:5672/%2f", "amqp://guest:***@127.0.0.1:5672/%2f"),
        ("mysql://x:s3cret@host/db", "mysql://x:***@host/db"),
        ("amqp://u:p@ss@host/x", "amqp://u:***@host/x"),
        ("postgresql://h/db?password=s3cret&x=1", "postgresql://h/db?password=***&x=1"),
        ("host=a password=s3cret dbname=x", "host=a password=*** dbname=x"),
        ("redis://:s3cret@h:notaport/0", "redis://:***@h:notaport/0"),
        ("notaurl", "notaurl"),
    ],
)
def test_redact_masks_passwords_even_in_urls_that_do_not_parse(url: str, shown: str) -> None:
    assert redact(url) == shown


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DATABASE_URL", "mysql://x:s3cret@127.0.0.1/db"),
        ("AMQP_URL", "notaurl"),
        ("AMQP_URL", "amqp://u:s3cret@127.0.0.1:5672/%2f?heartbeat=often"),
        ("REDIS_URL", "bogus"),
        ("FETCH_DEADLINE_S", "nan"),
        ("RETRY_DELAYS_S", "1,inf"),
        ("LOG_LEVEL", "LOUD"),
        ("HEARTBEAT_S", "-1"),
        ("POLITENESS_FILE", "/etc"),
        ("DATABASE_POOLER", "session"),  # session pooling needs nothing: say none
    ],
)
def test_a_bad_setting_names_itself_and_hides_the_password(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({variable: value})
    assert str(caught.value).startswith(variable) and "s3cret" not in str(caught.value)


def test_good_service_urls_pass() -> None:
    Settings.from_env(
        {
            "DATABASE_URL": "host=127.0.0.1 dbname=crawler user=postgres",
            "REDIS_URL": "unix:///run/redis.sock",
            "AMQP_URL": "amqps://u:p@rabbit.internal:5671/vhost?heartbeat=10",
        }
    )
    Settings.from_env({"DATABASE_URL": "postgresql:///crawler"})  # a local socket: no host


# One value just past each bound, and one outside each set of choices.
JUST_WRONG = [
    *((name, 0) for name in AT_LEAST_ONE),
    *((name, 0) for name in POSITIVE),
    *((name, -1) for name in NOT_NEGATIVE),
    *((name, "other") for name in CHOICES),
    *((name, "a b") for name in NAME_SETTINGS),
]


@pytest.mark.parametrize(("name", "value"), JUST_WRONG)
def test_every_value_checked_setting_refuses_a_value_past_its_bound(name: str, value: Any) -> None:
    with pytest.raises(ConfigError) as caught:
        dataclasses.replace(Settings(), **{name: value}).validate()
    assert str(caught.value).startswith(f"{name.upper()}: ") and "\n" not in str(caught.value)
