"""OpenEnv's harness layer on envlink: a ``ResourceSessionFactory`` whose ``create`` retries.

OpenEnv 0.10's harness API (``openenv.core.harness``) drives a rollout through a
*resource session*: ``initial_messages()``, ``list_tools()``, ``call_tool(name, args)``,
``verify(transcript)``, ``close()``, made by ``factory.create(task, seed=..., episode_id=...)``.
TRL's harness rollout worker and OpenEnv's ``build_harness_rollout_func`` call exactly
that, and a ``create`` that fails drops the rollout. Here ``create`` connects and
resets through envlink's retry primitive: a refused connection, a dropped one or a
full server is tried again with backoff, under the shared retry budget and a deadline,
and a session that could not be made leaves nothing open on the server.

OpenEnv is not required: when it is installed the results are its own
``ToolResult``, ``VerifyResult`` and ``Tool`` types (imported on first use, never at
import); otherwise look-alike dataclasses with the same fields.
"""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from envlink._bridge import Bridge
from envlink._client.client import EnvClient, GenericEnvClient, StepResult
from envlink._errors import ClientClosedError, ToolCallError
from envlink._sansio.policies import ReconnectPolicy
from envlink.integrations._runtime import (
    DEFAULT_CLIENT_OPTIONS,
    Lease,
    reset_until_ready,
    shared_bridge,
)

__all__ = [
    "RESERVED_TOOL_NAMES",
    "EnvlinkResourceSession",
    "EnvlinkSessionFactory",
    "HarnessTool",
    "HarnessToolResult",
    "HarnessVerifyResult",
]

#: Tool names a harness session never forwards (OpenEnv's orchestration controls).
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})

Message = dict[str, Any]


@dataclass
class HarnessTool:
    """An MCP tool as OpenEnv's harness lists it (used when OpenEnv is not installed)."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)


@dataclass
class HarnessToolResult:
    """OpenEnv's ``ToolResult`` fields (used when OpenEnv is not installed)."""

    data: Any = None
    done: bool = False
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass
class HarnessVerifyResult:
    """OpenEnv's ``VerifyResult`` fields (used when OpenEnv is not installed)."""

    env_reward: float | None = None
    done: bool = False
    metrics: dict[str, Any] = field(default_factory=dict)
    artifacts: dict[str, Any] = field(default_factory=dict)


@functools.cache
def _openenv_types() -> tuple[type[Any], type[Any], type[Any]]:
    """OpenEnv's Tool, ToolResult and VerifyResult, or envlink's look-alikes."""
    try:
        from openenv.core.env_server.mcp_types import Tool
        from openenv.core.harness import ToolResult, VerifyResult
    except ImportError:
        return HarnessTool, HarnessToolResult, HarnessVerifyResult
    return Tool, ToolResult, VerifyResult


def _default_messages(result: StepResult[Any], task: Any) -> list[Message]:
    if isinstance(task, Mapping) and "messages" in task:
        return [dict(m) for m in task["messages"]]
    if isinstance(task, Sequence) and not isinstance(task, str) and task \
            and all(isinstance(m, Mapping) for m in task):
        return [dict(m) for m in task]
    text = task.get("prompt") if isinstance(task, Mapping) else task
    return [{"role": "user", "content": str(text if text is not None else "")}]


