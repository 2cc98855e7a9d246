"""A hostile client cannot exhaust the reference server's memory with one message.

``[{},{},...]`` costs the server ~24 bytes of Python objects per byte of JSON, and
compressed it is ~1,000 times smaller on the wire. The real server runs in its own
process; its peak resident memory (``VmHWM``) is read from the kernel.
"""

from __future__ import annotations

import json
import urllib.request
import zlib

import pytest
from websockets.asyncio.client import connect

from .._processes import ServerProcess
from ._memory import MIB, peak_rss

pytestmark = pytest.mark.timeout(60)

# A 15 MiB array of empty objects: under the server's 16 MiB message limit.
BOMB = "[" + "{}," * (5 * 1024 * 1024) + "{}]"
# What it parses into would cost the server ~800 MiB; the bound allows this much.
PEAK_BUDGET = 160 * MIB


def _health(port: int) -> dict[str, object]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
        return json.loads(answer.read())  # type: ignore[no-any-return]


async def test_compression_is_off_by_default_and_the_bomb_is_refused_unparsed() -> None:
    """envlink serve negotiates no deflate; 15 MiB of `{}` gets an error frame, memory bounded."""
    server = ServerProcess()
    try:
        async with connect(f"{server.url}/ws", compression="deflate", max_size=None,
                           ping_interval=None) as ws:
            assert ws.response is not None
            assert "Sec-WebSocket-Extensions" not in ws.response.headers
            before = peak_rss(server.proc.pid)
            await ws.send(BOMB)
            answer = json.loads(await ws.recv())
        assert answer["type"] == "error"
        assert answer["data"]["code"] == "INVALID_JSON"
        assert "JSON values" in answer["data"]["message"]
        assert peak_rss(server.proc.pid) - before < PEAK_BUDGET
        assert _health(server.port)["status"] == "healthy"
    finally:
        server.stop()


async def test_a_14_kib_compressed_bomb_leaves_the_server_bounded_when_deflate_is_on() -> None:
    """With --compression deflate, the ~14 KiB wire message is refused; /health answers."""
    wire = zlib.compressobj(wbits=-15)
    assert len(wire.compress(BOMB.encode()) + wire.flush()) < 32 * 1024
    server = ServerProcess("--compression", "deflate")
    try:
        async with connect(f"{server.url}/ws", compression="deflate", max_size=None,
                           ping_interval=None) as ws:
            assert ws.response is not None
            assert "permessage-deflate" in ws.response.headers.get(
                "Sec-WebSocket-Extensions", "")
            before = peak_rss(server.proc.pid)
            await ws.send(BOMB)
            answer = json.loads(await ws.recv())
        assert answer["data"]["code"] == "INVALID_JSON"
        assert peak_rss(server.proc.pid) - before < PEAK_BUDGET
        assert _health(server.port)["status"] == "healthy"
    finally:
        server.stop()
