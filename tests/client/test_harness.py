"""The /harness client (RFC 005 events) against the reference server's echo harness."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest
from opentelemetry.trace import SpanKind

from envlink import (
    Bridge,
    CallTimeoutError,
    HarnessClient,
    HarnessEvent,
    HarnessEventType,
    HarnessProtocolError,
    HarnessTurnError,
    ProtocolError,
    ReentrantCallError,
    Timeout,
)
from envlink.server import ServerThread

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(30)

TURN = ["llm_request", "llm_response", "tool_call", "tool_result", "llm_request",
        "llm_response", "text_output", "turn_complete"]


def test_a_turn_streams_typed_events(server_thread: ServerThread) -> None:
    """session_started gives the session id and harness name; a turn is an async iterator
    of typed events ending with turn_complete, and the session takes a second turn."""

    async def main() -> None:
        async with HarnessClient(server_thread.url) as harness:
            assert harness.session_id and harness.harness == "envlink-echo"
            events = [event async for event in harness.send("hello")]
            assert [e.type.value for e in events] == TURN
            assert all(isinstance(e, HarnessEvent) for e in events)
            assert events[2].data == {"tool_name": "echo_message",
                                      "arguments": {"message": "hello"}}
            assert events[-1].type is HarnessEventType.TURN_COMPLETE
            assert events[-1].data["response"] == "hello"
            again = await harness.turn("again")
            assert again[-1].data["response"] == "again"

    asyncio.run(main())


def test_a_failed_turn_is_terminal(server_thread: ServerThread) -> None:
    """A terminal error event raises HarnessTurnError; the session is over (the next turn
    opens a new one)."""

    async def main() -> None:
        async with HarnessClient(server_thread.url) as harness:
            first = harness.session_id
            with pytest.raises(HarnessTurnError, match="harness turn failed"):
                await harness.turn("!fail")
            assert (await harness.turn("next"))[-1].data["response"] == "next"
            assert harness.session_id != first

    asyncio.run(main())


def test_one_span_per_turn(server_thread: ServerThread, otel: Otel) -> None:
    """Each turn is one client span harness_turn, ok or error."""

    async def main() -> None:
        async with HarnessClient(server_thread.url, tracer_provider=otel.tracer_provider,
                                 meter_provider=otel.meter_provider) as harness:
            await harness.turn("one")
            with pytest.raises(HarnessTurnError):
                await harness.turn("!fail")

    asyncio.run(main())
    spans = [s for s in otel.spans() if s.name == "harness_turn"]
    assert len(spans) == 2
    assert all(s.kind is SpanKind.CLIENT for s in spans)
    assert [s.status.is_ok for s in spans] == [True, False]


class _Scripted:
    """A connection answering each sent message with scripted frames (unit tests only)."""

    def __init__(self, frames: list[Any]) -> None:
        self.frames: asyncio.Queue[Any] = asyncio.Queue()
        self.script = frames
        self.sent: list[str] = []
        self.aborted = False

    async def send(self, text: str) -> None:
        self.sent.append(text)
        for frame in self.script.pop(0):
            self.frames.put_nowait(frame)

    async def recv(self) -> str:
        frame = await self.frames.get()
        return frame if isinstance(frame, str) else json.dumps(frame)

    async def close(self, timeout: float | None) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


class _Transport:
    def __init__(self, conn: _Scripted) -> None:
        self.conn = conn

    async def connect(self, endpoint: Any, options: Any, *, headers: Mapping[str, str],
                      timeout: float | None, offer_extensions: bool = True) -> Any:
        assert endpoint.ws_url.endswith("/harness")
        self.conn.frames.put_nowait({"type": "session_started",
                                     "data": {"session_id": "s1", "harness": "fake"}})
        return self.conn


def test_protocol_error_is_typed_and_recoverable() -> None:
    """A protocol_error answer raises HarnessProtocolError (with its code) and the same
    connection takes the next turn."""
    conn = _Scripted([
        [{"type": "protocol_error", "data": {"message": "Invalid message", "code":
                                             "VALIDATION_ERROR"}}],
        [{"type": "turn_complete", "data": {"response": "ok"}}],
    ])

    async def main() -> None:
        async with HarnessClient("http://127.0.0.1:1", transport=_Transport(conn),
                                 hooks=[]) as harness:
            with pytest.raises(HarnessProtocolError) as caught:
                await harness.turn("bad")
            assert caught.value.code == "VALIDATION_ERROR"
            assert (await harness.turn("good"))[-1].data["response"] == "ok"
            assert not conn.aborted

    asyncio.run(main())


def test_a_bad_frame_is_a_protocol_error() -> None:
    """An event of unknown type (or not JSON) is the server's ProtocolError, and the
    session is dropped."""
    conn = _Scripted([[{"type": "mystery", "data": {}}]])

    async def main() -> None:
        async with HarnessClient("http://127.0.0.1:1", transport=_Transport(conn),
                                 hooks=[]) as harness:
            with pytest.raises(ProtocolError, match="not a harness event"):
                await harness.turn("x")
        assert conn.aborted

    asyncio.run(main())


def test_a_turn_has_a_deadline() -> None:
    """A turn whose turn_complete never comes raises CallTimeoutError at its deadline and
    drops the session (late events could not be told from the next turn's)."""
    conn = _Scripted([[{"type": "text_output", "data": {"text": "partial"}}]])

    async def main() -> None:
        async with HarnessClient("http://127.0.0.1:1", transport=_Transport(conn),
                                 hooks=[]) as harness:
            seen: list[str] = []
            with pytest.raises(CallTimeoutError):
                async for event in harness.send("x", timeout=0.2):
                    seen.append(event.type.value)
            assert seen == ["text_output"]
        assert conn.aborted

    asyncio.run(main())


def test_sync_form(server_thread: ServerThread) -> None:
    """sync(): send() is a blocking iterator of the same events, turn() a blocking call,
    and closing ends the owned bridge thread."""
    import threading

    before = {t for t in threading.enumerate() if t.name.startswith("envlink")}
    with HarnessClient(server_thread.url).sync() as harness:
        assert [e.type.value for e in harness.send("hi")] == TURN
        assert harness.turn("two")[-1].data["response"] == "two"
    after = {t for t in threading.enumerate() if t.name.startswith("envlink")}
    assert after - before == set()


def test_sync_waits_come_from_the_configured_timeouts() -> None:
    """The facade's waits are the client's own deadlines (plus the margin): a turn may
    open the session first, connect waits twice the connect phase, close the close phase."""
    harness = HarnessClient("http://127.0.0.1:1", hooks=[],
                            timeout=Timeout(connect=1.0, call=3.0, close=2.0))
    assert harness.call_deadline("connect") == 2.0
    assert harness.call_deadline("turn") == harness.call_deadline("send") == 5.0
    assert harness.call_deadline("turn", 0.5) == 2.5
    assert harness.call_deadline("close") == 2.0
    assert HarnessClient("http://127.0.0.1:1", hooks=[],
                         timeout=Timeout(call=None)).call_deadline("turn") is None


@pytest.mark.parametrize("how", ["send", "turn"])
def test_a_sync_timeout_is_the_turns_own_deadline(how: str) -> None:
    """A blocking send() or turn() with timeout= hands it to the turn: the client's own
    CallTimeoutError at that deadline, which drops the session, not the bridge's."""
    conn = _Scripted([[{"type": "text_output", "data": {"text": "partial"}}]])
    harness = HarnessClient("http://127.0.0.1:1", transport=_Transport(conn), hooks=[]).sync()
    with harness:
        with pytest.raises(CallTimeoutError, match="harness_turn did not complete"):
            if how == "send":
                list(harness.send("x", timeout=0.2))
            else:
                harness.turn("x", timeout=0.2)
        assert conn.aborted


def test_sync_close_is_the_blocking_facades() -> None:
    """close() is the client facade's: refused from the bridge's loop thread (the facade
    stays open), idempotent, the owned bridge closed with the session, a given one kept."""
    conn = _Scripted([])
    harness = HarnessClient("http://127.0.0.1:1", transport=_Transport(conn), hooks=[]).sync()
    harness.connect()

    async def close_on_the_loop() -> None:
        harness.close()

    with pytest.raises(ReentrantCallError):
        harness.bridge.call(close_on_the_loop, timeout=5.0)
    assert not harness.bridge.closed
    harness.close()
    harness.close()
    assert harness.bridge.closed
    with Bridge() as bridge:
        shared = HarnessClient("http://127.0.0.1:1", transport=_Transport(_Scripted([])),
                               hooks=[]).sync(bridge)
        shared.connect()
        shared.close()
        assert not bridge.closed
