"""The renderer's guarded proxy, driven with raw requests: what it passes, what it refuses."""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterator
from typing import ClassVar

import pytest

from renderer.proxy import REFUSED_HEADER, GuardedProxy
from shared.errors import BlockedAddress
from shared.http.addresses import IPAddress
from tests.local_site import LocalSite, QuietHandler

pytestmark = pytest.mark.unit

BIG = b"x" * 5000


class Handler(QuietHandler):
    def do_GET(self) -> None:
        self.send(200, "text/plain", BIG if self.path == "/big" else b"hello " + self.path.encode())

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.send(200, "text/plain", b"got " + self.rfile.read(length))


class Upstream(LocalSite):
    handler: ClassVar[type[QuietHandler]] = Handler


@pytest.fixture
def upstream() -> Iterator[Upstream]:
    with Upstream() as site:
        yield site


def addresses(host: str, port: int) -> list[IPAddress]:
    """The fake guard: `site.test` is the local upstream, `inside.test` is refused."""
    if host == "site.test":
        return [ipaddress.ip_address("127.0.0.1")]
    raise BlockedAddress(f"{host} -> 10.0.0.1 is private")


async def exchange(raw: bytes, refusals: list[str]) -> bytes:
    proxy = GuardedProxy(
        addresses,
        max_body_bytes=1000,
        connect_timeout_s=5,
        idle_timeout_s=5,
        refused=lambda reason, target: refusals.append(reason),
    )
    port = await proxy.start()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(raw)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    await proxy.close()
    return answer


def ask(raw: str, refusals: list[str] | None = None) -> bytes:
    return asyncio.run(exchange(raw.encode(), [] if refusals is None else refusals))


def test_a_request_to_an_allowed_host_is_forwarded(upstream: Upstream) -> None:
    port = upstream.root.rsplit(":", 1)[1]
    answer = ask(f"GET http://site.test:{port}/a?b=1 HTTP/1.1\r\nHost: site.test\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello /a?b=1")
    posted = ask(f"POST http://site.test:{port}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nbody")
    assert posted.endswith(b"got body")


def test_refused_hosts_schemes_and_tunnels_get_the_marked_403() -> None:
    refusals: list[str] = []
    for raw in (
        "GET http://inside.test/ HTTP/1.1\r\nHost: inside.test\r\n\r\n",
        "CONNECT inside.test:443 HTTP/1.1\r\nHost: inside.test:443\r\n\r\n",
        "GET ftp://site.test/file HTTP/1.1\r\nHost: site.test\r\n\r\n",
    ):
        answer = ask(raw, refusals)
        assert answer.startswith(b"HTTP/1.1 403") and REFUSED_HEADER.encode() in answer
    assert refusals == ["blocked_address", "blocked_address", "scheme"]


def test_an_answer_past_the_body_cap_is_cut(upstream: Upstream) -> None:
    port = upstream.root.rsplit(":", 1)[1]
    refusals: list[str] = []
    answer = ask(f"GET http://site.test:{port}/big HTTP/1.1\r\nHost: site.test\r\n\r\n", refusals)
    assert len(answer) < len(BIG)
    assert refusals == ["body_cap"]
