"""Ports on 127.0.0.1 for a test to listen on, or to find nobody listening on."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listened on a moment ago (the kernel's pick), for a server to bind."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


def closed_port() -> int:
    """A port nothing listens on: connecting to it is refused at once."""
    return free_port()
