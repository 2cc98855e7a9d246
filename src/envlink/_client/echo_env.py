"""A typed client for the echo environment (OpenEnv's echo example), with MCP actions."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from envlink._client.client import EnvClient, StepResult
from envlink._client.dispatch import dispatched
from envlink._errors import ToolCallError
from envlink._sansio.state import State

__all__ = ["CallToolAction", "EchoEnv", "EchoObservation", "ListToolsAction"]


class CallToolAction(BaseModel):
    """Call an MCP-style tool: ``{"type": "call_tool", "tool_name": ..., "arguments": {...}}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["call_tool"] = "call_tool"
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ListToolsAction(BaseModel):
    """List the environment's MCP-style tools: ``{"type": "list_tools"}``."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["list_tools"] = "list_tools"


class EchoObservation(BaseModel):
    """An echo-environment observation.

    Known fields are typed; whatever else the server sends is kept and readable as
    an attribute or by key (``obs.echoed_message``, ``obs["echoed_message"]``).
    """

    model_config = ConfigDict(extra="allow")

    echoed_message: str | None = None
    result: Any = None
    error: Any = None
    tool_name: str | None = None
    tools: list[dict[str, Any]] | None = None

    def __getitem__(self, key: str) -> Any:
        data = self.model_dump()
        return data[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default``."""
        return self.model_dump().get(key, default)


EchoAction = CallToolAction | ListToolsAction | dict[str, Any]


class EchoEnv(EnvClient[EchoAction, EchoObservation, State]):
    """Client for the echo environment: tools ``echo_message`` and ``echo_with_length``.

    Example::

        with EchoEnv(base_url="http://127.0.0.1:8000") as env:
            env.reset()
            result = env.step(CallToolAction(tool_name="echo_message",
                                             arguments={"message": "Hello, World!"}))
            assert result.observation.result == "Hello, World!"
            assert env.state().step_count == 1

    ``state()`` returns a :class:`~envlink.State`.
    """

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[EchoObservation]:
        return StepResult(
            observation=EchoObservation.model_validate(payload.get("observation", {})),
            reward=payload.get("reward"),
            done=bool(payload.get("done", False)),
            metadata=payload.get("metadata"),
        )

    def _parse_state(self, payload: dict[str, Any]) -> State:
        return State.model_validate(payload)

    @dispatched
    async def call_tool(self, tool_name: str, /, **arguments: Any) -> Any:
        """Call a tool and return its value (a step under the hood), as OpenEnv's client does.

        A FastMCP ``CallToolResult`` (what a real OpenEnv MCP server returns, with
        ``content`` and ``data``) is unwrapped to its ``data``. In production mode the
        call goes over ``POST /mcp`` (:meth:`mcp_call_tool`), not through ``step()``.

        Raises:
            ToolCallError: the server reported that the tool call failed (unknown tool,
                invalid arguments, ...).
        """
        if self.mode == "production":
            return await self.mcp_call_tool(tool_name, arguments)
        result = await self.step(CallToolAction(tool_name=tool_name, arguments=arguments))
        obs = result.observation
        if obs.error:
            error = obs.error if isinstance(obs.error, dict) else {"message": str(obs.error)}
            kind = str(error.get("error_type") or "tool_error")
            message = str(error.get("message") or obs.error)
            raise ToolCallError(f"tool {tool_name!r} failed: {message}", kind,
                                tool_name=tool_name)
        value = obs.result
        if isinstance(value, dict) and "data" in value and "content" in value:
            return value["data"]
        return value

    @dispatched
    async def list_tools(self) -> list[dict[str, Any]]:
        """The environment's tools (name, description, input schema)."""
        if self.mode == "production":
            return await self.mcp_list_tools()
        result = await self.step(ListToolsAction())
        return result.observation.tools or []
