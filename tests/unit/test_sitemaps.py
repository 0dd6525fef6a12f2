from __future__ import annotations

import gzip
import tracemalloc
from pathlib import Path

import pytest

from producer.fetch import FetchFailed
from producer.sitemaps import ChildSitemap, SitemapEntry, SitemapError, SitemapReader, parse_sitemap
from producer.sources import read_url_file

NS = 'xmlns="http://www.sitemaps.org/schemas/sitemap/0.9"'
MB = 1024 * 1024


def urlset(*locs: str, extra: str = "") -> bytes:
    body = "".join(f"<url><loc>{loc}</loc>{extra}</url>" for loc in locs)
    return f'<?xml version="1.0" encoding="UTF-8"?><urlset {NS}>{body}</urlset>'.encode()


def index(*locs: str) -> bytes:
    body = "".join(f"<sitemap><loc>{loc}</loc></sitemap>" for loc in locs)
    return f"<sitemapindex {NS}>{body}</sitemapindex>".encode()


class FakeSite:
    """A fetch function over a dict of URL -> body; a missing URL is an HTTP 404."""

    def __init__(self, pages: dict[str, bytes]) -> None:
        self.pages = pages
        self.fetched: list[str] = []

    def __call__(self, url: str) -> bytes:
        self.fetched.append(url)
        if url not in self.pages:
            raise FetchFailed("HTTP 404", 404)
        return self.pages[url]


def reader_for(pages: dict[str, bytes], max_depth: int = 3, max_bytes: int = MB) -> SitemapReader:
    return SitemapReader(FakeSite(pages), max_depth=max_depth, max_bytes=max_bytes)


def test_urlset_entries_carry_their_hints() -> None:
    body = f"""<?xml version="1.0"?>
    <urlset {NS} xmlns:image="http://www.google.com/schemas/sitemap-image/1.1">
      <url>
        <loc> http://example.com/a </loc>
        <lastmod>2024-05-01T10:00:00+00:00</lastmod>
        <priority>0.8</priority>
        <changefreq>Daily</changefreq>
        <image:image><image:loc>http://example.com/img.png</image:loc></image:image>
      </url>
      <url><loc>http://example.com/b</loc><priority>7</priority><changefreq>often</changefreq></url>
    </urlset>""".encode()
    assert list(parse_sitemap(body, "s.xml", MB)) == [
        SitemapEntry("http://example.com/a", "s.xml", "2024-05-01T10:00:00Z", 0.8, "daily"),
        SitemapEntry("http://example.com/b", "s.xml", None, None, None),  # out-of-range hints dropped
    ]


def test_tags_match_whatever_the_namespace() -> None:
    bare = b"<urlset><url><loc>http://example.com/a</loc></url></urlset>"
    other = b'<u:urlset xmlns:u="urn:x"><u:url><u:loc>http://example.com/b</u:loc></u:url></u:urlset>'
    assert [e.url for e in parse_sitemap(bare, "s", MB)] == ["http://example.com/a"]
    assert [e.url for e in parse_sitemap(other, "s", MB)] == ["http://example.com/b"]


def test_index_lists_children() -> None:
    items = list(parse_sitemap(index("http://example.com/a.xml", "http://example.com/b.xml"), "i", MB))
    assert items == [ChildSitemap("http://example.com/a.xml"), ChildSitemap("http://example.com/b.xml")]


def test_plain_text_sitemap_one_url_per_line() -> None:
    body = b"\xef\xbb\xbfhttp://example.com/a\r\n\n  http://example.com/b  \n# note\nhttp://example.com/c"
    assert [e.url for e in parse_sitemap(body, "s.txt", MB)] == [
        "http://example.com/a",
        "http://example.com/b",
        "http://example.com/c",
    ]


def test_gzip_is_recognised_by_magic_bytes_not_name() -> None:
    pages = {
        "http://s/plain.xml": gzip.compress(urlset("http://example.com/g")),  # gzip named .xml
        "http://s/packed.xml.gz": urlset("http://example.com/p"),  # plain named .gz
    }
    reader = reader_for(pages)
    urls = [e.url for u in pages for e in reader.read(u)]
    assert urls == ["http://example.com/g", "http://example.com/p"]
    assert reader.failures == []


def test_index_is_followed_into_xml_gzip_and_text_children() -> None:
    pages = {
        "http://s/index.xml": index("http://s/a.xml", "/b.xml.gz", "http://s/c.txt"),
        "http://s/a.xml": urlset("http://example.com/1", "http://example.com/2"),
        "http://s/b.xml.gz": gzip.compress(urlset("http://example.com/3")),
        "http://s/c.txt": b"http://example.com/4\n",
    }
    reader = reader_for(pages)
    entries = list(reader.read("http://s/index.xml"))
    assert [e.url for e in entries] == [f"http://example.com/{i}" for i in range(1, 5)]
    assert [e.source for e in entries][-2:] == ["http://s/b.xml.gz", "http://s/c.txt"]
    assert reader.sitemaps_read == 4
    assert reader.failures == []


def test_broken_children_are_recorded_and_the_rest_go_on() -> None:
    pages = {
        "http://s/index.xml": index(
            "http://s/missing.xml",
            "http://s/bad.xml",
            "http://s/html.xml",
            "ftp://s/x.xml",
            "http://s/good.xml",
        ),
        # Cut off inside the second <url>.
        "http://s/bad.xml": urlset("http://example.com/early", "http://example.com/late")[:-20],
        "http://s/html.xml": b"<html><body>not found</body></html>",
        "http://s/good.xml": urlset("http://example.com/ok"),
    }
    reader = reader_for(pages)
    urls = [e.url for e in reader.read("http://s/index.xml")]
    # What came before the break still counts; the sitemap after the broken ones is read.
    assert urls == ["http://example.com/early", "http://example.com/ok"]
    errors = {f.url: f.error for f in reader.failures}
    assert errors["http://s/missing.xml"] == "HTTP 404"
    assert errors["http://s/bad.xml"].startswith("bad XML")
    assert "after 1 URLs" in errors["http://s/bad.xml"]
    assert errors["http://s/html.xml"] == "not a sitemap (HTML page)"
    assert errors["ftp://s/x.xml"].startswith("invalid_url")
    assert all("\n" not in error for error in errors.values())
    assert reader.sitemaps_read == 2  # the index and good.xml


