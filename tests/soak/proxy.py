"""A TCP proxy in front of one service port that adds the faults of a bad link on command:

    delay(0.2)     every byte arrives 0.2 s later, each way (latency; throughput is kept)
    stall(True)    nothing is forwarded, either way, until stall(False): the link drops every
                   packet, so peers see a connection that hangs (heartbeats missed, reads time
                   out) rather than one that closes
    reset()        every connection open now is closed with a TCP RST, both sides
    refuse(True)   new connections are reset as soon as they are accepted

It runs an asyncio loop in a daemon thread; the commands may come from any thread. The pipeline's
processes are pointed at the proxy's port, the soak's checks at the service's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass

CHUNK = 65536
STALL_POLL_S = 0.05
HALF_CLOSED_S = 5.0


@dataclass
class LinkState:
    """What the link does now; read by every pump on each chunk."""

    delay_s: float = 0.0
    stalled: bool = False
    refusing: bool = False


class _Pair:
    """One client connection and the connection to the service made for it."""

    def __init__(self, client: asyncio.StreamWriter, upstream: asyncio.StreamWriter) -> None:
        self.writers = (client, upstream)

    def reset(self) -> None:
        for writer in self.writers:
            _reset(writer)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST: SO_LINGER on with a zero timeout makes close() abort the connection."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class FaultProxy:
    def __init__(self, listen_port: int, target_port: int, host: str = "127.0.0.1") -> None:
        self.host = host
        self.listen_port = listen_port
        self.target_port = target_port
        self.state = LinkState()
        self.accepted = 0
        self.resets = 0
        self._pairs: set[_Pair] = set()
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(
            target=self._loop.run_forever, daemon=True, name=f"proxy-{listen_port}"
        )

    # ---- commands, from any thread ------------------------------------------------------------

    def start(self) -> FaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(timeout=10)
        return self

    @property
    def port(self) -> int:
        assert self._server is not None, "start the proxy first"
        return int(self._server.sockets[0].getsockname()[1])

    def delay(self, seconds: float) -> None:
        self.state.delay_s = seconds

    def stall(self, on: bool) -> None:
        self.state.stalled = on

    def refuse(self, on: bool) -> None:
        self.state.refusing = on

    def reset(self) -> int:
        """Reset every open connection; return how many pairs were reset."""
        return int(asyncio.run_coroutine_threadsafe(self._reset_all(), self._loop).result(timeout=10))

    def heal(self) -> None:
        self.state.delay_s, self.state.stalled, self.state.refusing = 0.0, False, False

    def open_connections(self) -> int:
        return len(self._pairs)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()

    # ---- the loop's side ------------------------------------------------------------------------

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.listen_port, reuse_address=True
        )

    async def _close(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._reset_all()
        await self._server.wait_closed()
        # The connections' tasks see their sockets aborted and end; let them before the loop stops.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=5)

    async def _reset_all(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.reset()
        self.resets += len(pairs)
        return len(pairs)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.state.refusing:
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            _reset(writer)  # the service is down: the client sees a refused link, at once
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        pumps = {
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer)),
        }
        try:
            # One way ended (a close or a reset): the services here never half-close, so the
            # other way gets a moment to pass on what it holds, then both are closed.
            _done, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            if pending:
                await asyncio.wait(pending, timeout=HALF_CLOSED_S)
        finally:
            for pump in pumps:
                pump.cancel()
            self._pairs.discard(pair)
            for each in pair.writers:
                each.transport.abort()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read chunks as they come, hand each on once it is `delay_s` old: a latency, with the
        reading never held up by the delay of the chunks before."""
        due: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        sender = asyncio.ensure_future(self._send(due, writer))
        try:
            while True:
                try:
                    data = await reader.read(CHUNK)
                except (ConnectionError, OSError):
                    data = b""
                await due.put((time.monotonic() + self.state.delay_s, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()

    async def _send(self, due: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter) -> None:
        while True:
            at, data = await due.get()
            while self.state.stalled:
                await asyncio.sleep(STALL_POLL_S)
            wait = at - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError, RuntimeError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                return
