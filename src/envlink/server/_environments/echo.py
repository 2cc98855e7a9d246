"""The echo environment, behaving like OpenEnv's ``echo_env`` example.

- ``reset`` answers ``echoed_message == "Echo environment ready!"`` with reward 0.0.
- A plain ``{"message": m}`` action echoes ``m`` with ``message_length`` and reward
  ``len(m) * 0.1``.
- MCP actions: ``{"type": "list_tools"}`` lists the tools ``echo_message`` and
  ``echo_with_length``; ``{"type": "call_tool", "tool_name": ..., "arguments": ...}``
  answers a ``CallToolObservation`` whose ``result`` is the tool's return value, or
  whose ``error`` names what went wrong (unknown tool, invalid arguments), as
  OpenEnv's ``MCPEnvironment`` does. Tool calls have no reward.
- Actions are validated like OpenEnv's pydantic action models (unknown fields are
  forbidden); a pydantic ``ValidationError`` is answered ``VALIDATION_ERROR``.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from envlink.server._environments.environment import Transition

__all__ = ["READY_MESSAGE", "TOOLS", "EchoEnvironment"]

READY_MESSAGE = "Echo environment ready!"

_MESSAGE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"message": {"type": "string", "title": "Message"}},
    "required": ["message"],
}

#: The MCP tool specifications the echo environment lists.
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "name": "echo_message",
        "description": "Echo back the provided message.",
        "input_schema": _MESSAGE_SCHEMA,
    },
    {
        "name": "echo_with_length",
        "description": "Echo back the message with its length.",
        "input_schema": _MESSAGE_SCHEMA,
    },
)


_OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "EchoObservation", "type": "object",
    "description": "an echo (echoed_message, message_length), a tool list (tools) or a "
                   "tool call's answer (tool_name, result, error)",
    "properties": {
        "echoed_message": {"type": "string"},
        "message_length": {"type": "integer", "minimum": 0},
        "tools": {"type": "array", "items": {"type": "object"}},
        "tool_name": {"type": "string"},
        "result": {},
        "error": {"anyOf": [{"type": "object"}, {"type": "null"}]},
        "done": {"type": "boolean"},
        "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
}


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")

    metadata: dict[str, Any] = Field(default_factory=dict)


class _EchoAction(_Action):
    message: str


class _ListToolsAction(_Action):
    type: Literal["list_tools"] = "list_tools"


class _CallToolAction(_Action):
    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class _MessageArgs(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    message: str


class EchoEnvironment:
    """Echoes messages back; a stand-in for OpenEnv's echo example. Supports snapshots."""

    def __init__(self) -> None:
        self._episode_id = str(uuid.uuid4())
        self._step_count = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              **kwargs: Any) -> Transition:
        """Start an episode; ``seed`` is ignored, ``episode_id`` is used if given."""
        self._episode_id = episode_id or str(uuid.uuid4())
        self._step_count = 0
        return Transition(
            observation={"echoed_message": READY_MESSAGE, "message_length": 0},
            reward=0.0,
            done=False,
        )

    def step(self, action: dict[str, Any]) -> Transition:
        """Echo a message, list the tools or call one.

        Raises:
            pydantic.ValidationError: the action matches none of the action models.
        """
        kind = action.get("type")
        if kind == "list_tools":
            _ListToolsAction.model_validate(action)
            self._step_count += 1
            return Transition(observation={"tools": [dict(t) for t in TOOLS]})
        if kind == "call_tool":
            call = _CallToolAction.model_validate(action)
            self._step_count += 1
            return self._call_tool(call)
        echo = _EchoAction.model_validate(action)
        self._step_count += 1
        message = echo.message
        return Transition(
            observation={"echoed_message": message, "message_length": len(message)},
            reward=len(message) * 0.1,
            done=False,
            metadata={"original_message": message, "step_count": self._step_count},
        )

    def _call_tool(self, call: _CallToolAction) -> Transition:
        result: Any = None
        error: dict[str, str] | None = None
        if call.tool_name not in {t["name"] for t in TOOLS}:
            error = {"error_type": "tool_not_found",
                     "message": f"Unknown tool: {call.tool_name!r}"}
        else:
            try:
                message = _MessageArgs.model_validate(call.arguments).message
            except ValidationError as exc:
                error = {
                    "error_type": "invalid_args",
                    "message": f"Invalid arguments for tool {call.tool_name!r}: "
                    + "; ".join(e["msg"] for e in exc.errors(include_url=False)),
                }
            else:
                if call.tool_name == "echo_message":
                    result = message
                else:
                    result = {"message": message, "length": len(message)}
        return Transition(
            observation={"tool_name": call.tool_name, "result": result, "error": error},
        )

    def metadata(self) -> dict[str, Any]:
        """What ``GET /metadata`` describes."""
        return {"name": "echo_env",
                "description": "Echoes messages back, with the MCP tools echo_message "
                               "and echo_with_length (like OpenEnv's echo example)."}

    def schema(self) -> dict[str, Any]:
        """The action's and observations' JSON schemas, for ``GET /schema``."""
        return {"action": TypeAdapter(_EchoAction | _ListToolsAction | _CallToolAction)
                .json_schema(), "observation": _OBSERVATION_SCHEMA,
                "reset_observation": _OBSERVATION_SCHEMA}

    def state(self) -> dict[str, Any]:
        """``episode_id`` and ``step_count``, like OpenEnv's ``State``."""
        return {"episode_id": self._episode_id, "step_count": self._step_count}

    def snapshot(self) -> dict[str, Any]:
        """The state, for the session store."""
        return self.state()

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Put back a :meth:`snapshot`."""
        self._episode_id = str(snapshot["episode_id"])
        self._step_count = int(snapshot["step_count"])
