"""The streaming sitemap parser against a whole-tree reading of the same document.

parse_sitemap never builds a tree: it picks entries out of expat's events as they stream by.
The reference here parses the whole document with defusedxml into an ElementTree and reads each
entry from it the obvious way. The two must give the same entries for any well-formed sitemap:
namespaces or none, comments, CDATA, entity references, elements nested inside fields, fields
repeated or in excess, unknown elements and documents long enough to span many read chunks.
"""

from __future__ import annotations

import gzip
from xml.etree.ElementTree import Element

import defusedxml.ElementTree
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from producer.sitemaps import (
    ENTRY_FIELDS,
    MAX_ENTRY_FIELDS,
    READ_CHUNK_BYTES,
    ChildSitemap,
    SitemapEntry,
    _entry,
    parse_sitemap,
)

bounded = hypothesis_settings(max_examples=300, deadline=None, database=None, derandomize=True)
MB = 1024 * 1024
SOURCE = "http://s.test/sitemap.xml"
SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"


def local(tag: str) -> str:
    return tag.rpartition("}")[2]


def entries_from_tree(document: bytes) -> list[SitemapEntry | ChildSitemap]:
    """Each child of the root, read from a whole tree: the text (before any child element) of
    its first MAX_ENTRY_FIELDS field elements, a later field of the same name winning."""
    root: Element = defusedxml.ElementTree.fromstring(document, forbid_dtd=True)
    entries = []
    for child in root:
        kept = [field for field in child if local(field.tag) in ENTRY_FIELDS][:MAX_ENTRY_FIELDS]
        fields = {local(field.tag): (field.text or "").strip() for field in kept}
        entry = _entry(local(child.tag), fields, local(root.tag), SOURCE)
        if entry is not None:
            entries.append(entry)
    return entries


TEXT_PIECES = [
    "http://a.test/page",
    "?q=1&amp;r=2",
    " ",
    "\n  ",
    "0.8",
    "1.5",
    "Daily",
    "weekly",
    "2024-03-01T10:00:00+00:00",
    "<![CDATA[http://b.test/<raw>]]>",
    "<!-- a comment -->",
    "&#233;t&#xE9;",
    "<b>inner</b>",
    "<x:deep xmlns:x='urn:x'><y>1</y>tail</x:deep>",
    "after",
]
FIELD_NAMES = ["loc", "loc", "lastmod", "priority", "changefreq", "image:image", "news", "LOC"]
ENTRY_NAMES = ["url", "url", "sitemap", "image", "entry"]
PREFIXES = {"": "", "ns": f' xmlns="{SITEMAP_NS}"', "s": f' xmlns:s="{SITEMAP_NS}"'}

texts = st.lists(st.sampled_from(TEXT_PIECES), max_size=4).map("".join)


@st.composite
def sitemap_documents(draw: st.DrawFn) -> str:
    prefix_kind = draw(st.sampled_from(sorted(PREFIXES)))
    p = "s:" if prefix_kind == "s" else ""
    root = draw(st.sampled_from(["urlset", "sitemapindex"]))
    entries = []
    for _ in range(draw(st.integers(0, 6))):
        name = draw(st.sampled_from(ENTRY_NAMES))
        count = draw(st.sampled_from([0, 1, 2, 4, 2 * MAX_ENTRY_FIELDS]))
        fields = []
        for _ in range(count):
            field = draw(st.sampled_from(FIELD_NAMES))
            tag = field if ":" in field else p + field
            xmlns = ' xmlns:image="urn:image"' if field.startswith("image:") else ""
            fields.append(f"<{tag}{xmlns}>{draw(texts)}</{tag}>{draw(st.sampled_from(['', ' ', chr(10)]))}")
        entries.append(f"<{p}{name}>{''.join(fields)}</{p}{name}>")
    declaration = draw(st.sampled_from(["", '<?xml version="1.0" encoding="UTF-8"?>\n']))
    return f"{declaration}<{p}{root}{PREFIXES[prefix_kind]}>{''.join(entries)}</{p}{root}>"


@bounded
@given(sitemap_documents())
def test_streamed_entries_match_a_whole_tree_reading(document: str) -> None:
    body = document.encode()
    assert list(parse_sitemap(body, SOURCE, MB)) == entries_from_tree(body)


def test_entries_that_straddle_read_chunks_are_read_whole() -> None:
    # Entries of uneven length, so that chunk boundaries fall inside tags, texts and CDATA.
    entries = "".join(
        f"<url><loc> http://a.test/{'x' * (i % 97)}/{i}?a=1&amp;b={i} </loc>"
        f"<lastmod>2024-01-{1 + i % 28:02d}</lastmod><!-- {i} -->"
        f"<priority><![CDATA[0.{i % 10}]]></priority><changefreq>daily</changefreq></url>"
        for i in range(20_000)
    )
    body = f"<urlset xmlns='{SITEMAP_NS}'>{entries}</urlset>".encode()
    assert len(body) > 20 * READ_CHUNK_BYTES
    expected = entries_from_tree(body)
    assert len(expected) == 20_000
    assert list(parse_sitemap(body, SOURCE, 50 * MB)) == expected
    assert list(parse_sitemap(gzip.compress(body), SOURCE, 50 * MB)) == expected
