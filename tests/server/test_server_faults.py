"""Fault injection: latency, stalls, drops, error and corrupt frames, refusals, restart."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import time

import pytest
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, InvalidStatus

from envlink import GenericEnvClient, OutcomeUnknownError, ProtocolError, set_testing
from envlink._sansio.protocol import RESUMED_HEADER, decode_response
from envlink.server import CORRUPT_KINDS, EnvServer, Faults
from envlink.server._command import build_parser, options_from_args

from ._server_support import RESET, STATE, open_ws, rpc, step, token_of

pytestmark = pytest.mark.timeout(15)


async def test_latency_delays_answers(server: EnvServer) -> None:
    """Server-wide plus per-connection latency is added before each answer."""
    server.faults.latency = 0.1
    async with open_ws(server) as ws:
        handle = await server.wait_for_connection(1)
        handle.faults.latency = 0.1
        started = time.monotonic()
        await rpc(ws, STATE)
        assert time.monotonic() - started >= 0.2


async def test_stall_after_stops_answers_and_pongs(server: EnvServer) -> None:
    """At the Nth request the connection stops answering and stops answering pings."""
    server.faults.stall_after = 2
    async with open_ws(server, ping_interval=None) as ws:
        assert (await rpc(ws, RESET))["type"] == "observation"
        await ws.send(json.dumps(step({"message": "x"})))
        await server.wait_for("stall", 1)
        pong = await ws.ping()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(pong), 0.2)
        assert server.steps_applied == 0
        handle = await server.wait_for_connection(1)
        assert handle.stalled
        handle.unstall()
        await asyncio.wait_for(pong, 5)
        answer = json.loads(await ws.recv())
        assert answer["data"]["observation"]["echoed_message"] == "x"
    assert server.faults.stall_after is None  # one-shot: consumed


async def test_stall_all_and_abort(server: EnvServer) -> None:
    """stall_all() stalls open connections; aborting a stalled one frees its handler."""
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        server.stall_all()
        handle = await server.wait_for_connection(1)
        assert handle.stalled
        handle.abort()
        await handle.wait_closed()
        with pytest.raises(ConnectionClosed):
            await ws.recv()


@pytest.mark.parametrize(("mode", "applied"), [
    ("before_apply", 0), ("after_apply", 1), ("mid_answer", 1),
])
async def test_drop_modes(server: EnvServer, mode: str, applied: int) -> None:
    """drop_after aborts the TCP connection (no close frame) before/after applying the step."""
    server.faults.drop_after = 2
    server.faults.drop_mode = mode  # type: ignore[assignment]
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        await ws.send(json.dumps(step({"message": "x"})))
        with pytest.raises(ConnectionClosedError) as info:
            await ws.recv()
        assert info.value.rcvd is None  # no close frame: an abort
    assert server.steps_applied == applied
    assert server.faults.drop_after is None


async def test_drop_after_apply_then_resume_is_exactly_once(server: EnvServer) -> None:
    """A step applied but never answered is answered from the cache after resume, not re-applied."""
    server.faults.drop_after = 1
    server.faults.drop_mode = "after_apply"
    async with open_ws(server, extensions=True) as ws:
        token = token_of(ws)
        await ws.send(json.dumps(step({"message": "once"}, id="s1")))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    await server.wait_for("session.detached", 1)
    async with open_ws(server, extensions=True, resume=token) as ws2:
        assert ws2.response is not None
        assert ws2.response.headers[RESUMED_HEADER] == "1"
        answer = await rpc(ws2, step({"message": "once"}, id="s1"))
    assert answer["id"] == "s1"
    assert answer["data"]["observation"]["echoed_message"] == "once"
    assert server.steps_applied == 1
    assert server.dedup_hits == 1


async def _raw_upgrade(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write((
        f"GET /ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode())
    head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101")
    return reader, writer


def _client_text_frame(text: str) -> bytes:
    payload = text.encode()
    assert len(payload) < 126
    return bytes([0x81, 0x80 | len(payload)]) + b"\0\0\0\0" + payload  # zero mask


async def test_mid_answer_writes_partial_frame(server: EnvServer) -> None:
    """mid_answer sends the start of the answer's frame, then aborts the connection."""
    server.faults.drop_after = 1
    server.faults.drop_mode = "mid_answer"
    reader, writer = await _raw_upgrade(server.port)
    writer.write(_client_text_frame(json.dumps(step({"message": "partial"}))))
    received = await reader.read()  # until EOF
    writer.close()
    assert received[:1] == b"\x81"  # a text frame started...
    declared = received[1] & 0x7F
    body = received[4:] if declared == 126 else received[2:]
    expected_len = int.from_bytes(received[2:4], "big") if declared == 126 else declared
    assert 0 < len(body) < expected_len  # ...and was cut short


