"""A hostile server: every misbehaviour ends in a typed error within its deadline, in
bounded memory (the test process's peak resident memory, read from the kernel)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

import envlink
from envlink import ConnectionOptions, GenericEnvClient, ProtocolError, ReconnectPolicy

from ._memory import MIB, self_peak_rss
from ._peers import accept_upgrade, frame, hostile_server

pytestmark = pytest.mark.timeout(30)

NO_RETRY = ReconnectPolicy(max_attempts=1)


def _client(url: str, **kwargs: object) -> GenericEnvClient:
    return GenericEnvClient(url, reconnect=NO_RETRY, **kwargs)  # type: ignore[arg-type]


async def _silent_forever(reader: asyncio.StreamReader) -> None:
    # Reads (and ignores) whatever the client sends, the close frame included.
    while await reader.read(65536):
        pass
    await asyncio.Event().wait()


@pytest.mark.parametrize("timeout", [5.0, None])
async def test_an_oversize_frame_from_a_server_that_stays_open_is_a_protocol_error(
        timeout: float | None) -> None:
    """A frame over max_message_size, then silence: ProtocolError within close_timeout."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await reader.read(65536)  # the reset request
        writer.write(frame(b"x" * 1024, length=64 * MIB))  # announces 64 MiB
        await writer.drain()
        await _silent_forever(reader)

    options = ConnectionOptions(max_message_size=MIB, close_timeout=0.5, ping_interval=None)
    async with hostile_server(script) as url:
        env = _client(url, options=options, timeout=timeout)
        started = time.monotonic()
        with pytest.raises(ProtocolError):
            await env.reset()
        # Bounded by close_timeout plus a margin, never by the call deadline.
        assert time.monotonic() - started < 0.5 + 2.0
        await env.close()


async def test_a_deeply_nested_observation_is_a_protocol_error() -> None:
    """989 levels of nesting: an EnvlinkError, never a serialisation error of pydantic."""
    for depth in (256, 600, 989, 5000):
        nested = "[" * depth + "]" * depth

        async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                         nested: str = nested) -> None:
            await accept_upgrade(reader, writer)
            await reader.read(65536)
            body = ('{"type":"observation","data":{"observation":{"x":' + nested
                    + '},"reward":0,"done":false}}').encode()
            writer.write(frame(body))
            await writer.drain()
            await _silent_forever(reader)

        async with hostile_server(script) as url:
            env = _client(url, timeout=5)
            try:
                result = await env.reset()
            except envlink.EnvlinkError:
                pass
            else:  # decoded and kept: must still be an ordinary result
                assert result.done is False
            await env.close()


@pytest.mark.parametrize("reward", ["NaN", "Infinity", "-Infinity"])
async def test_non_finite_rewards_are_refused(reward: str) -> None:
    """A NaN or infinite reward from a server is a ProtocolError (the client sends none)."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await reader.read(65536)
        writer.write(frame(('{"type":"observation","data":{"observation":{},"reward":'
                            + reward + ',"done":false}}').encode()))
        await writer.drain()
        await _silent_forever(reader)

    async with hostile_server(script) as url:
        env = _client(url, timeout=5)
        with pytest.raises(ProtocolError, match="reward"):
            await env.reset()
        await env.close()


async def test_a_ping_flood_and_unsolicited_frames_do_not_break_a_call() -> None:
    """10,000 pings and unsolicited pongs before the answer: the answer arrives, memory flat."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await reader.read(65536)
        for _ in range(10_000):
            writer.write(frame(b"p" * 100, opcode=9))
            writer.write(frame(b"q", opcode=10))
        writer.write(frame(json.dumps({"type": "observation", "data": {
            "observation": {"ok": True}, "reward": 1.0, "done": False}}).encode()))
        await writer.drain()
        await _silent_forever(reader)

    before = self_peak_rss()
    async with hostile_server(script) as url:
        env = _client(url, timeout=10)
        result = await env.reset()
        assert result.observation == {"ok": True}
        env._transport  # noqa: B018 - the client is still usable
        await env.close()
    assert self_peak_rss() - before < 64 * MIB


async def test_a_slowloris_handshake_ends_at_the_connect_deadline() -> None:
    """A server that trickles its upgrade answer a byte at a time: ConnectError in time."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for byte in b"HTTP/1.1 101 Switching Protocols\r\n" * 1000:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.01)

    async with hostile_server(script) as url:
        env = _client(url, connect_timeout_s=1.0)
        started = time.monotonic()
        with pytest.raises(envlink.ConnectError):
            await env.reset()
        assert time.monotonic() - started < 1.0 + 2.0
        await env.close()


async def test_five_thousand_upgrade_headers_are_a_typed_error() -> None:
    """An upgrade answer with 5,000 headers is refused as what it is, not as a timeout."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 101 Switching Protocols\r\n" + b"".join(
            b"X-Filler-%d: %s\r\n" % (i, b"v" * 40) for i in range(5000)) + b"\r\n")
        await writer.drain()
        await _silent_forever(reader)

    async with hostile_server(script) as url:
        env = _client(url, connect_timeout_s=5.0)
        with pytest.raises(envlink.ConnectError) as info:
            await env.reset()
        assert "header" in str(info.value).lower()
        assert not info.value.retryable
        await env.close()


