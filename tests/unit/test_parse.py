"""parse_page and decode_html on small HTML samples."""

from __future__ import annotations

import codecs

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worker.parse.budget import ParseBudget
from worker.parse.page import _absolute_http, _first_body, _links, decode_html, parse_page
from worker.parse.soup import new_soup

FULL = """<!doctype html>
<html lang=" en-GB ">
<head>
  <title>
    The   Title
  </title>
  <meta name="Description" content="  A short   summary. ">
  <link rel="stylesheet" href="/style.css">
  <link rel="Canonical" href="/articles/1">
  <style>body { color: red }</style>
  <script>var secret = "script text";</script>
</head>
<body>
  <h1>First <em>heading</em></h1>
  <h1>Second heading</h1>
  <p>Visible   paragraph<br>over lines.</p>
  <noscript>enable javascript</noscript>
  <template><p>template text</p><script>nested()</script></template>
  <!-- a comment -->
  <svg><title>icon tooltip</title></svg>
  <a href="/a#top">rel</a>
  <a href="b?x=1">relative to the directory</a>
  <a href="/a#bottom">same page, another fragment</a>
  <a href="https://other.example/c">absolute</a>
  <a href="//cdn.example/d">scheme-relative</a>
  <a href="mailto:x@example.com">mail</a>
  <a href="javascript:void(0)">js</a>
  <a href="#only-a-fragment">top</a>
  <a href="http://[::1">malformed</a>
  <a>no href</a>
  <map><area href="/area-link"></map>
</body>
</html>"""

PAGE_URL = "https://site.example/dir/page.html"


def test_fields_of_a_full_page() -> None:
    page = parse_page(FULL, PAGE_URL)
    assert page.title == "The Title"
    assert page.description == "A short summary."
    assert page.canonical_url == "https://site.example/articles/1"
    assert page.lang == "en-GB"
    assert page.h1 == "First heading"
    assert page.base_url == PAGE_URL


def test_links_are_absolute_http_deduplicated_in_order() -> None:
    page = parse_page(FULL, PAGE_URL)
    assert page.links == (
        "https://site.example/a",
        "https://site.example/dir/b?x=1",
        "https://other.example/c",
        "https://cdn.example/d",
        "https://site.example/dir/page.html",
        "https://site.example/area-link",
    )


def test_visible_text_excludes_code_and_hidden_parts() -> None:
    text = parse_page(FULL, PAGE_URL).text
    assert text.startswith("First heading Second heading Visible paragraph over lines.")
    for hidden in (
        "script text",
        "color: red",
        "enable javascript",
        "template text",
        "nested()",
        "a comment",
        "The Title",
    ):
        assert hidden not in text
    assert "  " not in text and "\n" not in text


def test_missing_fields_are_none() -> None:
    page = parse_page("<html><body><p>just text</p></body></html>", "http://x.example/")
    assert (page.title, page.description, page.canonical_url, page.lang, page.h1) == (
        None,
        None,
        None,
        None,
        None,
    )
    assert page.text == "just text"
    assert page.links == ()


def test_blank_fields_are_none() -> None:
    html = (
        '<html lang=""><head><title>  </title><meta name="description" content=" ">'
        '<link rel="canonical" href=""></head><body><h1> </h1></body></html>'
    )
    page = parse_page(html, "http://x.example/")
    assert (page.title, page.description, page.canonical_url, page.lang, page.h1) == (
        None,
        None,
        None,
        None,
        None,
    )


def test_base_href_changes_how_links_resolve() -> None:
    html = '<html><head><base href="/docs/"></head><body><a href="intro">i</a></body></html>'
    page = parse_page(html, "http://x.example/a/b")
    assert page.base_url == "http://x.example/docs/"
    assert page.links == ("http://x.example/docs/intro",)


def test_svg_title_is_not_the_page_title() -> None:
    html = "<html><body><svg><title>icon</title></svg><p>x</p></body></html>"
    assert parse_page(html, "http://x.example/").title is None


def test_caps_on_text_and_links() -> None:
    links = "".join(f'<a href="/p{i}">word{i}</a>' for i in range(50))
    page = parse_page(
        f"<html><body>{links}</body></html>", "http://x.example/", max_text_chars=20, max_links=10
    )
    assert len(page.text) == 20
    assert page.links == tuple(f"http://x.example/p{i}" for i in range(10))


