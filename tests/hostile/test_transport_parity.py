"""The same hostile peer, the same typed outcome, on both WebSocket transports.

Each case runs with ``transport="websockets"`` and ``transport="picows"``: a message
split into frames, a split message over the size limit, invalid UTF-8, a close code,
a peer that never answers a keepalive ping.
"""

from __future__ import annotations

import asyncio
import time

import pytest

import envlink
from envlink import GenericEnvClient, ReconnectPolicy

from ._peers import accept_upgrade, frame, hostile_server

pytest.importorskip("picows")

NO_RETRY = ReconnectPolicy(max_attempts=1)
TRANSPORTS = ["websockets", "picows"]
ANSWER = b'{"type":"observation","data":{"observation":{"x":1},"reward":0.5,"done":false}}'


def _client(url: str, transport: str, **kwargs: object) -> GenericEnvClient:
    return GenericEnvClient(url, reconnect=NO_RETRY, transport=transport,  # type: ignore[arg-type]
                            **kwargs)


async def _read_request(reader: asyncio.StreamReader) -> None:
    await reader.read(65536)


async def _hold(reader: asyncio.StreamReader) -> None:
    while await reader.read(65536):
        pass


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_message_in_three_frames_is_one_answer(transport: str) -> None:
    """A text message sent as three frames (first, continuation, last) is read whole."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await _read_request(reader)
        writer.write(frame(ANSWER[:10], fin=False) + frame(ANSWER[10:30], opcode=0, fin=False)
                     + frame(ANSWER[30:], opcode=0))
        await _hold(reader)

    async with hostile_server(script) as url:
        env = _client(url, transport)
        result = await env.reset()
        assert result.observation == {"x": 1} and result.reward == 0.5
        await env.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_split_message_over_the_limit_is_a_protocol_error(transport: str) -> None:
    """Frames each under max_message_size that add up to more than it: ProtocolError."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await _read_request(reader)
        part = b" " * 600
        writer.write(frame(part, fin=False) + frame(part, opcode=0, fin=False)
                     + frame(part, opcode=0))
        await _hold(reader)

    async with hostile_server(script) as url:
        env = _client(url, transport, max_message_size=1024, timeout=5.0)
        with pytest.raises(envlink.ProtocolError, match="larger than the limit"):
            await env.reset()
        await env.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_invalid_utf8_in_a_text_frame_is_a_protocol_error(transport: str) -> None:
    """A text frame that is not UTF-8: ProtocolError (close code 1007), not a crash."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await _read_request(reader)
        writer.write(frame(b'{"type":"observation","data":"\xff\xfe"}'))
        await _hold(reader)

    async with hostile_server(script) as url:
        env = _client(url, transport, timeout=5.0)
        with pytest.raises(envlink.ProtocolError):
            await env.reset()
        await env.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_close_with_too_big_is_the_servers_size_limit(transport: str) -> None:
    """The server closes with 1009 (message too big): a ProtocolError naming its limit."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await _read_request(reader)
        writer.write(frame(b"\x03\xf1too big", opcode=8))
        await _hold(reader)

    async with hostile_server(script) as url:
        env = _client(url, transport, timeout=5.0)
        with pytest.raises(envlink.ProtocolError, match="size limit"):
            await env.reset()
        await env.close()


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_peer_that_ignores_the_close_is_dropped_after_close_timeout(
        transport: str) -> None:
    """close() with no close deadline (Timeout(close=None)) against a peer that never
    answers the close frame: dropped after ConnectionOptions.close_timeout, not never."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await _read_request(reader)
        writer.write(frame(ANSWER))
        await _hold(reader)

    async with hostile_server(script) as url:
        env = _client(url, transport, timeout=envlink.Timeout(5.0, close=None))
        await env.reset()
        started = time.monotonic()
        await asyncio.wait_for(env.close(), 10)
        assert time.monotonic() - started < 1.0 + 1.5  # close_timeout is 1 s


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a_peer_that_never_answers_pings_is_found_dead(transport: str) -> None:
    """Keepalive: a peer that reads but never answers a ping is declared dead within
    ping_interval + ping_timeout (plus the close wait), as a lost connection."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await _hold(reader)

    async with hostile_server(script) as url:
        env = _client(url, transport, ping_interval=0.3, ping_timeout=0.3, timeout=10.0)
        started = time.monotonic()
        with pytest.raises(envlink.ConnectionLostError):
            await env.reset()
        assert time.monotonic() - started < 0.3 + 0.3 + 1.5
        await env.close()