async def test_per_connection_counting(server: EnvServer) -> None:
    """The Nth request is counted per connection, and a drop fires only once."""
    server.faults.drop_after = 2
    async with open_ws(server) as a, open_ws(server) as b:
        await rpc(a, STATE)
        await rpc(b, STATE)
        await a.send(json.dumps(STATE))
        with pytest.raises(ConnectionClosed):
            await a.recv()
        assert (await rpc(b, STATE))["type"] == "state"


async def test_per_connection_faults_only_affect_that_connection(server: EnvServer) -> None:
    """Faults set on a connection handle do not touch other connections."""
    async with open_ws(server) as a:
        handle = await server.wait_for_connection(1)
        handle.faults.error_frames = 1
        async with open_ws(server) as b:
            assert (await rpc(b, STATE))["type"] == "state"
        assert (await rpc(a, STATE))["type"] == "error"
        assert (await rpc(a, STATE))["type"] == "state"


async def test_error_frames(server: EnvServer) -> None:
    """The next N requests are answered with error frames of the given code, not applied."""
    server.faults.error_frames = 2
    server.faults.error_code = "SESSION_ERROR"
    async with open_ws(server, extensions=True) as ws:
        first = await rpc(ws, step({"message": "a"}, id="e1"))
        second = await rpc(ws, step({"message": "a"}))
        third = await rpc(ws, step({"message": "a"}))
    assert first["data"]["code"] == "SESSION_ERROR"
    assert first["id"] == "e1"
    assert second["data"]["code"] == "SESSION_ERROR"
    assert third["type"] == "observation"
    assert server.steps_applied == 1
    assert server.faults.error_frames == 0


@pytest.mark.parametrize("kind", [k for k in CORRUPT_KINDS if k != "oversize"])
async def test_corrupt_frames_violate_protocol(server: EnvServer, kind: str) -> None:
    """Each corrupt-frame kind is something the protocol decoder rejects; then answers resume."""
    server.faults.corrupt_frames = 1
    server.faults.corrupt_kind = kind  # type: ignore[assignment]
    async with open_ws(server) as ws:
        await ws.send(json.dumps(step({"message": "a"})))
        raw = await ws.recv()
        with pytest.raises(ProtocolError):
            decode_response(raw)
        assert (await rpc(ws, STATE))["type"] == "state"
    assert server.steps_applied == 0


async def test_corrupt_binary_is_binary_frame(server: EnvServer) -> None:
    """The binary corrupt frame arrives as a binary (bytes) message."""
    server.faults.corrupt_frames = 1
    server.faults.corrupt_kind = "binary"
    async with open_ws(server) as ws:
        await ws.send(json.dumps(STATE))
        assert isinstance(await ws.recv(), bytes)


async def test_corrupt_oversize_exceeds_client_limit(server: EnvServer) -> None:
    """An oversize frame breaks a client whose max_size is smaller (close 1009)."""
    server.faults.corrupt_frames = 1
    server.faults.corrupt_kind = "oversize"
    server.faults.oversize_bytes = 64 * 1024
    async with open_ws(server, max_size=32 * 1024) as ws:
        await ws.send(json.dumps(STATE))
        with pytest.raises(ConnectionClosedError) as info:
            await ws.recv()
        assert info.value.sent is not None
        assert info.value.sent.code == 1009


async def test_connection_oversize_bytes_is_its_own(server: EnvServer) -> None:
    """A connection's own oversize fault sends about the size it asked for, not the server's."""
    server.faults.oversize_bytes = 3 * 1024 * 1024  # must not be used for this connection
    async with open_ws(server, max_size=None) as ws:
        handle = await server.wait_for_connection(1)
        handle.faults.corrupt_frames = 1
        handle.faults.corrupt_kind = "oversize"
        handle.faults.oversize_bytes = 200_000
        await ws.send(json.dumps(STATE))
        raw = await ws.recv()
        assert 200_000 <= len(raw) < 200_000 + 1024
        assert (await rpc(ws, STATE))["type"] == "state"  # one-shot, then answers resume


