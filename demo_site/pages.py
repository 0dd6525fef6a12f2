"""HTML pages and robots.txt. Text is derived from the page's position, so every run serves the
same bytes and a test can predict titles and links."""

from __future__ import annotations

from html import escape

from demo_site.config import Kind, SiteConfig

WORDS = (
    "harbour", "lantern", "meadow", "copper", "orchard", "signal", "granite", "willow",
    "compass", "ember", "tide", "quarry", "beacon", "thicket", "saddle", "prairie",
    "glacier", "furnace", "pebble", "canyon", "harvest", "mirror", "timber", "falcon",
    "ledger", "valley", "anchor", "thistle", "summit", "candle", "marble", "river",
)  # fmt: skip
PARAGRAPHS_PER_PAGE = 3
WORDS_PER_PARAGRAPH = 24
# Marker text inside <script> and <style>: a text extractor that keeps it is counting invisible text.
HIDDEN_MARKER = "hidden-marker-not-visible-text"

TITLES = {
    Kind.PAGE: "Demo page",
    Kind.NEWS: "News story",
    Kind.FLAKY: "Flaky page",
    Kind.BROKEN: "Recovered page",
    Kind.MISSING: "Missing page",
    Kind.DISALLOWED: "Private page",
}


def title(config: SiteConfig, site: int, kind: Kind, number: int) -> str:
    return f"{TITLES[kind]} {number} on {config.names[site]}"


def paragraph(site: int, kind_index: int, number: int, index: int) -> str:
    # A fixed arithmetic walk through the word list: varied between pages, identical between runs.
    # The step is odd and the list length a power of two, so a walk never repeats a short cycle.
    step = 1 + 2 * ((site * 7 + kind_index * 5 + number * 3 + index) % (len(WORDS) // 2))
    start = site * 11 + kind_index * 13 + number * 17 + index * 19
    words = [WORDS[(start + i * step) % len(WORDS)] for i in range(WORDS_PER_PARAGRAPH)]
    return " ".join(words).capitalize() + "."


def links(config: SiteConfig, site: int, number: int) -> list[tuple[str, str]]:
    """(href, text) pairs: a relative link on the same host, absolute ones to other hosts."""
    result: list[tuple[str, str]] = []
    pages = config.pages_per_host
    if pages:
        following = number % pages + 1
        result.append((config.path(Kind.PAGE, following), f"Page {following}"))
    if config.news_per_host:
        result.append((config.path(Kind.NEWS, 1), "Latest news"))
    site_count = len(config.names)
    if pages and site_count > 1:
        other = (site + 1) % site_count
        result.append((config.url(other, Kind.PAGE, 1), f"Page 1 on {config.names[other]}"))
    return result


def render_page(config: SiteConfig, site: int, kind: Kind, number: int) -> bytes:
    page_title = escape(title(config, site, kind, number))
    kind_index = list(Kind).index(kind)
    body = "\n".join(
        f"    <p>{escape(paragraph(site, kind_index, number, index))}</p>"
        for index in range(PARAGRAPHS_PER_PAGE)
    )
    nav = "\n".join(
        f'      <li><a href="{escape(href)}">{escape(text)}</a></li>'
        for href, text in links(config, site, number)
    )
    html = f"""<!DOCTYPE html>
<html lang="en">
  <head>
    <meta charset="utf-8">
    <title>{page_title}</title>
    <meta name="description" content="{page_title}: a generated page of the local demo site.">
    <link rel="canonical" href="{escape(config.url(site, kind, number))}">
    <style>.{HIDDEN_MARKER} {{ color: #333; }}</style>
    <script>window.demoMarker = "{HIDDEN_MARKER}";</script>
  </head>
  <body>
    <h1>{page_title}</h1>
{body}
    <ul>
{nav}
    </ul>
  </body>
</html>
"""
    return html.encode("utf-8")


def robots_txt(config: SiteConfig, site: int) -> bytes:
    lines = ["User-agent: *", "Allow: /"]
    if config.disallowed_per_host:
        lines.insert(1, f"Disallow: /{Kind.DISALLOWED.value}/")
    if site == 0:
        # Only the first host announces the sitemaps; they list the URLs of every host.
        lines += ["", f"Sitemap: {config.sitemap_index_url}"]
    return ("\n".join(lines) + "\n").encode("utf-8")
