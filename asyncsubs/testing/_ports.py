"""Loopback ports for servers that a test stops and starts again on the same port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]

#: Where Linux keeps the range it hands out to port-0 binds and outgoing connections.
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: The lowest port drawn from below that range.
_LOWEST = 10_000


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def free_port() -> int:
    """A loopback TCP port that nothing listens on now, drawn from below the ephemeral range:
    while a server is stopped for a restart, a port from that range may become any new
    connection's or port-0 server's, and the server could not bind it again. Port 0's choice
    where the range is unknown or leaves no room below it."""
    start = _ephemeral_start()
    for _ in range(100 if start > _LOWEST + 1_000 else 0):
        port = random.randrange(_LOWEST, start)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:  # in use: another
                continue
        return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen
