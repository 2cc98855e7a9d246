"""The client's decisions, driven through MockTransport: no server, no socket."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from envlink import (
    CallTimeoutError,
    ConnectError,
    ConnectionLostError,
    ConnectionOptions,
    GenericEnvClient,
    MockTransport,
    OutcomeUnknownError,
    ProtocolError,
    ReconnectPolicy,
    ServerError,
    SessionLostError,
    Timeout,
)

pytestmark = pytest.mark.timeout(30)

URL = "http://env.test"


@pytest.fixture(autouse=True)
def _no_sockets(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a MockTransport test tried to open a socket")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


def obs(**observation: Any) -> dict[str, Any]:
    return {"type": "observation", "data": {"observation": observation}}


class Scripted:
    """A handler: reset answers step 0; step answers its message, or does what is scripted."""

    def __init__(self) -> None:
        self.steps = 0
        self.script: list[str] = []

    def __call__(self, request: dict[str, Any]) -> Any:
        if request["type"] == "reset":
            self.steps = 0
            return obs(step=0)
        if request["type"] == "state":
            return {"type": "state", "data": {"step_count": self.steps}}
        if request["type"] == "close":
            return None
        action = self.script.pop(0) if self.script else "answer"
        if action == "drop":
            raise ConnectionLostError("server crashed")
        if action == "silence":
            return None
        if action == "garbage":
            return "{not json"
        if action == "error":
            return {"type": "error", "data": {"message": "bad action", "code": "VALIDATION_ERROR"}}
        self.steps += 1
        return obs(step=self.steps, echo=request["data"].get("message"))


async def test_answers_come_from_the_handler_and_requests_are_recorded() -> None:
    """reset/step/state/close go to the handler; its answers come back parsed."""
    handler = Scripted()
    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport) as env:
        assert (await env.reset()).observation == {"step": 0}
        assert (await env.step({"message": "hi"})).observation == {"step": 1, "echo": "hi"}
        assert (await env.state())["step_count"] == 1
    assert [r["type"] for r in transport.requests] == ["reset", "step", "state", "close"]
    assert transport.connections == 1
    assert all("id" not in r for r in transport.requests)  # plain protocol: no envelope extras


async def test_a_written_step_lost_outside_an_episode_is_outcome_unknown() -> None:
    """A drop after a step was sent, with no episode to recover, is never resent."""
    handler = Scripted()
    handler.script = ["drop"]
    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport) as env:
        with pytest.raises(OutcomeUnknownError):
            await env.step({"message": "once"})
    assert [r["type"] for r in transport.requests].count("step") == 1


async def test_a_step_lost_mid_episode_raises_session_lost_with_the_journal() -> None:
    """on_session_lost='raise': the episode's journal comes with the error, no resend."""
    handler = Scripted()
    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport) as env:
        await env.reset()
        await env.step({"message": "a"})
        handler.script = ["drop"]
        with pytest.raises(SessionLostError) as info:
            await env.step({"message": "b"})
        assert info.value.journal is not None and info.value.journal.step_count == 1
        with pytest.raises(SessionLostError):
            await env.step({"message": "c"})  # lost until reset()
        assert (await env.reset()).observation == {"step": 0}


async def test_replay_rebuilds_the_episode_on_a_new_connection() -> None:
    """on_session_lost='replay': reset and recorded steps are resent, then the call finishes."""
    handler = Scripted()
    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport, on_session_lost="replay") as env:
        await env.reset()
        await env.step({"message": "a"})
        handler.script = ["drop"]
        result = await env.step({"message": "b"})
        assert result.observation == {"step": 2, "echo": "b"}
    types = [r["type"] for r in transport.requests]
    assert types == ["reset", "step", "step", "reset", "step", "step", "close"]
    assert transport.connections == 2


async def test_reset_lost_after_sending_is_resent() -> None:
    """reset is idempotent: a drop after it was written is retried on a new connection."""
    calls = 0

    def handler(request: dict[str, Any]) -> Any:
        nonlocal calls
        if request["type"] == "reset":
            calls += 1
            if calls == 1:
                raise ConnectionLostError("dropped")
            return obs(step=0)
        return None

    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport) as env:
        assert (await env.reset()).observation == {"step": 0}
    assert calls == 2 and transport.connections == 2


async def test_malformed_answer_is_a_protocol_error_and_the_connection_is_discarded() -> None:
    """Garbage on the plain protocol: ProtocolError, and the next call gets a new connection."""
    handler = Scripted()
    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport) as env:
        await env.reset()
        handler.script = ["garbage"]
        with pytest.raises(ProtocolError, match="not valid JSON"):
            await env.step({"message": "x"})
        assert not env.connected


