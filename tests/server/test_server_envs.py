"""The built-in environments: echo (like OpenEnv's example) and deterministic."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from envlink.server import (
    ActionRejectedError,
    DeterministicEnvironment,
    EchoEnvironment,
    Environment,
    EnvServer,
    InvalidActionError,
    SnapshotEnvironment,
    StepResult,
)

from ._server_support import RESET, STATE, open_ws, rpc, step

pytestmark = pytest.mark.timeout(15)


def call_tool(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


# ------------------------------------------------------------------------------ echo


async def test_echo_reset_ready_message(server: EnvServer) -> None:
    """Reset observation carries the OpenEnv echo ready message, reward 0.0, not done."""
    async with open_ws(server) as ws:
        data = (await rpc(ws, RESET))["data"]
    assert data["observation"]["echoed_message"] == "Echo environment ready!"
    assert data["observation"]["message_length"] == 0
    assert data["reward"] == 0.0
    assert data["done"] is False


async def test_echo_plain_message(server: EnvServer) -> None:
    """A plain {"message": m} action echoes m, its length, reward len*0.1 and metadata."""
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        data = (await rpc(ws, step({"message": "Hello"})))["data"]
    assert data["observation"]["echoed_message"] == "Hello"
    assert data["observation"]["message_length"] == 5
    assert data["reward"] == pytest.approx(0.5)
    assert data["done"] is False
    assert data["metadata"] == {"original_message": "Hello", "step_count": 1}


async def test_echo_call_tool_echo_message(server: EnvServer) -> None:
    """call_tool echo_message returns an observation whose result is the message."""
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        data = (await rpc(ws, step(call_tool("echo_message", message="Hi!"))))["data"]
    assert data["observation"]["result"] == "Hi!"
    assert data["observation"]["tool_name"] == "echo_message"
    assert data["observation"]["error"] is None
    assert data["done"] is False


async def test_echo_call_tool_echo_with_length(server: EnvServer) -> None:
    """call_tool echo_with_length returns {"message": m, "length": len(m)}."""
    async with open_ws(server) as ws:
        data = (await rpc(ws, step(call_tool("echo_with_length", message="abcd"))))["data"]
    assert data["observation"]["result"] == {"message": "abcd", "length": 4}


async def test_echo_list_tools(server: EnvServer) -> None:
    """list_tools lists both tools with MCP-style name, description and input schema."""
    async with open_ws(server) as ws:
        data = (await rpc(ws, step({"type": "list_tools"})))["data"]
    tools = data["observation"]["tools"]
    assert [t["name"] for t in tools] == ["echo_message", "echo_with_length"]
    for tool in tools:
        assert tool["description"]
        assert tool["input_schema"]["type"] == "object"
        assert tool["input_schema"]["required"] == ["message"]


async def test_echo_unknown_tool_error_field(server: EnvServer) -> None:
    """An unknown tool gives an observation with a tool_not_found error, as OpenEnv's MCP env."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, step(call_tool("nope", message="x")))
    assert answer["type"] == "observation"
    obs = answer["data"]["observation"]
    assert obs["result"] is None
    assert obs["error"]["error_type"] == "tool_not_found"
    assert "nope" in obs["error"]["message"]


async def test_echo_invalid_tool_arguments(server: EnvServer) -> None:
    """Bad tool arguments give an observation with an invalid_args error."""
    async with open_ws(server) as ws:
        obs = (await rpc(ws, step(call_tool("echo_message", text="x"))))["data"]["observation"]
    assert obs["error"]["error_type"] == "invalid_args"


async def test_echo_call_tool_missing_name_is_validation_error(server: EnvServer) -> None:
    """A call_tool action without tool_name is rejected VALIDATION_ERROR."""
    async with open_ws(server) as ws:
        answer = await rpc(ws, step({"type": "call_tool"}))
    assert answer["data"]["code"] == "VALIDATION_ERROR"


async def test_echo_state_counts_steps(server: EnvServer) -> None:
    """State reports episode_id and step_count; reset starts a new episode."""
    async with open_ws(server) as ws:
        await rpc(ws, {"type": "reset", "data": {"episode_id": "ep-1"}})
        await rpc(ws, step({"message": "a"}))
        await rpc(ws, step({"type": "list_tools"}))
        assert (await rpc(ws, STATE))["data"] == {"episode_id": "ep-1", "step_count": 2}
        await rpc(ws, RESET)
        state = (await rpc(ws, STATE))["data"]
    assert state["step_count"] == 0
    assert state["episode_id"] != "ep-1"


