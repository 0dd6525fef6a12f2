"""The deep-frontier benchmark's generated sitemaps: every URL once, on loopback, in files of at
most 50,000, and the page site answers each of them."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

import pytest

from bench.deep_frontier import URLS_PER_SITEMAP, write_sitemaps
from bench.perf_site import Site, SiteSpec

pytestmark = pytest.mark.unit


def test_sitemaps_list_every_url_once_in_files_of_at_most_50000(tmp_path: Path) -> None:
    write_sitemaps(tmp_path, urls=120_003, hosts=7, shallow=1_000)

    index = (tmp_path / "index.xml").read_text()
    children = re.findall(r"<loc>http://127\.0\.0\.1:\d+/([^<]+)</loc>", index)
    assert children == ["part-00000.xml.gz", "part-00001.xml.gz", "part-00002.xml.gz"]
    urls: list[str] = []
    for child in children:
        found = re.findall(r"<loc>([^<]+)</loc>", gzip.decompress((tmp_path / child).read_bytes()).decode())
        assert len(found) <= URLS_PER_SITEMAP
        urls.extend(found)
    assert len(urls) == len(set(urls)) == 120_003
    assert all(re.match(r"http://127\.0\.1\.[1-7]:\d+/p/\d+\.html$", url) for url in urls)
    small = re.findall(
        r"<loc>([^<]+)</loc>", gzip.decompress((tmp_path / "small.xml.gz").read_bytes()).decode()
    )
    assert small == urls[:1_000]


def test_the_page_site_answers_the_last_generated_url(tmp_path: Path) -> None:
    urls, hosts = 120_003, 7
    write_sitemaps(tmp_path, urls=urls, hosts=hosts, shallow=10)
    last = re.findall(
        r"<loc>([^<]+)</loc>", gzip.decompress((tmp_path / "part-00002.xml.gz").read_bytes()).decode()
    )[-1]
    host_index = int(re.search(r"127\.0\.1\.(\d+)", last).group(1)) - 1  # type: ignore[union-attr]
    path = last.split(":", 2)[2].split("/", 1)[1]
    site = Site(SiteSpec(hosts, -(-urls // hosts), 8591, 0), with_sitemaps=False)

    assert site.answer(host_index, "/" + path)[0] == 200
    assert site.answer(host_index, f"/p/{-(-urls // hosts)}.html")[0] == 404
    assert site.sitemaps == {}
