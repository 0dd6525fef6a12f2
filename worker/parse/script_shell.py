"""RENDER=auto: does a fetched page look like a script shell, whose content only a browser builds?

Three signs together: little visible text (under SHELL_MAX_TEXT_CHARS once parsed), a root
element of the kind script frameworks mount into (an empty `<div id="root">`, `app`, `__next`,
`__nuxt`, `data-reactroot`, `ng-app`...), and at least one script. Any one alone is common in
ordinary pages (a short page, a page with analytics scripts); the three together are the shell
that a worker would store empty. Such a page goes to the render queue instead of being stored
(worker/handling/forwards.py, `to_render`), counted by its reason.
"""

from __future__ import annotations

import re

SCRIPT_SHELL = "script_shell"  # the reason counted for a page sent on to be rendered
SHELL_MAX_TEXT_CHARS = 200
_ROOT_ELEMENT = re.compile(
    r"""<[a-z]+[^>]*\s(?:id\s*=\s*["']?(?:root|app|__next|__nuxt|svelte|main-app)["'\s>]"""
    r"""|data-reactroot|ng-app|data-server-rendered|ng-version)""",
    re.IGNORECASE,
)
_SCRIPT = re.compile(r"<script\b", re.IGNORECASE)


def looks_like_script_shell(html: str, visible_text: str) -> bool:
    return (
        len(visible_text) < SHELL_MAX_TEXT_CHARS
        and _SCRIPT.search(html) is not None
        and _ROOT_ELEMENT.search(html) is not None
    )