def test_index_depth_is_bounded() -> None:
    pages = {f"http://s/{d}.xml": index(f"http://s/{d + 1}.xml") for d in range(5)}
    pages["http://s/5.xml"] = urlset("http://example.com/deep")
    site = FakeSite(pages)
    reader = SitemapReader(site, max_depth=2, max_bytes=MB)
    assert list(reader.read("http://s/0.xml")) == []
    assert [f.url for f in reader.failures] == ["http://s/3.xml"]
    assert "deeper than 2" in reader.failures[0].error
    assert site.fetched == ["http://s/0.xml", "http://s/1.xml", "http://s/2.xml"]


def test_each_sitemap_is_read_once_even_in_a_cycle() -> None:
    pages = {
        "http://s/a.xml": index("http://s/b.xml", "http://S:80/a.xml"),
        "http://s/b.xml": index("http://s/a.xml", "http://s/c.xml"),
        "http://s/c.xml": urlset("http://example.com/1"),
    }
    site = FakeSite(pages)
    reader = SitemapReader(site, max_depth=10, max_bytes=MB)
    assert [e.url for e in reader.read("http://s/a.xml")] == ["http://example.com/1"]
    assert site.fetched == ["http://s/a.xml", "http://s/b.xml", "http://s/c.xml"]


def test_document_with_entities_is_refused() -> None:
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol">'
        b'<!ENTITY lol2 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">]>'
        b"<urlset><url><loc>http://example.com/&lol2;</loc></url></urlset>"
    )
    with pytest.raises(SitemapError, match="DTD"):
        list(parse_sitemap(laughs, "s", MB))


def test_external_entity_is_refused_and_recorded() -> None:
    xxe = (
        b'<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>'
        b"<urlset><url><loc>&x;</loc></url></urlset>"
    )
    reader = reader_for({"http://s/x.xml": xxe})
    assert list(reader.read("http://s/x.xml")) == []
    assert "DTD" in reader.failures[0].error


def test_gzip_bomb_is_cut_at_the_decompressed_cap() -> None:
    bomb = gzip.compress(urlset("http://example.com/a") + b" " * (20 * MB))
    assert len(bomb) < 100_000  # small on the wire
    with pytest.raises(SitemapError, match=f"larger than {MB} bytes uncompressed"):
        list(parse_sitemap(bomb, "s", MB))


def test_plain_document_over_the_cap_is_cut_too() -> None:
    body = urlset(*(f"http://example.com/{i}" for i in range(2000)))
    with pytest.raises(SitemapError, match="larger than"):
        list(parse_sitemap(body, "s", len(body) // 2))
    assert len(list(parse_sitemap(body, "s", len(body)))) == 2000


def test_corrupt_gzip_is_an_error_not_a_crash() -> None:
    corrupt = gzip.compress(urlset("http://example.com/a"))[:30]
    with pytest.raises(SitemapError, match="gzip"):
        list(parse_sitemap(corrupt, "s", MB))


def test_large_sitemap_is_streamed_not_built_as_a_tree() -> None:
    body = urlset(
        *(f"http://example.com/page/{i}" for i in range(50_000)),
        extra="<lastmod>2024-01-01</lastmod><priority>0.5</priority>",
    )
    tracemalloc.start()
    try:
        count = sum(1 for _ in parse_sitemap(body, "s", 50 * MB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert count == 50_000
    # A tree of 50,000 <url> elements with children takes tens of MB; streaming stays small.
    assert peak < 2 * MB, f"peak {peak} bytes"


def test_site_sitemaps_come_from_robots_txt() -> None:
    robots = b"User-agent: *\nDisallow: /private\nSitemap: http://s/one.xml\nsitemap: /two.xml\n"
    pages = {
        "http://s/robots.txt": robots,
        "http://s/one.xml": urlset("http://example.com/1"),
        "http://s/two.xml": urlset("http://example.com/2"),
        "http://s/sitemap.xml": urlset("http://example.com/not-listed"),
    }
    reader = reader_for(pages)
    assert [e.url for e in reader.read_site("http://s/")] == ["http://example.com/1", "http://example.com/2"]


@pytest.mark.parametrize("robots", [None, b"User-agent: *\nDisallow:\n"])
def test_site_without_listed_sitemaps_falls_back_to_sitemap_xml(robots: bytes | None) -> None:
    pages = {"http://s:8000/sitemap.xml": urlset("http://example.com/fallback")}
    if robots is not None:
        pages["http://s:8000/robots.txt"] = robots
    reader = reader_for(pages)
    assert [e.url for e in reader.read_site("http://s:8000/some/page")] == ["http://example.com/fallback"]


def test_url_file_skips_comments_and_blanks(tmp_path: Path) -> None:
    path = tmp_path / "urls.txt"
    path.write_text("# seeds\nhttp://example.com/a\n\n   \nhttp://example.com/b#frag\n")
    entries = list(read_url_file(str(path)))
    assert [e.url for e in entries] == ["http://example.com/a", "http://example.com/b#frag"]
    assert {e.source for e in entries} == {str(path)}
