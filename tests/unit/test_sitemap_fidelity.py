"""What a sitemap says, read faithfully: empty bodies and HTML pages fail, dates come out in one
form, and RSS and Atom feeds are lists of URLs too."""

from __future__ import annotations

import gzip

import pytest

from producer.fetch import FetchFailed
from producer.lastmod import normalise_lastmod, normalise_rss_date
from producer.sitemaps import READ_CHUNK_BYTES, SitemapEntry, SitemapError, SitemapReader, parse_sitemap

MB = 1024 * 1024
NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
ATOM = 'xmlns="http://www.w3.org/2005/Atom"'


def reader_for(pages: dict[str, bytes]) -> SitemapReader:
    def fetch(url: str) -> bytes:
        if url not in pages:
            raise FetchFailed("HTTP 404", 404)
        return pages[url]

    return SitemapReader(fetch, max_depth=3, max_bytes=MB)


@pytest.mark.parametrize(
    "body",
    [b"", b"   \r\n\t  ", b"\xef\xbb\xbf", b"\xef\xbb\xbf \n", gzip.compress(b""), gzip.compress(b"\n\n")],
    ids=["no bytes", "whitespace", "lone BOM", "BOM and whitespace", "empty gzip", "gzip of newlines"],
)
def test_an_empty_body_is_a_failed_sitemap(body: bytes) -> None:
    reader = reader_for({"http://s/sitemap.xml": body})
    assert list(reader.read("http://s/sitemap.xml")) == []
    assert [(f.url, f.error) for f in reader.failures] == [
        ("http://s/sitemap.xml", "empty body (nothing but whitespace)")
    ]
    assert reader.sitemaps_read == 0


def test_a_text_sitemap_of_comments_only_is_read_not_failed() -> None:
    reader = reader_for({"http://s/urls.txt": b"# nothing listed today\n"})
    assert list(reader.read("http://s/urls.txt")) == []
    assert reader.failures == []
    assert reader.sitemaps_read == 1


@pytest.mark.parametrize(
    "body",
    [
        b"<!DOCTYPE html><html><head><title>Not found</title></head><body>gone</body></html>",
        b"\xef\xbb\xbf\n  <!doctype HTML>\n<html lang=en><p>Page not found",
        b"<html><body>not found</body></html>",
        b"<!-- served by cms --><html>\n<body><p>oops",
        b'<?xml version="1.0"?>\n<!DOCTYPE html PUBLIC "-//W3C//DTD XHTML 1.0 Strict//EN" "x.dtd">'
        b'<html xmlns="http://www.w3.org/1999/xhtml"><body/></html>',
        b'<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body/></html>',
        b"<HEAD><TITLE>404</TITLE></HEAD><BODY>x</BODY>",
        gzip.compress(b"<!DOCTYPE html><html></html>"),
    ],
)
def test_an_html_page_is_not_a_sitemap(body: bytes) -> None:
    with pytest.raises(SitemapError) as caught:
        list(parse_sitemap(body, "http://s/sitemap.xml", MB))
    assert str(caught.value) == "not a sitemap (HTML page)"


