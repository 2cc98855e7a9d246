"""An OpenEnv echo server, equivalent to OpenEnv's ``echo_env`` example.

Built only with OpenEnv's public server API: an ``MCPEnvironment`` whose FastMCP
server has the two tools of the example (``echo_message``, ``echo_with_length``),
served by ``create_app`` with the MCP action and observation types, so ``step``
takes ``{"type": "call_tool", ...}`` and ``{"type": "list_tools"}``.

Usage (with the openenv virtualenv's python)::

    python tests/interop/servers/echo_server.py --port 0 [--max-sessions N] [--frame-log F]
"""

from __future__ import annotations

from typing import Any
from uuid import uuid4

from _harness import concurrency, parse_args, serve
from fastmcp import FastMCP
from openenv.core.env_server import (
    Action,
    CallToolAction,
    CallToolObservation,
    MCPEnvironment,
    Observation,
    State,
    create_app,
)


class EchoObservation(Observation):
    """What ``reset`` answers, as in the example."""

    echoed_message: str
    message_length: int


class EchoEnvironment(MCPEnvironment):
    """Echoes messages back through MCP tools."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        mcp = FastMCP("echo_env")

        @mcp.tool
        def echo_message(message: str) -> str:
            """Echo back the provided message."""
            return message

        @mcp.tool
        def echo_with_length(message: str) -> dict[str, Any]:
            """Echo back the message with its length."""
            return {"message": message, "length": len(message)}

        super().__init__(mcp)
        self._state = State(episode_id=str(uuid4()), step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> EchoObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        return EchoObservation(echoed_message="Echo environment ready!", message_length=0,
                               done=False, reward=0.0)

    def _step_impl(self, action: Action, timeout_s: float | None = None,
                   **kwargs: Any) -> Observation:
        # Only MCP actions reach this server (its action class is CallToolAction).
        raise ValueError(f"unsupported action {type(action).__name__}")

    def step(self, action: Action, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        self._state.step_count += 1
        return super().step(action, timeout_s=timeout_s, **kwargs)

    async def step_async(self, action: Action, timeout_s: float | None = None,
                         **kwargs: Any) -> Observation:
        # The WebSocket path calls step_async; count those steps too.
        self._state.step_count += 1
        return await super().step_async(action, timeout_s=timeout_s, **kwargs)

    @property
    def state(self) -> State:
        return self._state


def main() -> None:
    args = parse_args(__doc__ or "")
    app = create_app(EchoEnvironment, CallToolAction, CallToolObservation,
                     env_name="echo_env", **concurrency(args))
    serve(app, args)


if __name__ == "__main__":
    main()
