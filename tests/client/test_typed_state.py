"""Typed state: EchoEnv's state() is a State with attributes, still readable as a mapping."""

from __future__ import annotations

import pytest

from envlink import EchoEnv, GenericEnvClient, ProtocolError, State
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)


def test_echo_state_has_attributes_and_reads_as_a_mapping(server_thread: ServerThread) -> None:
    """state().step_count and .episode_id are attributes, and state["step_count"], `in`,
    get() and == with a dict work as they did on the dict envlink returned before."""
    with EchoEnv(base_url=server_thread.url) as env:
        env.reset(episode_id="ep-typed")
        env.call_tool("echo_message", message="one")
        state = env.state()
    assert isinstance(state, State)
    assert state.step_count == 1
    assert state.episode_id == "ep-typed"
    assert state["step_count"] == 1
    assert "episode_id" in state
    assert state.get("missing", "default") == "default"
    assert state == {"episode_id": "ep-typed", "step_count": 1}
    assert dict(state.items()) == state.model_dump()


def test_state_keeps_extra_fields() -> None:
    """A server's own state fields are kept, as attributes and as keys."""
    state = State.model_validate({"episode_id": "e", "step_count": 2, "total": 7})
    assert state.total == 7  # type: ignore[attr-defined]
    assert state["total"] == 7
    assert set(state.keys()) == {"episode_id", "step_count", "total"}
    assert len(state) == 3


def test_state_rejects_a_negative_step_count_as_protocol_error() -> None:
    """A state the server could not have meant (negative step_count) is the server's
    ProtocolError when a typed client parses it."""
    from envlink._client.client import _parse

    env = EchoEnv(base_url="http://127.0.0.1:9")
    with pytest.raises(ProtocolError, match="state"):
        _parse(env._parse_state, {"step_count": -1}, "state")


def test_generic_client_state_stays_a_dict(server_thread: ServerThread) -> None:
    """GenericEnvClient.state() is the payload dict, as OpenEnv's GenericEnvClient returns."""
    with GenericEnvClient(base_url=server_thread.url) as env:
        env.reset()
        assert type(env.state()) is dict
