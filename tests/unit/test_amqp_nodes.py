"""AMQP_URL naming several nodes of a cluster: each is checked, each becomes a pika parameter set,
and connections spread over them."""

from __future__ import annotations

from typing import Any

import pytest

from ops.management import amqp_part
from shared.amqp.broker import connection_parameters
from shared.errors import ConfigError
from shared.settings import Settings, amqp_urls, redact

THREE = (
    "amqp://guest:s3cret@127.0.0.1:5681/%2f, amqp://guest:s3cret@127.0.0.1:5682/%2f,"
    "amqp://guest:s3cret@127.0.0.1:5683/%2f"
)


def keep(_params: list[Any]) -> None:
    """The order AMQP_URL gives."""


def reverse(params: list[Any]) -> None:
    params.reverse()


def test_a_list_splits_on_commas_and_ignores_blanks() -> None:
    assert amqp_urls(" amqp://a/ ,amqp://b/,,") == ["amqp://a/", "amqp://b/"]
    assert amqp_urls("amqp://guest:guest@127.0.0.1:5672/%2f") == ["amqp://guest:guest@127.0.0.1:5672/%2f"]


def test_several_nodes_are_accepted_and_each_becomes_parameters_in_the_order_given() -> None:
    settings = Settings.from_env({"AMQP_URL": THREE, "HEARTBEAT_S": "7"})
    params = connection_parameters(settings, "test", keep)
    assert [(p.host, p.port) for p in params] == [
        ("127.0.0.1", 5681),
        ("127.0.0.1", 5682),
        ("127.0.0.1", 5683),
    ]
    assert all(p.heartbeat == 7 and p.client_properties == {"connection_name": "test"} for p in params)
    assert [p.port for p in connection_parameters(settings, "test", reverse)] == [5683, 5682, 5681]


def test_the_default_order_is_shuffled_but_keeps_every_node() -> None:
    settings = Settings.from_env({"AMQP_URL": THREE})
    orders = {tuple(p.port for p in connection_parameters(settings, "test")) for _ in range(60)}
    assert all(sorted(order) == [5681, 5682, 5683] for order in orders)
    assert len(orders) > 1  # 60 draws of 6 orders all alike: odds about 1 in 10^46


@pytest.mark.parametrize(
    "value",
    [
        "amqp://guest:s3cret@127.0.0.1:5681/%2f,http://guest:s3cret@127.0.0.1:5682/",
        "amqp://guest:s3cret@127.0.0.1:5681/%2f,amqp://guest:s3cret@127.0.0.1:notaport/",
        "amqp://guest:s3cret@127.0.0.1:5681/%2f,amqp://guest:s3cret@127.0.0.1:5682/%2f?heartbeat=often",
        " , ",
    ],
)
def test_one_bad_node_refuses_the_list_in_one_line_without_passwords(value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"AMQP_URL": value})
    message = str(caught.value)
    assert message.startswith("AMQP_URL") and "s3cret" not in message and "\n" not in message


def test_every_password_of_the_list_is_masked() -> None:
    assert "s3cret" not in redact(THREE) and redact(THREE).count("***") == 3


def test_the_management_api_credentials_come_from_the_first_node() -> None:
    settings = Settings.from_env(
        {"AMQP_URL": "amqp://ann:pw@127.0.0.1:5681/v1,amqp://bob:x@127.0.0.1:5682/v2"}
    )
    assert (amqp_part(settings, "user"), amqp_part(settings, "password"), amqp_part(settings, "vhost")) == (
        "ann",
        "pw",
        "v1",
    )
