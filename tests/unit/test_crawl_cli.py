"""python -m ops.crawl's command line: what reaches the producer, and mistakes caught early."""

from __future__ import annotations

import pytest

from ops.crawl import main, parse_args, producer_arguments
from shared.errors import ConfigError


def test_inputs_and_recrawl_of_are_passed_on_to_the_producer() -> None:
    args = parse_args(["--sitemap", "https://a.test/s.xml", "--urls", "u.txt", "--recrawl-of", "run-1"])
    assert producer_arguments(args) == [
        "--sitemap",
        "https://a.test/s.xml",
        "--urls",
        "u.txt",
        "--recrawl-of",
        "run-1",
    ]


def test_no_recrawl_of_adds_nothing() -> None:
    assert producer_arguments(parse_args(["--site", "https://a.test/"])) == ["--site", "https://a.test/"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nothing to crawl"),
        (["--sitemap", "https://a.test/s.xml", "--workers", "0"], "--workers"),
        (["--sitemap", "https://a.test/s.xml", "--progress-every", "0"], "--progress-every"),
    ],
)
def test_mistakes_are_config_errors_before_anything_starts(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        main(argv)