async def test_a_cross_origin_redirect_of_the_upgrade_drops_every_credential() -> None:
    """Authorization, X-Api-Key and the resume token never reach the redirect's origin."""
    seen: list[bytes] = []

    async def target(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await accept_upgrade(reader, writer))
        await _silent_forever(reader)

    async with hostile_server(target) as other:
        async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            seen.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(b"HTTP/1.1 307 Elsewhere\r\nLocation: " + other.encode()
                         + b"/ws\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        async with hostile_server(redirect) as first:
            env = _client(first, headers={"Authorization": "Bearer SECRET1",
                                          "X-Api-Key": "SECRET2", "X-Trace": "kept"},
                          connect_timeout_s=5)
            with pytest.raises(envlink.EnvlinkError):
                await env.reset(timeout=2)
            await env.close()
    assert len(seen) >= 2
    assert b"SECRET1" in seen[0] and b"SECRET2" in seen[0]
    assert all(b"SECRET" not in head for head in seen[1:])
    assert b"X-Trace: kept" in seen[1]


async def test_a_redirect_from_wss_to_ws_is_refused(tmp_path: object) -> None:
    """A TLS server redirecting the upgrade to ws:// gets a ConnectError, not followed."""
    import ssl

    import trustme

    ca = trustme.CA()
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_context)
    client_context = ssl.create_default_context()
    ca.configure_trust(client_context)
    followed: list[bytes] = []

    async def plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        followed.append(await reader.readuntil(b"\r\n\r\n"))

    async with hostile_server(plain) as insecure:
        async def redirect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 302 Found\r\nLocation: " + insecure.encode()
                         + b"/ws\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            writer.close()

        async with hostile_server(redirect, ssl=server_context) as secure:
            env = _client(secure, ssl=client_context, connect_timeout_s=5)
            with pytest.raises(envlink.ConnectError) as info:
                await env.reset()
            assert not info.value.retryable
            assert "non-secure" in str(info.value)
            await env.close()
    assert followed == []


async def test_a_redirect_loop_of_the_upgrade_ends_in_a_typed_error() -> None:
    """A server redirecting the upgrade to itself forever: a ConnectError, in time."""

    async def loop_back(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 302 Found\r\nLocation: /ws\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        writer.close()

    async with hostile_server(loop_back) as url:
        env = _client(url, connect_timeout_s=5)
        with pytest.raises(envlink.ConnectError):
            await env.reset()
        await env.close()


def _answer(observation: dict[str, object]) -> bytes:
    return json.dumps({"type": "observation",
                       "data": {"observation": observation, "reward": 0.0,
                                "done": False}}).encode()


async def test_a_trickled_answer_is_read_whole() -> None:
    """An answer sent a few bytes at a time (each in its own TCP write) is decoded as sent."""
    payload = _answer({"echoed_message": "trickled"})

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await reader.read(65536)  # the reset request
        data = frame(payload)
        for i in range(0, len(data), 3):
            writer.write(data[i:i + 3])
            await writer.drain()
            await asyncio.sleep(0.002)  # the peer's pace, not a synchronisation
        await _silent_forever(reader)

    async with hostile_server(script) as url:
        env = _client(url, timeout=10.0)
        result = await env.reset()
        assert result.observation == {"echoed_message": "trickled"}
        await env.close()


async def test_an_endless_trickle_ends_at_the_call_deadline() -> None:
    """A frame announced at 64 KiB and sent a byte at a time never completes: the call ends
    with CallTimeoutError at its deadline, not when the server likes."""

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await accept_upgrade(reader, writer)
        await reader.read(65536)
        # The whole header (a 64 KiB frame), then the payload a byte at a time: cut
        # inside the header, the spaces would be read as a length beyond the limit.
        writer.write(frame(b"", length=64 * 1024))
        while True:
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.01)  # the peer's pace

    async with hostile_server(script) as url:
        env = _client(url, timeout=1.0)
        started = time.monotonic()
        with pytest.raises(envlink.CallTimeoutError):
            await env.reset()
        assert time.monotonic() - started < 1.0 + 2.0
        await env.close()


async def test_a_one_gigabyte_error_body_is_refused_in_bounded_memory() -> None:
    """An upgrade refused with a 1 GiB body (streamed, never sent whole): a typed error
    within the connect deadline, and the client's memory does not follow the body."""
    chunk = b"x" * MIB

    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
                     b"Content-Length: 1073741824\r\n\r\n")
        for _ in range(1024):
            writer.write(chunk)
            await writer.drain()  # stops when the client goes away

    before = self_peak_rss()
    async with hostile_server(script) as url:
        env = _client(url, connect_timeout_s=5.0)
        started = time.monotonic()
        # websockets reads the body and refuses it as too large; picows refuses the
        # upgrade on its status line and never reads the body.
        with pytest.raises(envlink.ConnectError, match=r"too large|HTTP 503"):
            await env.reset()
        assert time.monotonic() - started < 5.0 + 2.0
        await env.close()
    assert self_peak_rss() - before < 128 * MIB