async def test_error_frame_is_a_server_error_and_silence_a_deadline() -> None:
    """An error frame raises ServerError with its code; no answer runs into the deadline."""
    handler = Scripted()
    async with GenericEnvClient(URL, transport=MockTransport(handler)) as env:
        await env.reset()
        handler.script = ["error"]
        with pytest.raises(ServerError) as info:
            await env.step({"message": "x"})
        assert info.value.code == "VALIDATION_ERROR"
        handler.script = ["silence"]
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "x"}, timeout=0.05)


async def test_with_extensions_a_late_answer_never_reaches_the_next_call() -> None:
    """Request ids: the answer to a timed-out step is dropped, the next call gets its own."""
    held: list[dict[str, Any]] = []

    def handler(request: dict[str, Any]) -> Any:
        if request["type"] != "step":
            return obs() if request["type"] == "reset" else None
        if request["data"]["message"] == "slow":
            held.append(request)
            return None
        # The slow answer arrives first (with its own id), then this request's answer.
        late = [{**obs(echo="slow"), "id": held.pop()["id"]}] if held else []
        return [*late, obs(echo=request["data"]["message"])]

    transport = MockTransport(handler, extensions=True)
    async with GenericEnvClient(URL, transport=transport) as env:
        assert env.extensions_active
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "slow"}, timeout=0.05)
        got = await env.step({"message": "mine"}, timeout=5)
        assert got.observation == {"echo": "mine"}
        assert env.connected  # the connection was kept: ids make the late answer harmless
    assert all("id" in r for r in transport.requests)
    assert transport.connections == 1


async def test_without_extensions_a_timed_out_call_discards_the_connection() -> None:
    """Plain protocol: after a deadline with the frame sent, the next call uses a new connection."""
    handler = Scripted()
    transport = MockTransport(handler)
    async with GenericEnvClient(URL, transport=transport) as env:
        handler.script = ["silence"]
        with pytest.raises(CallTimeoutError):
            await env.step({"message": "slow"}, timeout=0.05)
        assert (await env.state())["step_count"] == 0
    assert transport.connections == 2


async def test_refused_connections_are_retried_then_reported() -> None:
    """on_connect refusing: the reconnect policy's attempts, then the ConnectError."""
    tries = 0

    def refuse(headers: Any) -> None:
        nonlocal tries
        tries += 1
        raise ConnectError("refused")

    env = GenericEnvClient(URL, transport=MockTransport(Scripted(), on_connect=refuse),
                           reconnect=ReconnectPolicy(max_attempts=3))
    with pytest.raises(ConnectError):
        await env.connect()
    assert tries == 3
    await env.close()


def test_connection_options_object_or_keywords_not_both() -> None:
    """options= is accepted as one object; mixing it with keyword options is a ValueError."""
    options = ConnectionOptions(ping_interval=None, headers=(("Authorization", "x"),))
    env = GenericEnvClient(URL, options=options, transport=MockTransport(Scripted()))
    assert env._options is options
    with pytest.raises(ValueError, match="not both"):
        GenericEnvClient(URL, options=options, ping_interval=5.0)


def test_named_waits_have_defaults_and_are_validated() -> None:
    """The probe and release waits are named Timeout fields; nonsense is refused."""
    t = Timeout(5.0)
    assert (t.probe, t.release) == (2.0, 5.0)
    assert Timeout(probe=0.5).probe == 0.5
    with pytest.raises(ValueError, match="probe"):
        Timeout(probe=0)
    assert ConnectionOptions().close_timeout == 1.0
    assert ConnectionOptions().last_frame_wait == 0.05
    with pytest.raises(ValueError, match="close_timeout"):
        ConnectionOptions(close_timeout=0)


async def test_policies_set_after_construction_take_effect() -> None:
    """reconnect_policy and on_session_lost are live settings, as they were attributes."""
    tries = 0

    def refuse(headers: Any) -> None:
        nonlocal tries
        tries += 1
        raise ConnectError("refused")

    env = GenericEnvClient(URL, transport=MockTransport(Scripted(), on_connect=refuse))
    env.reconnect_policy = ReconnectPolicy(max_attempts=2)
    with pytest.raises(ConnectError):
        await env.connect()
    assert tries == 2
    env.on_session_lost = "replay"
    assert env.on_session_lost == "replay"
    with pytest.raises(ValueError, match="on_session_lost"):
        env.on_session_lost = "retry"  # type: ignore[assignment]
    await env.close()