def test_a_sitemap_with_a_dtd_is_still_refused_as_such() -> None:
    body = b'<?xml version="1.0"?><!DOCTYPE urlset [<!ENTITY a "b">]><urlset><url><loc>x</loc></url></urlset>'
    with pytest.raises(SitemapError, match="DTD refused"):
        list(parse_sitemap(body, "s", MB))


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("2024-05-01", "2024-05-01T00:00:00Z"),
        ("2024-05", "2024-05-01T00:00:00Z"),
        ("2024", "2024-01-01T00:00:00Z"),
        ("2024-05-01T10:00:00Z", "2024-05-01T10:00:00Z"),
        ("2024-05-01T12:30:00+02:00", "2024-05-01T10:30:00Z"),
        ("2024-05-01T00:30:00-01:00", "2024-05-01T01:30:00Z"),
        ("2024-05-01T10:00+05:30", "2024-05-01T04:30:00Z"),
        ("2024-05-01T10:00:00.987654Z", "2024-05-01T10:00:00Z"),  # fractions dropped
        ("2024-05-01T10:00:00", "2024-05-01T10:00:00Z"),  # no zone: taken as UTC
        ("2024-05-01 10:00:00+0000", "2024-05-01T10:00:00Z"),
        ("  2024-05-01\n", "2024-05-01T00:00:00Z"),
        ("yesterday", None),
        ("2024-02-30", None),
        ("2023-02-29", None),
        ("2024-13-01", None),
        ("2024-05-01T25:00:00Z", None),
        ("20240501", None),  # ISO 8601's basic form is no W3C datetime
        ("2024-W18-3", None),
        ("0001-01-01T00:00:00+05:00", None),  # before the first representable instant in UTC
        ("2024-05-01T10:00:00Z" + "0" * 100, None),
    ],
)
def test_lastmod_is_normalised_to_utc(text: str, normal: str | None) -> None:
    assert normalise_lastmod(text) == normal


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("Wed, 01 May 2024 10:00:00 GMT", "2024-05-01T10:00:00Z"),
        ("Wed, 01 May 2024 12:00:00 +0200", "2024-05-01T10:00:00Z"),
        ("1 May 2024 10:00 EST", "2024-05-01T15:00:00Z"),
        ("2024-05-01T10:00:00+01:00", "2024-05-01T09:00:00Z"),  # feeds that write ISO 8601
        ("Wed, 31 Feb 2024 10:00:00 GMT", None),
        ("last week", None),
    ],
)
def test_rss_dates_are_normalised_to_utc(text: str, normal: str | None) -> None:
    assert normalise_rss_date(text) == normal


def test_invalid_lastmods_become_none_and_are_counted_as_warnings() -> None:
    dates = ["2024-05-01T12:00:00+02:00", "yesterday", "2024-02-30", "", "2024-02-29"]
    body = "".join(
        f"<url><loc>http://example.com/{i}</loc>" + (f"<lastmod>{d}</lastmod>" if d else "") + "</url>"
        for i, d in enumerate(dates)
    )
    reader = reader_for({"http://s/s.xml": f"<urlset {NS}>{body}</urlset>".encode()})
    entries = list(reader.read("http://s/s.xml"))
    assert [e.lastmod for e in entries] == [
        "2024-05-01T10:00:00Z",
        None,
        None,
        None,
        "2024-02-29T00:00:00Z",
    ]
    assert reader.warnings == {"invalid_lastmod": 2}  # an absent lastmod is no warning
    assert reader.failures == []


def test_rss_items_are_urls_dated_by_pub_date() -> None:
    body = b"""<?xml version="1.0" encoding="UTF-8"?>
    <rss version="2.0" xmlns:atom="http://www.w3.org/2005/Atom">
      <channel>
        <title>News</title>
        <link>http://example.com/</link>
        <atom:link href="http://example.com/feed.xml" rel="self" type="application/rss+xml"/>
        <item>
          <title>One</title>
          <link> http://example.com/news/1 </link>
          <pubDate>Wed, 01 May 2024 12:00:00 +0200</pubDate>
          <guid>http://example.com/?p=1</guid>
        </item>
        <item><title>No link: skipped</title><guid isPermaLink="false">x</guid></item>
        <item><link>/news/2</link><pubDate>someday</pubDate></item>
        <item><link><![CDATA[http://example.com/news/3?a=1&b=2]]></link></item>
      </channel>
    </rss>"""
    reader = reader_for({"http://example.com/feed.xml": body})
    entries = list(reader.read("http://example.com/feed.xml"))
    source = "http://example.com/feed.xml"
    assert entries == [
        SitemapEntry("http://example.com/news/1", source, "2024-05-01T10:00:00Z"),
        SitemapEntry("http://example.com/news/2", source, None),  # relative: joined to the feed's URL
        SitemapEntry("http://example.com/news/3?a=1&b=2", source, None),
    ]
    assert reader.warnings == {"invalid_lastmod": 1}
    assert reader.failures == [] and reader.sitemaps_read == 1