def test_default_link_cap_is_a_thousand() -> None:
    links = "".join(f'<a href="/p{i}">.</a>' for i in range(1500))
    page = parse_page(f"<html><body>{links}</body></html>", "http://x.example/")
    assert len(page.links) == 1000
    assert page.links[-1] == "http://x.example/p999"


def test_bytes_input_uses_the_meta_charset() -> None:
    html = '<html><head><meta charset="windows-1251"><title>Привет</title></head></html>'
    page = parse_page(html.encode("windows-1251"), "http://x.example/")
    assert page.title == "Привет"


def test_decode_html_prefers_bom_then_header_then_meta() -> None:
    text = "<p>naïve</p>"
    assert decode_html(codecs.BOM_UTF8 + text.encode(), "text/html; charset=latin-1") == text
    assert decode_html(text.encode("cp1252"), "text/html; charset=windows-1252") == text
    meta = '<meta charset="iso-8859-1"><p>naïve</p>'
    assert decode_html(meta.encode("latin-1"), "text/html") == meta
    assert decode_html(text.encode(), None) == text


def test_decode_html_treats_latin1_labels_as_windows_1252() -> None:
    # 0x93/0x94 are curly quotes in windows-1252 and control codes in strict ISO-8859-1.
    assert decode_html(b"\x93hi\x94", 'text/html; charset="ISO-8859-1"') == "\u201chi\u201d"


def test_decode_html_survives_bad_bytes_and_unknown_charsets() -> None:
    assert decode_html(b"ok \xff\xfe end", "text/html; charset=no-such-codec") == "ok \ufffd\ufffd end"
    assert decode_html(b"ok \xff", None) == "ok \ufffd"


@pytest.mark.parametrize("label", ["base64", "hex", "zlib", "idna", "rot13", "uu"])
def test_a_charset_naming_a_non_text_codec_is_ignored(label: str) -> None:
    body = b"<html><head><title>caf\xc3\xa9</title></head></html>"
    assert "café" in decode_html(body, f"text/html; charset={label}")
    assert "café" in decode_html(body.replace(b"<head>", f'<head><meta charset="{label}">'.encode()))


def test_deeply_nested_markup_is_read_without_recursion() -> None:
    depth = 5_000  # far past Python's recursion limit, should the parser keep that much nesting
    html = "<html><body>" + "<div>" * depth + '<a href="/deep">deep</a>' + "</div>" * depth + "</body></html>"
    # A budget that lets it through: the default refuses nesting this deep (test_parse_budget.py).
    page = parse_page(html, "http://x.example/", budget=ParseBudget(max_depth=depth + 10))
    assert page.links == ("http://x.example/deep",)
    assert page.text == "deep"


def test_only_the_first_of_each_field_counts_and_later_ones_do_not_override() -> None:
    html = (
        '<html lang="de"><head><base href="/one/"><base href="/two/"><title>First</title>'
        '<meta name="keywords" content="k"><meta name="description" content="first">'
        '<meta name="description" content="second"><link rel="canonical" href="c1">'
        '<link rel="canonical" href="c2"></head><body><h1>A</h1><h1>B</h1><title>Late</title></body></html>'
    )
    page = parse_page(html, "http://x.example/page")
    assert (page.base_url, page.title, page.description) == ("http://x.example/one/", "First", "first")
    assert (page.canonical_url, page.lang, page.h1) == ("http://x.example/one/c1", "de", "A")


@given(
    st.text(alphabet="/.?#;:@%-_~!$&'()*+,=abcAB09 \t\\é", max_size=20).map(lambda tail: "/" + tail),
    st.sampled_from(
        [
            "http://x.example/dir/page",
            "https://u:p@x.example:8443/a/b/",
            "http://[::1]:80/",
            "http://x.example",
        ]
    ),
)
def test_the_plain_path_shortcut_resolves_links_as_urljoin_does(href: str, base: str) -> None:
    expected = _absolute_http(base, href)
    assert _links([href], base, max_links=10) == ((expected,) if expected else ())


@pytest.mark.parametrize(
    "markup",
    [
        "<html><head><title>t</title></head><body><p>x</p></body></html>",
        "<p>no body tag at all</p>",
        "",
        "<!-- c --><html><body class='a'><div><body>inner</body></div></body></html>",
        "<svg><body>not html</body></svg><body>after</body>",
        "<template><body>t</body></template><p>x</p>",
        "<frameset><frame src='a'></frameset>",
    ],
)
def test_the_body_found_is_bs4s_soup_body(markup: str) -> None:
    soup = new_soup(markup, multi_valued_attributes=False)
    assert _first_body(soup) is soup.body
