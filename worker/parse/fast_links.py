"""Relative links resolved once per directory, not once per page.

A documentation page links "../library/os.html", "functions.html#open", "../genindex.html",
and so do the other pages of its directory: urljoin parsed and re-assembled each of them on
every page. For a relative href, one with a path that is not site-absolute and no scheme,
authority, or bare query or fragment, urljoin's answer depends only on the base's scheme,
authority and directory (the path up to its last "/"): the last segment of the base, its
query and fragment are dropped. And the href's own fragment is dropped from the answer, so
"os.html#os.fspath" and "os.html#os.getcwd" are one entry. The answer is cached under (that
directory, the href without its fragment), in a cache of a few MB. Anything else is resolved
as before.
tests/unit/test_fast_links.py holds the cached answers to the uncached ones.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from urllib.parse import urlsplit

CACHED_LINKS = 8192  # a few hundred bytes each


_STAND_IN = "http://h"  # the origin paths are resolved under; the answer's path is the same


def split_base(base: str) -> tuple[str, str] | None:
    """('scheme://authority', '/dir/') of an http(s) base URL, or None when the base is not one
    to cache under (no authority, or path parameters, which urljoin treats apart)."""
    try:
        parts = urlsplit(base)
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.netloc or ";" in parts.path:
        return None
    path = parts.path or "/"
    return f"{parts.scheme}://{parts.netloc}", path[: path.rfind("/") + 1]


def relative_key(href: str) -> str | None:
    """The href without its fragment if it is a path relative to the base's directory: not
    empty, not site-absolute or protocol-relative, not a bare query or fragment, no ':' (so no
    scheme) and no ';' (path parameters, which urljoin re-assembles); else None."""
    if not href or href[0] in "/?#\\" or ":" in href or ";" in href or href != href.strip():
        return None
    return href.partition("#")[0]


class RelativeLinks:
    """Relative hrefs resolved by `resolve(base, href)` (urljoin and checks), cached by the
    base's directory path and the href: the answer is the same for every origin, so one entry
    serves every host with the same layout, and the origin is put in front afterwards."""

    def __init__(self, resolve: Callable[[str, str], str | None], size: int = CACHED_LINKS) -> None:
        @lru_cache(maxsize=size)
        def after_origin(directory: str, key: str) -> str | None:
            url = resolve(_STAND_IN + directory, key)
            return url[len(_STAND_IN) :] if url and url.startswith(_STAND_IN + "/") else None

        self._after_origin = after_origin

    def resolve(self, origin: str, directory: str, key: str) -> str | None:
        rest = self._after_origin(directory, key)
        return origin + rest if rest else None
