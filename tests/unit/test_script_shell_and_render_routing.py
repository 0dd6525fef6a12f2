"""RENDER=auto's test of a script shell, and the routing rule that sends URLs to the renderers."""

from __future__ import annotations

import pytest

from producer.routing import Router, parse_rules
from shared.errors import ConfigError
from worker.parse.script_shell import looks_like_script_shell

SHELL = '<html><body><div id="root"></div><script src="/app.js"></script></body></html>'


def test_a_script_shell_is_told_from_a_short_page_and_from_a_page_with_scripts() -> None:
    assert looks_like_script_shell(SHELL, "")
    assert not looks_like_script_shell('<div id="root"></div>', "")  # no script
    assert not looks_like_script_shell("<p>short</p><script></script>", "short")  # no root element
    assert not looks_like_script_shell(SHELL, "words " * 100)  # its text is there already


def test_a_render_always_rule_routes_to_the_render_queue() -> None:
    rules = parse_rules(b'[[rule]]\nurl_pattern = "/app/"\nrender = "always"\n[[rule]]\nqueue = "ttl"\n', "f")
    router = Router(rules, "f")
    assert router.route("https://a.example/app/x", None, None, 0).queue == "render"
    assert router.route("https://a.example/other", None, None, 0).queue == "ttl"
    with pytest.raises(ConfigError, match="field 'render'"):
        parse_rules(b'[[rule]]\nrender = "sometimes"\n', "f")
