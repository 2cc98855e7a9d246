"""Loopback ports for servers a test stops and starts again on the same port."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["restartable_port"]

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_floor() -> int:
    """The lowest port the kernel hands out for ``bind(0)`` and outgoing connections."""
    try:
        return int(_RANGE.read_text("ascii").split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def restartable_port() -> int:
    """A loopback port free now, for a server that is stopped and started again on it
    (or that a test starts late, after clients have tried it).

    Chosen below the ephemeral range: while nothing listens on it, no outgoing
    connection of this or another process can be given it as its local port, which a
    port from ``bind(0)`` could be (and the restart would fail with EADDRINUSE).
    """
    floor = _ephemeral_floor()
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(max(1024, floor - 12000), floor)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise OSError("no free loopback port below the ephemeral range")
