"""Drive OpenEnv's own client against a server; print what happened as JSON.

Runs under the openenv virtualenv's python (it imports ``openenv``, never
``envlink``). The pytest side starts envlink's reference server, runs one
scenario here as a subprocess, and asserts on the JSON printed as the last line
of stdout. Exceptions are reported as ``{"error": {"type", "message"}}`` entries
so the test can tell an expected server error from a crash.

Usage::

    python tests/interop/clients/openenv_client_driver.py SCENARIO BASE_URL [--count N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from openenv.core import EnvClient, GenericEnvClient
from openenv.core.client_types import StepResult
from openenv.core.env_server import Observation, State

TAG_HEADER = "x-interop-test"


def _result(result: StepResult[Any]) -> dict[str, Any]:
    observation = result.observation
    if hasattr(observation, "model_dump"):
        observation = observation.model_dump(mode="json")
    return {"observation": observation, "reward": result.reward, "done": result.done}


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": str(exc)}}


# ------------------------------------------------------------ echo, generic client


def _echo_actions() -> list[dict[str, Any]]:
    return [
        {"type": "list_tools"},
        {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}},
        {"type": "call_tool", "tool_name": "echo_with_length", "arguments": {"message": "four"}},
    ]


async def echo_async(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """GenericEnvClient, async: reset, MCP steps, state, close."""
    out: dict[str, Any] = {"steps": []}
    async with GenericEnvClient(base_url=url, headers=headers, message_timeout_s=20) as env:
        # What the server answered to the upgrade (OpenEnv's client ignores it).
        out["response_headers"] = {k.lower(): v for k, v in env._ws.response.headers.raw_items()}
        out["reset"] = _result(await env.reset())
        for action in _echo_actions():
            out["steps"].append(_result(await env.step(action)))
        out["state"] = await env.state()
    return out


def echo_sync(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """GenericEnvClient through OpenEnv's sync wrapper."""
    out: dict[str, Any] = {"steps": []}
    with GenericEnvClient(base_url=url, headers=headers, message_timeout_s=20).sync() as env:
        out["reset"] = _result(env.reset())
        for action in _echo_actions():
            out["steps"].append(_result(env.step(action)))
        out["state"] = env.state()
    return out


async def echo_errors(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """An invalid action gives a server error; the session is still usable afterwards."""
    out: dict[str, Any] = {}
    async with GenericEnvClient(base_url=url, headers=headers, message_timeout_s=20) as env:
        await env.reset()
        try:
            out["bad_step"] = _result(await env.step({"bogus_field": 1}))
        except Exception as exc:  # OpenEnv raises RuntimeError("Server error: ... (code: X)")
            out["bad_step"] = _error(exc)
        out["good_step"] = _result(await env.step(
            {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "ok"}}))
        out["state"] = await env.state()
    return out


async def capacity(url: str, headers: dict[str, str], count: int = 1, **_: Any) -> dict[str, Any]:
    """Hold ``count`` sessions open, then try one more; then free one and retry."""
    held = [GenericEnvClient(base_url=url, headers=headers, message_timeout_s=20)
            for _ in range(count)]
    out: dict[str, Any] = {}
    try:
        for env in held:
            await env.connect()
            await env.reset()
        extra = GenericEnvClient(base_url=url, headers=headers, message_timeout_s=20)
        try:
            out["extra"] = _result(await extra.reset())
        except Exception as exc:
            out["extra"] = _error(exc)
        finally:
            await extra.close()
        await held.pop().close()
        again = GenericEnvClient(base_url=url, headers=headers, message_timeout_s=20)
        try:
            out["after_release"] = _result(await again.reset())
        except Exception as exc:
            out["after_release"] = _error(exc)
        finally:
            await again.close()
    finally:
        for env in held:
            await env.close()
    return out


# -------------------------------------------------------------- a typed client


@dataclass
class WalkAction:
    """Move the walker of envlink's deterministic environment."""

    move: int