def test_rss_1_items_are_urls_too() -> None:
    body = b"""<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"
        xmlns="http://purl.org/rss/1.0/" xmlns:dc="http://purl.org/dc/elements/1.1/">
      <channel rdf:about="http://example.com/"><link>http://example.com/</link></channel>
      <item rdf:about="http://example.com/a"><link>http://example.com/a</link>
        <dc:date>2024-05-01T10:00:00+01:00</dc:date></item>
    </rdf:RDF>"""
    assert list(parse_sitemap(body, "f", MB)) == [
        SitemapEntry("http://example.com/a", "f", "2024-05-01T09:00:00Z")
    ]


def test_atom_entries_are_urls_by_their_alternate_link() -> None:
    body = f"""<?xml version="1.0" encoding="utf-8"?>
    <feed {ATOM}>
      <title>Blog</title>
      <link rel="self" href="http://example.com/atom.xml"/>
      <link href="http://example.com/"/>
      <updated>2024-05-02T00:00:00Z</updated>
      <entry>
        <title>A</title>
        <link rel="edit" href="http://example.com/edit/a"/>
        <link rel="alternate" type="text/html" href="http://example.com/a"/>
        <link rel="alternate" hreflang="de" href="http://example.com/de/a"/>
        <id>tag:example.com,2024:a</id>
        <published>2024-04-01T00:00:00Z</published>
        <updated>2024-05-01T12:00:00+02:00</updated>
      </entry>
      <entry><link href="b"/><published>2024-04-03</published></entry>
      <entry><link rel="enclosure" href="http://example.com/c.mp3"/></entry>
      <entry><link rel="alternate" href="http://example.com/d"/><updated>2024-02-30</updated></entry>
    </feed>""".encode()
    reader = reader_for({"http://example.com/blog/atom.xml": body})
    entries = list(reader.read("http://example.com/blog/atom.xml"))
    source = "http://example.com/blog/atom.xml"
    assert entries == [
        SitemapEntry("http://example.com/a", source, "2024-05-01T10:00:00Z"),  # <updated> wins
        SitemapEntry("http://example.com/blog/b", source, "2024-04-03T00:00:00Z"),  # no rel: alternate
        SitemapEntry("http://example.com/d", source, None),
    ]
    assert reader.warnings == {"invalid_lastmod": 1}


def test_a_large_feed_streams_across_chunks_and_gzip() -> None:
    items = "".join(
        f"<item><title>{'t' * 50}</title><link>http://example.com/{i}</link></item>" for i in range(3000)
    )
    body = f"<rss><channel>{items}</channel></rss>".encode()
    assert len(body) > 2 * READ_CHUNK_BYTES
    urls = [e.url for e in parse_sitemap(gzip.compress(body), "f", MB)]
    assert urls == [f"http://example.com/{i}" for i in range(3000)]


def test_a_feed_nested_too_deep_is_refused() -> None:
    body = b"<rss><channel><item>" + b"<x>" * 40 + b"</x>" * 40 + b"</item></channel></rss>"
    with pytest.raises(SitemapError, match="nested deeper"):
        list(parse_sitemap(body, "f", MB))


def test_a_feed_cut_off_keeps_what_came_before() -> None:
    body = b"<rss><channel><item><link>http://example.com/1</link></item><item><link>http://exa"
    reader = reader_for({"http://s/f.xml": body})
    assert [e.url for e in reader.read("http://s/f.xml")] == ["http://example.com/1"]
    assert reader.failures[0].error.startswith("bad XML") and "after 1 URLs" in reader.failures[0].error