class EnvlinkResourceSession:
    """One rollout's session (OpenEnv's ``ResourceSession`` shape).

    Made by :meth:`EnvlinkSessionFactory.create`; connected and reset already.
    Safe to use from one thread at a time (the harness worker's pool thread).
    """

    def __init__(self, factory: EnvlinkSessionFactory, lease: Lease,
                 task: Any, result: StepResult[Any]) -> None:
        self._factory = factory
        self._lease = lease
        self._task = task
        self._initial = result
        self._last: StepResult[Any] | None = None
        self._reward = 0.0
        self._steps = 0
        self._tools: list[Any] | None = None

    @property
    def client(self) -> Any:
        """The session's :class:`~envlink.SyncEnvClient`.

        Raises:
            ClientClosedError: the session was closed.
        """
        client = self._lease.client
        if client is None:
            raise ClientClosedError("the harness session is closed")
        return client

    def initial_messages(self) -> list[Message]:
        """The prompt messages of the rollout (built from the task and the reset)."""
        return list(self._factory.initial_messages(self._initial, self._task))

    def list_tools(self) -> list[Any]:
        """The environment's tools as OpenEnv ``Tool`` objects (``name``, ``description``,
        ``input_schema``), fetched once per session.

        Raises:
            EnvlinkError: the server could not list them.
        """
        if self._tools is None:
            tool_cls = _openenv_types()[0]
            listed = self._factory.tools
            if listed is None:
                listed = self._list_from_server()
            self._tools = [
                tool_cls(name=str(t["name"]), description=str(t.get("description") or ""),
                         input_schema=dict(t.get("input_schema") or t.get("inputSchema") or {}))
                for t in listed if str(t.get("name")) not in RESERVED_TOOL_NAMES]
        return list(self._tools)

    def _list_from_server(self) -> list[dict[str, Any]]:
        if self._factory.tool_transport == "mcp":
            return list(self.client.mcp_list_tools())
        observation = self.client.step({"type": "list_tools"}).observation
        tools = observation.get("tools") if isinstance(observation, Mapping) else None
        if not isinstance(tools, list):
            raise ToolCallError("the environment listed no tools", "tool_error",
                                tool_name="list_tools")
        return tools

    def call_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """Call a tool; an error the *tool* reports is the result's ``error``.

        Args:
            name: the tool.
            arguments: its arguments.

        Returns:
            a ``ToolResult`` (``data``, ``done``, ``metadata`` with the reward, ``error``).

        Raises:
            KeyError: a reserved orchestration name (``reset``, ``step``, ...).
            EnvlinkError: the session failed (connection lost beyond recovery, server
                error): the rollout cannot be scored, which is not a tool failure.
        """
        if name in RESERVED_TOOL_NAMES:
            raise KeyError(f"reserved orchestration tool: {name}")
        result_cls = _openenv_types()[1]
        if self._factory.tool_transport == "mcp":
            try:
                value = self.client.mcp_call_tool(name, dict(arguments))
            except ToolCallError as exc:
                return result_cls(error=str(exc))
            self._steps += 1
            return result_cls(data=value)
        step = self.client.step({"type": "call_tool", "tool_name": name,
                                 "arguments": dict(arguments)})
        self._last = step
        self._steps += 1
        if step.reward is not None:
            self._reward += float(step.reward)
        observation = step.observation
        error = observation.get("error") if isinstance(observation, Mapping) else None
        metadata = {"reward": step.reward}
        if error:
            message = error.get("message", error) if isinstance(error, Mapping) else error
            return result_cls(data=None, done=bool(step.done), metadata=metadata,
                              error=str(message))
        data = observation.get("result", observation) \
            if isinstance(observation, Mapping) else observation
        return result_cls(data=data, done=bool(step.done), metadata=metadata)

    def verify(self, transcript: list[Message], final_state: Any | None = None) -> Any:
        """Score the finished rollout.

        Returns:
            a ``VerifyResult``: the factory's ``reward`` of the session, else the last
            step's reward (``None`` when the environment gave none),
            ``done``, and ``metrics`` with the episode's step count and reward sum.
        """
        verify_cls = _openenv_types()[2]
        last = self._last
        if self._factory.reward is not None:
            reward = self._factory.reward(self, transcript)
        else:
            reward = None if last is None or last.reward is None else float(last.reward)
        return verify_cls(
            env_reward=reward, done=bool(last.done) if last is not None else False,
            metrics={"tool_calls": self._steps, "reward_sum": self._reward},
            artifacts={"transcript_length": len(transcript)},
        )

    def close(self) -> None:
        """End the server session. Idempotent."""
        self._lease.release()

    async def acall_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        """:meth:`call_tool`, awaitable on any event loop."""
        return await asyncio.to_thread(self.call_tool, name, arguments)

    async def averify(self, transcript: list[Message], final_state: Any | None = None) -> Any:
        """:meth:`verify`, awaitable."""
        return self.verify(transcript, final_state)

    async def aclose(self) -> None:
        """:meth:`close`, awaitable on any event loop."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> EnvlinkResourceSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class EnvlinkSessionFactory:
    """An OpenEnv ``ResourceSessionFactory`` on envlink: one server session per rollout.

    Example::

        factory = EnvlinkSessionFactory("http://127.0.0.1:8000")
        rollout = build_harness_rollout_func(session_factory=factory,
                                             harness_adapter=MCPHarnessAdapter(), ...)

    Args:
        base_url: the server.
        client_class: the :class:`~envlink.EnvClient` subclass to build.
        client_options: its keyword arguments (``on_session_lost`` defaults to ``"auto"``).
        create_timeout: seconds one :meth:`create` may take, all retries included.
        reconnect: backoff and retry budget of :meth:`create` (default: the client's
            policy). Give several factories one ``RetryBudget`` to share it.
        tools: the tool list (MCP dicts) to offer instead of asking the server.
        tool_transport: ``"step"`` (default: OpenEnv's ``call_tool`` / ``list_tools``
            step actions) or ``"mcp"`` (JSON-RPC ``mcp`` messages, OpenEnv 0.10 servers).
        initial_messages: builds the prompt messages from the reset result and the task
            (default: the task's ``messages``, or the task as one user message).
        reset_kwargs: builds the reset arguments from the task, seed and episode id
            (default: ``seed`` and ``episode_id`` when given).
        reward: ``reward(session, transcript)`` computes the episode's reward in
            :meth:`EnvlinkResourceSession.verify` (e.g. from ``session.client.state()``);
            default: the last step's reward.
        bridge: the loop thread to run on (default: the process's default bridge).
        sampling: accepted and kept (TRL's loop-owning worker passes its sampling
            settings to the factory); unused by envlink.

    Raises:
        ValueError: an unknown ``tool_transport``.
    """

    def __init__(
        self,
        base_url: str,
        *,
        client_class: type[EnvClient[Any, Any, Any]] = GenericEnvClient,
        client_options: Mapping[str, Any] | None = None,
        create_timeout: float = 60.0,
        reconnect: ReconnectPolicy | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_transport: str = "step",
        initial_messages: Callable[[StepResult[Any], Any], list[Message]] | None = None,
        reset_kwargs: Callable[[Any, int | None, str | None], dict[str, Any]] | None = None,
        reward: Callable[[EnvlinkResourceSession, list[Message]], float | None] | None = None,
        bridge: Bridge | None = None,
        sampling: Any = None,
    ) -> None:
        if tool_transport not in ("step", "mcp"):
            raise ValueError(f"tool_transport must be 'step' or 'mcp', got {tool_transport!r}")
        self.base_url = base_url
        self.client_class = client_class
        self.client_options = {**DEFAULT_CLIENT_OPTIONS, **dict(client_options or {})}
        self.create_timeout = float(create_timeout)
        self.reconnect = reconnect
        self.tools = None if tools is None else [dict(t) for t in tools]
        self.tool_transport = tool_transport
        self.initial_messages = initial_messages or _default_messages
        self._reset_kwargs = reset_kwargs
        self.reward = reward
        self._bridge = bridge
        self.sampling = sampling
        self._lock = threading.Lock()
        #: Sessions made and sessions that could not be made, for operators.
        self.created = 0
        self.failed = 0

    def _kwargs(self, task: Any, seed: int | None, episode_id: str | None) -> dict[str, Any]:
        if self._reset_kwargs is not None:
            return dict(self._reset_kwargs(task, seed, episode_id))
        kwargs: dict[str, Any] = {}
        if seed is not None:
            kwargs["seed"] = seed
        if episode_id is not None:
            kwargs["episode_id"] = episode_id
        return kwargs

    def create(self, task: Any, seed: int | None = None,
               episode_id: str | None = None) -> EnvlinkResourceSession:
        """Open, reset and return one session, retrying until :attr:`create_timeout`.

        Args:
            task: the rollout's task (a prompt, messages, or a dataset row).
            seed: the environment seed.
            episode_id: the episode id to give the server.

        Raises:
            EnvlinkError: the session could not be made in time (the last failure, a
                ``CallTimeoutError`` or ``RetryBudgetExhaustedError``); nothing is left
                open on the server.
        """
        bridge = self._bridge or shared_bridge()
        lease = Lease()
        client = self.client_class(self.base_url, **self.client_options).sync(bridge)
        lease.client = client
        try:
            result: StepResult[Any] = bridge.call(
                reset_until_ready, client.async_client, self._kwargs(task, seed, episode_id),
                deadline=self.create_timeout, policy=self.reconnect,
                timeout=self.create_timeout + 5.0, method="harness.create")
        except BaseException:
            lease.release()
            with self._lock:
                self.failed += 1
            raise
        with self._lock:
            self.created += 1
        return EnvlinkResourceSession(self, lease, task, result)

    async def acreate(self, task: Any, seed: int | None = None,
                      episode_id: str | None = None) -> EnvlinkResourceSession:
        """:meth:`create`, awaitable on any event loop (the wait does not block it).

        Raises:
            EnvlinkError: as :meth:`create`.
        """
        return await asyncio.to_thread(self.create, task, seed, episode_id)

    def __repr__(self) -> str:
        return f"<EnvlinkSessionFactory {self.base_url} created={self.created}>"
