"""A local demo website for demos and end-to-end tests: several hosts on loopback addresses, a
sitemap index with a plain and a gzipped child, and pages that fail in known ways.

    config.py    SiteConfig (the whole site follows from it) and ExpectedUrls
    sitemaps.py  the sitemap index and its children
    pages.py     HTML pages and robots.txt
    routes.py    which answer a request gets, free of sockets
    state.py     request counts, the fixed flag, the request log
    server.py    DemoSite: the servers, started and stopped in-process
    __main__.py  the command line
    runner.py    the site as a child process of a launcher (serve_demo_site)
"""

from demo_site.config import ExpectedUrls, Kind, SiteConfig
from demo_site.server import DemoSite
from demo_site.state import RequestRecord

__all__ = ["DemoSite", "ExpectedUrls", "Kind", "RequestRecord", "SiteConfig"]
