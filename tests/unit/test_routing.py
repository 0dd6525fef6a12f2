from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from producer.routing import Route, Router, load_router, parse_lastmod, parse_rules
from shared.errors import ConfigError

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC).timestamp()


@pytest.fixture(scope="module")
def default_router() -> Router:
    return load_router("")


@pytest.mark.parametrize(
    ("url", "sitemap_priority", "lastmod", "route"),
    [
        ("http://s/a", 0.8, None, Route("priority", 5)),
        ("http://s/a", 1.0, "2001-01-01", Route("priority", 5)),
        ("http://s/news/a", 0.9, None, Route("priority", 5)),  # first matching rule wins
        ("http://s/a", 0.5, "2025-06-01T02:00:00Z", Route("priority", 3)),
        ("http://s/a", None, "2025-06-01", Route("priority", 3)),  # date only: midnight UTC
        ("http://s/a", 0.79, "2025-05-30T12:00:00+00:00", Route("bulk", 0)),  # 48 h old
        ("http://s/news/today", 0.5, None, Route("ttl", 0)),
        ("http://s/live/match", None, "garbage", Route("ttl", 0)),
        ("http://s/newsletter/x", None, None, Route("bulk", 0)),
        ("http://s/a", None, None, Route("bulk", 0)),
        ("http://s/a", None, "2030-01-01", Route("bulk", 0)),  # far future lastmod: no jump
    ],
)
def test_default_rules(
    default_router: Router, url: str, sitemap_priority: float | None, lastmod: str | None, route: Route
) -> None:
    assert default_router.route(url, sitemap_priority, lastmod, NOW) == route


def test_rules_file_replaces_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rule]]\nqueue = "ttl"\nurl_pattern = "\\\\.pdf$"\n\n'
        '[[rule]]\nqueue = "priority"\nurl_pattern = "^https://"\nmessage_priority = 2\n'
    )
    router = load_router(str(path))
    assert router.source == str(path)
    assert router.route("http://s/doc.pdf", 1.0, None, NOW) == Route("ttl", 0)
    assert router.route("https://s/page", None, None, NOW) == Route("priority", 2)
    # Nothing matched: the bulk queue, whatever the sitemap said.
    assert router.route("http://s/page", 1.0, None, NOW) == Route("bulk", 0)


def test_a_rule_with_several_conditions_needs_all_of_them() -> None:
    (rule,) = parse_rules(
        b'[[rule]]\nqueue = "priority"\nmin_sitemap_priority = 0.5\nlastmod_within_h = 1\n'
        b"message_priority = 4\n",
        "t",
    )
    recent = datetime(2025, 6, 1, 11, 30, tzinfo=UTC)
    assert rule.matches("http://s/", 0.6, recent, NOW)
    assert not rule.matches("http://s/", 0.4, recent, NOW)
    assert not rule.matches("http://s/", 0.6, datetime(2025, 6, 1, 10, 0, tzinfo=UTC), NOW)
    assert not rule.matches("http://s/", 0.6, None, NOW)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[[rule]]\nqueue = "fast"\n', "rule 1: field 'queue': expected one of priority, ttl, bulk"),
        ('[[rule]]\nqueue = "bulk"\n[[rule]]\nurl_pattern = "x"\n', "rule 2: field 'queue'"),
        ('[[rule]]\nqueue = "ttl"\nurl_pattern = "("\n', "rule 1: field 'url_pattern': bad regular"),
        ('[[rule]]\nqueue = "ttl"\nurl_pattern = 5\n', "rule 1: field 'url_pattern': expected a string"),
        (
            '[[rule]]\nqueue = "priority"\nmin_sitemap_priority = 1.5\n',
            "rule 1: field 'min_sitemap_priority': expected a number 0.0..1.0",
        ),
        (
            '[[rule]]\nqueue = "priority"\nmin_sitemap_priority = true\n',
            "rule 1: field 'min_sitemap_priority'",
        ),
        ('[[rule]]\nqueue = "priority"\nlastmod_within_h = -1\n', "rule 1: field 'lastmod_within_h'"),
        (
            '[[rule]]\nqueue = "priority"\nmessage_priority = 9\n',
            "rule 1: field 'message_priority': expected a whole number 0..5",
        ),
        ('[[rule]]\nqueue = "priority"\nmessage_priority = 2.5\n', "rule 1: field 'message_priority'"),
        (
            '[[rule]]\nqueue = "bulk"\nmessage_priority = 3\n',
            "rule 1: field 'message_priority': only the priority queue",
        ),
        ('[[rule]]\nqueue = "bulk"\nurl_patern = "x"\n', "rule 1: unknown field 'url_patern'"),
        ('[[rules]]\nqueue = "bulk"\n', "unknown top-level key 'rules'"),
        ("", "no [[rule]] tables"),
        ("[[rule]\nqueue = ", "not valid TOML"),
    ],
)
def test_bad_rules_name_the_file_rule_and_field(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        load_router(str(path))
    assert str(caught.value).startswith(f"routing file {path}: ")
    assert message in str(caught.value)


def test_missing_rules_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        load_router(str(tmp_path / "absent.toml"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2025-06-01", datetime(2025, 6, 1, tzinfo=UTC)),
        ("2025-06", datetime(2025, 6, 1, tzinfo=UTC)),
        ("2025", datetime(2025, 1, 1, tzinfo=UTC)),
        ("2025-06-01T10:30Z", datetime(2025, 6, 1, 10, 30, tzinfo=UTC)),
        ("2025-06-01T12:30:00+02:00", datetime(2025, 6, 1, 10, 30, tzinfo=UTC)),
        ("2025-06-01T10:30:00.5Z", datetime(2025, 6, 1, 10, 30, 0, 500000, tzinfo=UTC)),
        ("yesterday", None),
        ("", None),
    ],
)
def test_parse_lastmod(text: str, expected: datetime | None) -> None:
    assert parse_lastmod(text) == expected
