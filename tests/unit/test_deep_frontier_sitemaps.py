"""The deep-frontier benchmark's generated sitemaps: every URL once, on loopback, in files of at
most 50,000, and the page site answers each of them."""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from bench.deep_frontier import URLS_PER_SITEMAP, write_sitemaps, write_tail
from bench.perf_site import Site, SiteSpec


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


def test_each_shallow_round_gets_urls_no_other_round_and_no_deep_round_reaches_first(tmp_path: Path) -> None:
    def urls_of(name: str) -> list[str]:
        return re.findall(r"<loc>([^<]+)</loc>", gzip.decompress((tmp_path / name).read_bytes()).decode())

    write_sitemaps(tmp_path, urls=10_000, hosts=3, shallow=100)
    rounds = [urls_of(write_tail(tmp_path, 10_000, 3, 1_000, r)) for r in range(3)]

    assert [len(r) for r in rounds] == [1_000, 1_000, 1_000]
    assert len({url for r in rounds for url in r}) == 3_000
    every = urls_of("part-00000.xml.gz")
    assert rounds[0] == every[-1_000:]  # the far end of the deep queue, which drains from the front