async def test_refuse_next_upgrades(server: EnvServer) -> None:
    """The next N upgrades are refused with the status and Retry-After; then accepted."""
    server.faults.refuse = 2
    server.faults.refuse_status = 429
    server.faults.retry_after = 3
    for _ in range(2):
        with pytest.raises(InvalidStatus) as info:
            async with open_ws(server):
                pass
        assert info.value.response.status_code == 429
        assert info.value.response.headers["Retry-After"] == "3"
    async with open_ws(server) as ws:
        assert (await rpc(ws, STATE))["type"] == "state"
    assert server.counter("refused") == 2


async def test_refuse_for_a_while(server: EnvServer) -> None:
    """refuse_for() refuses with 503 (default) until the window ends."""
    server.faults.refuse_for(60)
    with pytest.raises(InvalidStatus) as info:
        async with open_ws(server):
            pass
    assert info.value.response.status_code == 503
    assert "Retry-After" not in info.value.response.headers
    server.faults.refuse_until = time.monotonic()  # window over
    async with open_ws(server) as ws:
        assert (await rpc(ws, STATE))["type"] == "state"


async def test_faults_given_at_construction() -> None:
    """A Faults passed to EnvServer is the live server-wide instance."""
    faults = Faults(error_frames=1)
    async with EnvServer(faults=faults, ping_interval=None) as srv:
        assert srv.faults is faults
        async with open_ws(srv) as ws:
            assert (await rpc(ws, STATE))["data"]["code"] == "EXECUTION_ERROR"
    faults.latency = 1.0
    faults.clear()
    assert faults == Faults()


async def test_wait_for_request_counts_server_wide(server: EnvServer) -> None:
    """wait_for_request(kind, n) returns once the nth such request arrived on any connection."""
    waiter = asyncio.ensure_future(server.wait_for_request("step", 2))
    async with open_ws(server) as a, open_ws(server) as b:
        await rpc(a, step({"message": "1"}))
        assert not waiter.done()
        await rpc(b, step({"message": "2"}))
        await asyncio.wait_for(waiter, 5)
    assert server.counter("request.step") == 2


async def test_stop_does_not_wait_out_injected_latency() -> None:
    """A server stopping while an answer is delayed by injected latency stops promptly."""
    server = EnvServer(env="echo")
    await server.start()
    server.faults.latency = 30.0
    async with open_ws(server) as ws:
        await ws.send('{"type": "state"}')
        await server.wait_for_request("state", 1)
        start = time.perf_counter()
        await server.stop()
        assert time.perf_counter() - start < 5.0


async def test_closed_connections_are_not_kept_alive_by_their_handles(server: EnvServer) -> None:
    """The handles the server remembers do not keep closed connections (and buffers) alive."""
    import gc

    from websockets.asyncio.server import ServerConnection

    for _ in range(20):
        async with open_ws(server) as ws:
            await rpc(ws, STATE)
    await server.wait_for_disconnect(20)
    handle = await server.wait_for_connection(20)
    assert handle.closed and handle.lost.done()
    handle.abort()  # harmless once closed
    handle.stall()
    handle.unstall()
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, ServerConnection)]
    assert len(alive) <= 1, len(alive)


_MODES = {
    "extensions": [],
    "plain": ["--no-extensions"],
    "detached": ["--detached-sessions"],
    "detached-plain": ["--detached-sessions", "--no-extensions"],
}


@pytest.mark.parametrize("mode", sorted(_MODES))
async def test_drop_after_lands_on_the_same_step_in_every_mode(mode: str) -> None:
    """`--drop-after 3 --drop-mode after_apply` drops the connection at the 3rd request a
    session's client sends (reset, step, step: the second step) whatever the server's mode:
    a client attaching to a detached session first reads its state to confirm the attach,
    and that read is not counted (it used to be, so the first step was dropped)."""
    args = build_parser().parse_args(
        ["--env", "deterministic", "--port", "0", "--drop-after", "3",
         "--drop-mode", "after_apply", *_MODES[mode]])
    seen: list[str] = []
    async with EnvServer(**options_from_args(args)) as srv:
        srv.add_counter_listener(lambda name, _value: seen.append(name))
        # "auto" attaches to a detached session wherever the server offers them.
        env = GenericEnvClient(srv.url, on_session_lost="auto")
        with set_testing():
            try:
                await env.reset(seed=1, max_steps=10)
                for _ in range(3):
                    with contextlib.suppress(OutcomeUnknownError):
                        await env.step({"move": 1})
            finally:
                await env.close()
    before_drop = seen[:seen.index("drop")]
    assert before_drop.count("request.step") == 2, before_drop
    assert before_drop.count("request.reset") == 1, before_drop
    # The detached modes do take the path that confirms an attach.
    assert ("request.state" in before_drop) == mode.startswith("detached"), before_drop