class WalkObservation(Observation):
    position: int
    draw: int
    step: int


class WalkState(State):
    position: int
    seed: int
    max_steps: int


class WalkEnv(EnvClient[WalkAction, WalkObservation, WalkState]):
    """A typed OpenEnv client, written the way OpenEnv's docs say."""

    def _step_payload(self, action: WalkAction) -> dict[str, Any]:
        return {"move": action.move}

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[WalkObservation]:
        observation = WalkObservation(**payload["observation"], done=payload.get("done", False),
                                      reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> WalkState:
        return WalkState(**payload)


async def typed(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """A typed EnvClient subclass; two episodes with one seed give equal observations."""
    out: dict[str, Any] = {"episodes": []}
    async with WalkEnv(base_url=url, headers=headers, message_timeout_s=20) as env:
        for _ in range(2):
            episode = [_result(await env.reset(seed=11, max_steps=3))]
            for move in (1, -2, 5):
                episode.append(_result(await env.step(WalkAction(move=move))))
            out["episodes"].append(episode)
        out["state"] = (await env.state()).model_dump(mode="json")
    return out


def typed_sync(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """The same typed client through OpenEnv's sync wrapper."""
    out: dict[str, Any] = {"steps": []}
    with WalkEnv(base_url=url, headers=headers, message_timeout_s=20).sync() as env:
        out["reset"] = _result(env.reset(seed=11, max_steps=3))
        for move in (1, -2, 5):
            out["steps"].append(_result(env.step(WalkAction(move=move))))
        out["state"] = env.state().model_dump(mode="json")
    return out


async def restart(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """Mid-episode, print CHECKPOINT and wait for a line on stdin (the test restarts the
    server meanwhile), then step again and start a new episode."""
    out: dict[str, Any] = {}
    env = WalkEnv(base_url=url, headers=headers, message_timeout_s=20)
    try:
        out["before"] = _result(await env.reset(seed=3, max_steps=5))
        out["first_step"] = _result(await env.step(WalkAction(move=1)))
        print("CHECKPOINT", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        try:
            out["interrupted"] = _result(await env.step(WalkAction(move=1)))
        except Exception as exc:
            out["interrupted"] = _error(exc)
        out["new_episode"] = _result(await env.reset(seed=3, max_steps=5))
        out["new_first_step"] = _result(await env.step(WalkAction(move=1)))
    finally:
        await env.close()
    return out


async def detached(url: str, headers: dict[str, str], **_: Any) -> dict[str, Any]:
    """MCPToolClient in production mode: a detached session (POST /mcp
    openenv/session/create, /ws?session_id=), an episode on it, then close."""
    from openenv.core import MCPToolClient
    from openenv.core.env_server.mcp_types import CallToolAction

    out: dict[str, Any] = {}
    env = MCPToolClient(base_url=url, headers=headers, message_timeout_s=20)
    try:
        await env.connect()
        out["session_id"] = env._production_session_id
        out["reset"] = _result(await env.reset())
        out["step"] = _result(await env.step(
            CallToolAction(tool_name="echo_message", arguments={"message": "hi"})))
        state = await env.state()
        out["state"] = {"step_count": state.step_count}
    finally:
        await env.close()
    out["closed_session_id"] = env._production_session_id
    return out


SCENARIOS: dict[str, Callable[..., Any]] = {
    "detached": detached,
    "echo_async": echo_async,
    "echo_sync": echo_sync,
    "echo_errors": echo_errors,
    "capacity": capacity,
    "typed": typed,
    "typed_sync": typed_sync,
    "restart": restart,
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("base_url")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--tag", default="openenv-client")
    args = parser.parse_args()
    scenario = SCENARIOS[args.scenario]
    kwargs = {"headers": {TAG_HEADER: args.tag}, "count": args.count}
    result = scenario(args.base_url, **kwargs)
    if isinstance(result, Awaitable):
        result = asyncio.run(result)  # type: ignore[arg-type]
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
