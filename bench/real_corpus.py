"""Real pages that nobody here wrote: a Debian package's HTML documentation, fetched by the bench.

`ensure_corpus()` downloads the package with `apt-get download` into a cache directory (no
root install: the .deb is unpacked with `dpkg-deb -x`) and returns the directory of its HTML
pages. python3.11-doc is the Python 3.11 documentation as Sphinx builds it: 530 pages, mean
93 KB, median 53 KB, the largest 2.5 MB (the full index), with hundreds of links on many pages.
The cache directory is BENCH_CORPUS_DIR, else ~/.cache/crawl-pipeline-bench.

`python -m bench.real_corpus` downloads it (if needed) and prints the directory and its size.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

PACKAGE = "python3.11-doc"
HTML_DIR = "usr/share/doc/python3.11/html"  # inside the package


class CorpusUnavailable(Exception):
    """The corpus is not downloaded and cannot be: the message says why in one line."""


def cache_dir() -> Path:
    return Path(os.environ.get("BENCH_CORPUS_DIR") or Path.home() / ".cache" / "crawl-pipeline-bench")


def corpus_root(base: Path | None = None) -> Path:
    return (base or cache_dir()) / PACKAGE / HTML_DIR


def downloaded(base: Path | None = None) -> Path | None:
    """The HTML directory if a complete download is there, else None (never downloads)."""
    root = corpus_root(base)
    return root if (root / ".complete").exists() else None


def ensure_corpus(base: Path | None = None) -> Path:
    """The corpus' HTML directory, downloading and unpacking the package first if needed."""
    found = downloaded(base)
    if found:
        return found
    target = (base or cache_dir()) / PACKAGE
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise CorpusUnavailable(
                f"the real-page corpus needs {tool} (a Debian machine) to fetch {PACKAGE}"
            )
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    got = subprocess.run(["apt-get", "download", PACKAGE], cwd=target, capture_output=True, text=True)
    debs = list(target.glob(f"{PACKAGE}_*.deb"))
    if got.returncode != 0 or not debs:
        last = (got.stderr.strip().splitlines() or ["no .deb"])[-1]
        raise CorpusUnavailable(f"apt-get download {PACKAGE} failed ({last}); try `apt-get update` first")
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(target)], check=True)
    debs[0].unlink()
    root = corpus_root(base)
    if not root.is_dir():
        raise CorpusUnavailable(f"{PACKAGE} has no {HTML_DIR}: the package changed; pick another")
    (root / ".complete").write_text("")
    return root


def page_paths(root: Path) -> list[str]:
    """Every HTML page of the corpus as a URL path ("/library/os.html"), in a fixed order that
    mixes sizes (ordered by a hash of the path), so that the first N are a fair sample."""
    paths = [f"/{p.relative_to(root).as_posix()}" for p in root.rglob("*.html")]
    return sorted(paths, key=lambda p: hashlib.sha1(p.encode()).digest())


def main() -> int:
    try:
        root = ensure_corpus()
    except CorpusUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sizes = sorted((root / p.lstrip("/")).stat().st_size for p in page_paths(root))
    print(
        f"{root}: {len(sizes)} pages, mean {sum(sizes) / len(sizes) / 1000:.0f} KB, "
        f"median {sizes[len(sizes) // 2] / 1000:.0f} KB, largest {sizes[-1] / 1000:.0f} KB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