def test_echo_env_validation_raises_pydantic_error() -> None:
    """Directly, the echo env raises pydantic's ValidationError for an invalid action."""
    env = EchoEnvironment()
    with pytest.raises(ValidationError):
        env.step({"message": 5})


def test_builtin_envs_satisfy_protocols() -> None:
    """Both built-in environments implement Environment and SnapshotEnvironment."""
    for env in (EchoEnvironment(), DeterministicEnvironment()):
        assert isinstance(env, Environment)
        assert isinstance(env, SnapshotEnvironment)


def test_step_result_wire_shape() -> None:
    """StepResult serialises like OpenEnv: metadata inside the observation, and beside it if set."""
    assert StepResult({"a": 1}).to_wire() == {
        "observation": {"metadata": {}, "a": 1}, "reward": None, "done": False}
    assert StepResult({"a": 1}, 1.0, True, {"k": "v"}).to_wire() == {
        "observation": {"metadata": {"k": "v"}, "a": 1}, "reward": 1.0, "done": True,
        "metadata": {"k": "v"}}


# ----------------------------------------------------------------------- deterministic


async def _episode(server: EnvServer, seed: int, moves: list[int]) -> list[str]:
    frames = []
    async with open_ws(server) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {"seed": seed, "max_steps": 5}}))
        frames.append(str(await ws.recv()))
        for move in moves:
            await ws.send(json.dumps(step({"move": move})))
            frames.append(str(await ws.recv()))
    return frames


async def test_deterministic_same_seed_same_bytes(det_server: EnvServer) -> None:
    """Same seed and actions give byte-identical observation frames across sessions."""
    first = await _episode(det_server, 7, [1, -2, 3])
    second = await _episode(det_server, 7, [1, -2, 3])
    other = await _episode(det_server, 8, [1, -2, 3])
    assert first == second
    assert first != other


async def test_deterministic_done_at_max_steps(det_server: EnvServer) -> None:
    """The episode is done at max_steps; stepping further is EXECUTION_ERROR."""
    async with open_ws(det_server) as ws:
        await rpc(ws, {"type": "reset", "data": {"seed": 1, "max_steps": 2}})
        first = (await rpc(ws, step({"move": 1})))["data"]
        second = (await rpc(ws, step({"move": 1})))["data"]
        after = await rpc(ws, step({"move": 1}))
    assert first["done"] is False
    assert second["done"] is True
    assert second["observation"]["position"] == 2
    assert second["observation"]["step"] == 2
    assert 0.0 <= second["reward"] < 1.0
    assert after["data"]["code"] == "EXECUTION_ERROR"


@pytest.mark.parametrize("action", [{"move": "1"}, {"move": True}, {"move": 1, "x": 2}, {}])
async def test_deterministic_rejects_bad_actions(det_server: EnvServer,
                                                 action: dict[str, Any]) -> None:
    """Anything but {"move": int} is VALIDATION_ERROR."""
    async with open_ws(det_server) as ws:
        await rpc(ws, RESET)
        answer = await rpc(ws, step(action))
    assert answer["data"]["code"] == "VALIDATION_ERROR"


async def test_deterministic_bad_seed(det_server: EnvServer) -> None:
    """A non-integer seed is VALIDATION_ERROR."""
    async with open_ws(det_server) as ws:
        answer = await rpc(ws, {"type": "reset", "data": {"seed": "x"}})
    assert answer["data"]["code"] == "VALIDATION_ERROR"


def test_deterministic_snapshot_restore_continues_identically() -> None:
    """A restored snapshot continues with exactly the draws the original would make."""
    env = DeterministicEnvironment()
    env.reset(seed=11, max_steps=10)
    env.step({"move": 2})
    snap = json.loads(json.dumps(env.snapshot()))
    copy = DeterministicEnvironment()
    copy.restore(snap)
    assert copy.step({"move": 1}) == env.step({"move": 1})
    assert copy.state() == env.state()


def test_invalid_action_error_is_value_error() -> None:
    """ActionRejectedError (earlier InvalidActionError) is a ValueError (raised by
    environments for bad input)."""
    assert issubclass(ActionRejectedError, ValueError)
    assert InvalidActionError is ActionRejectedError
