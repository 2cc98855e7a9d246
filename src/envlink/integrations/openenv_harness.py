"""OpenEnv's harness layer on envlink: a ``ResourceSessionFactory`` whose ``create`` retries.

OpenEnv 0.10's harness API (``openenv.core.harness``) drives a rollout through a
*resource session*: ``initial_messages()``, ``list_tools()``, ``call_tool(name, args)``,
``verify(transcript)``, ``close()``, made by ``factory.create(task, seed=..., episode_id=...)``.
TRL's harness rollout worker and OpenEnv's ``build_harness_rollout_func`` call exactly
that, and a ``create`` that fails drops the rollout. Here ``create`` connects and
resets through envlink's retry primitive: a refused connection, a dropped one or a
full server is tried again with backoff, under the shared retry budget and a deadline,
and a session that could not be made leaves nothing open on the server.

Loop-owning training (TRL's ``HarnessRolloutWorker`` without a ``harness_adapter``):
the agent runs its own loop inside the environment and the trainer reads back what
it sampled. The factory is then built with ``sampling=`` (the trainer's policy) and
makes :class:`EnvlinkHarnessSession` objects on the server's ``/harness`` stream,
which are OpenEnv ``TrainableSession`` objects (``wait_for_completion()``,
``fetch_training_trace()``) when the server advertises training captures
(``training_trace`` in ``session_started``, envlink's extension of the stream). A
server that gives none is refused at ``create`` with
:class:`TrainingTraceUnavailableError`, never mid-run.

On OpenEnv's own servers the trace comes from OpenEnv's capture proxy
(``openenv.core.harness.capture``): built with ``capture_url=`` as well, the factory
mints each rollout's key on the proxy, resets the environment with its agent pointed
at the proxy under that key (``agent_env``), runs the task as one ``HarnessAction``
step and reads the captured calls back from the proxy: an
:class:`EnvlinkCaptureSession` (see :mod:`envlink.integrations._capture_proxy`).

OpenEnv is not required: when it is installed the results are its own
``ToolResult``, ``VerifyResult`` and ``Tool`` types (imported on first use, never at
import); otherwise look-alike dataclasses with the same fields.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from envlink._bridge import Bridge
from envlink._client.client import EnvClient, GenericEnvClient, StepResult, configured_client
from envlink._client.configuration import ClientConfig, CommonOptions
from envlink._deadlines import deadline
from envlink._errors import (
    CaptureProxyError,
    ClientClosedError,
    HandshakeRejectedError,
    InvalidArgumentError,
    ToolCallError,
    TrainingTraceUnavailableError,
)
from envlink._openenv.harness import HarnessClient, HarnessEvent, HarnessEventType
from envlink._sansio.policies import ReconnectPolicy
from envlink._sync.default_bridge import lease_bridge
from envlink.integrations._capture_proxy import (
    AgentEnv,
    AgentOwnsTheLoop,
    CaptureProxy,
    EnvlinkCaptureSession,
    mint_until_ready,
    openai_agent_env,
    retryable,
)
from envlink.integrations._runtime import (
    DEFAULT_CLIENT_CONFIG,
    Lease,
    adapter_config,
    reset_until_ready,
    retry_until_ready,
    shared_bridge,
    stop_run,
    wait_for_run,
)

__all__ = [
    "DEFAULT_CLIENT_CONFIG",
    "RESERVED_TOOL_NAMES",
    "CaptureProxyError",
    "EnvlinkCaptureSession",
    "EnvlinkHarnessSession",
    "EnvlinkResourceSession",
    "EnvlinkSessionFactory",
    "HarnessTool",
    "HarnessToolResult",
    "HarnessVerifyResult",
    "TrainingTraceUnavailableError",
    "openai_agent_env",
]

#: Tool names a harness session never forwards (OpenEnv's orchestration controls).
RESERVED_TOOL_NAMES = frozenset({"reset", "step", "state", "close"})

Message = dict[str, Any]


def _harness_options(config: ClientConfig) -> CommonOptions:
    """What a factory's client config carries over to the ``/harness`` sessions of
    loop-owning training (the rest is the step client's own)."""
    return {"timeout": config.timeout, "headers": dict(config.options.headers),
            "transport": config.transport, "hooks": config.hooks,
            "tracer_provider": config.tracer_provider,
            "meter_provider": config.meter_provider}


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
    """The task's messages: its ``messages``, a conversational ``prompt`` (a list of
    messages, as TRL's conversational datasets hold), a list of messages, else its
    text (``prompt``, or the task itself) as one user message."""
    if isinstance(task, Mapping) and "messages" in task:
        return [dict(m) for m in task["messages"]]
    text = task.get("prompt") if isinstance(task, Mapping) else task
    if _is_messages(text):
        return [dict(m) for m in text]
    return [{"role": "user", "content": str(text if text is not None else "")}]


def _is_messages(value: Any) -> TypeGuard[Sequence[Mapping[str, Any]]]:
    return (isinstance(value, Sequence) and not isinstance(value, (str, bytes)) and bool(value)
            and all(isinstance(m, Mapping) for m in value))


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
        return self._lease.held("harness session")

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


def _task_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The text of the last user message (the agent's task), text parts of a list joined."""
    for message in reversed(messages):
        if message.get("role", "user") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):
            return "".join(str(part.get("text", "")) for part in content
                           if isinstance(part, Mapping) and part.get("type") == "text")
    return ""


class EnvlinkHarnessSession(AgentOwnsTheLoop):
    """One loop-owning rollout on the server's ``/harness``: OpenEnv's ``TrainableSession``.

    Made (and started) by :meth:`EnvlinkSessionFactory.create` in loop-owning mode: the
    task's text is sent as one harness turn, with the factory's ``sampling``, and the
    agent runs its own loop on the server while the turn's events are collected.
    :meth:`wait_for_completion` waits for ``turn_complete``;
    :meth:`fetch_training_trace` returns the captured model calls as OpenEnv's
    ``TrainingTrace``; :meth:`verify` scores the run. The turn is reported as a
    ``harness_turn`` call (a span) by the harness client's hooks.

    The trainer does not call tools itself in this mode: :meth:`list_tools` is empty
    and :meth:`call_tool` raises.
    """

    def __init__(self, factory: EnvlinkSessionFactory, harness: HarnessClient,
                 bridge: Bridge, task: Any, release: Callable[[], None] | None = None) -> None:
        self._factory = factory
        self._harness = harness
        self._bridge = bridge
        self._release = release
        self._task = task
        self._messages = list(factory.initial_messages(None, task))  # type: ignore[arg-type]
        self._events: list[HarnessEvent] = []
        self._run: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def session_id(self) -> str | None:
        """The server's id of the harness session."""
        return self._harness.session_id

    @property
    def events(self) -> list[HarnessEvent]:
        """The run's events so far (a copy)."""
        return list(self._events)

    def _start(self) -> None:
        content = _task_text(self._messages)

        async def drive() -> None:
            async for event in self._harness.send(content, timeout=self._factory.run_timeout,
                                                  sampling=self._factory.sampling):
                self._events.append(event)

        async def start() -> None:
            self._run = asyncio.get_running_loop().create_task(drive())

        self._bridge.call(start, timeout=5.0, method="harness.start")

    def wait_for_completion(self, timeout_s: float | None = None) -> int:
        """Wait for the agent's run to complete.

        Args:
            timeout_s: seconds to wait (default: until the run's own ``run_timeout``).
                On expiry the run goes on; call again, or close.

        Returns:
            0 (the run ended with ``turn_complete``).

        Raises:
            TimeoutError: ``timeout_s`` passed, or the run exceeded ``run_timeout``
                (a ``CallTimeoutError``; the harness session is then over). The calls
                captured so far stay readable.
            HarnessTurnError: the agent's run failed (a terminal ``error`` event).
            ConnectionLostError: the connection dropped (a harness run cannot be
                resumed: the rollout is lost, never half-scored).
            ClientClosedError: the session was closed, before or during the wait.
        """
        run = self._run
        if run is None or self._closed:
            raise ClientClosedError("the harness session is closed")

        wait_for_run(self._bridge, run, timeout_s, "harness")
        return 0

    def training_turns(self) -> list[dict[str, Any]]:
        """The captured model calls so far, as ``TrainingTurn`` field dicts.

        Raises:
            ValueError: a call was sampled under another policy than the factory's
                ``sampling`` (its tokens are off-policy and must not be trained on).
        """
        wanted = self._factory.sampling
        turns = []
        for event in self._events:
            turn = event.data.get("training_turn")
            if event.type is not HarnessEventType.LLM_RESPONSE or not isinstance(turn, Mapping):
                continue
            turn = dict(turn)
            metadata = dict(turn.get("metadata") or {})
            used = metadata.get("sampling")
            if wanted is not None and used is not None and dict(used) != wanted:
                raise ValueError(f"model call {turn.get('node_id')!r} was sampled with {used}, "
                                 f"not the trainer's policy {wanted}")
            metadata.setdefault("envlink_session_id", self.session_id)
            turn["metadata"] = metadata
            turn["per_token_logps"] = [float(x) for x in turn.get("per_token_logps") or []]
            turns.append(turn)
        return turns

    def fetch_training_trace(self) -> Any:
        """The captured model calls as OpenEnv's ``TrainingTrace`` (needs ``openenv``).

        Raises:
            ValueError: a malformed or off-policy capture (OpenEnv's validation).
            ImportError: OpenEnv is not installed.
        """
        from openenv.core.harness import TrainingTrace

        return TrainingTrace.model_validate({"turns": self.training_turns()})

    def _completion(self) -> HarnessEvent | None:
        for event in reversed(self._events):
            if event.type is HarnessEventType.TURN_COMPLETE:
                return event
        return None

    def verify(self, transcript: list[Message], final_state: Any | None = None) -> Any:
        """Score the run.

        Returns:
            a ``VerifyResult``: the factory's ``reward(session, transcript)``, else the
            environment's ``reward`` in ``turn_complete`` (``None``, unscored, when it
            gave none), ``done``, and ``metrics`` with the run's model and tool calls.
        """
        verify_cls = _openenv_types()[2]
        complete = self._completion()
        data = complete.data if complete is not None else {}
        if self._factory.reward is not None:
            reward = self._factory.reward(self, transcript)  # type: ignore[arg-type]
        else:
            raw = data.get("reward")
            reward = float(raw) if isinstance(raw, (int, float)) and not isinstance(
                raw, bool) else None
        kinds = [event.type for event in self._events]
        return verify_cls(
            env_reward=reward, done=bool(data.get("done", False)),
            metrics={"model_calls": kinds.count(HarnessEventType.LLM_RESPONSE),
                     "tool_calls": kinds.count(HarnessEventType.TOOL_CALL),
                     "completed": complete is not None},
            artifacts={"transcript_length": len(transcript)},
        )

    def close(self) -> None:
        """Stop the run if it is still going and end the harness session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        run = self._run

        async def stop() -> None:
            await stop_run(run)
            await self._harness.close()

        try:
            with contextlib.suppress(Exception):
                self._bridge.call(stop, timeout=10.0, method="harness.close")
        finally:
            if self._release is not None:
                self._release()  # the default bridge's lease: its thread may end now

    def __enter__(self) -> EnvlinkHarnessSession:
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
        client_config: the :class:`~envlink.ClientConfig` of each session's client,
            given exactly (default: :data:`DEFAULT_CLIENT_CONFIG`, which recovers a
            lost session with ``"auto"`` and waits for a full server).
        client_options: deprecated: the client's keyword arguments as a mapping,
            over ``on_session_lost="auto"`` and ``on_capacity="wait"``, made into a
            ``client_config`` once.
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
        sampling: the trainer's sampling policy, for loop-owning training (TRL's
            ``HarnessRolloutWorker`` without an adapter passes it): sent with each
            harness run, and every captured model call must report the same policy.
        loop_owning: make :class:`EnvlinkHarnessSession` objects on ``/harness`` (the
            agent owns the loop) instead of step sessions; default: when ``sampling``
            is given, as TRL's worker does in that mode only.
        run_timeout: seconds one loop-owning run (the agent's whole turn) may take;
            past it ``wait_for_completion`` raises ``TimeoutError`` and the captured
            calls so far stay readable.
        capture_url: the root URL of OpenEnv's capture proxy (``CaptureServer``), as
            both the trainer and the environment's agent reach it. Loop-owning sessions
            then take their trace from it (:class:`EnvlinkCaptureSession`, on the
            server's step sessions) instead of from envlink's ``/harness`` extension,
            which works on OpenEnv's own harness servers.
        capture_admin_key: the proxy's admin key, when it was started with one.
        agent_env: ``agent_env(base_url, key)`` builds what the environment is reset
            with as ``agent_env`` to point its agent at the proxy (default:
            :func:`openai_agent_env`, ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY``).

    Raises:
        ValueError: an unknown ``tool_transport``, or both ``client_config`` and
            ``client_options``.
        InvalidArgumentError: ``capture_url`` without ``sampling`` (or with
            ``loop_owning=False``): nothing would be captured.
        TypeError: a ``client_options`` key that is not client configuration.
    """

    def __init__(
        self,
        base_url: str,
        *,
        client_class: type[EnvClient[Any, Any, Any]] = GenericEnvClient,
        client_config: ClientConfig | None = None,
        client_options: Mapping[str, Any] | None = None,
        create_timeout: float = 60.0,
        reconnect: ReconnectPolicy | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_transport: str = "step",
        initial_messages: Callable[[StepResult[Any], Any], list[Message]] | None = None,
        reset_kwargs: Callable[[Any, int | None, str | None], dict[str, Any]] | None = None,
        reward: Callable[[EnvlinkResourceSession, list[Message]], float | None] | None = None,
        bridge: Bridge | None = None,
        sampling: Mapping[str, Any] | None = None,
        loop_owning: bool | None = None,
        run_timeout: float | None = 600.0,
        capture_url: str | None = None,
        capture_admin_key: str | None = None,
        agent_env: AgentEnv | None = None,
    ) -> None:
        if tool_transport not in ("step", "mcp"):
            raise ValueError(f"tool_transport must be 'step' or 'mcp', got {tool_transport!r}")
        if sampling is not None and not isinstance(sampling, Mapping):
            raise TypeError(f"sampling must be a mapping, got {type(sampling).__name__}")
        if capture_url is not None and sampling is None:
            raise InvalidArgumentError(
                "capture_url= needs sampling=, the trainer's sampling policy: the capture "
                "proxy mints each rollout's key for one policy and captures for training "
                "only under it. Pass sampling={...} (TRL's HarnessRolloutWorker passes it "
                "itself: give capture_url= through functools.partial)")
        if capture_url is not None and loop_owning is False:
            raise InvalidArgumentError(
                "capture_url= is for loop-owning sessions, but loop_owning=False: drop "
                "loop_owning=False, or drop capture_url= for step sessions")
        self.base_url = base_url
        self.client_class = client_class
        self.client_config = adapter_config(client_config, client_options)
        self.create_timeout = float(create_timeout)
        self.reconnect = reconnect
        self.tools = None if tools is None else [dict(t) for t in tools]
        self.tool_transport = tool_transport
        self.initial_messages = initial_messages or _default_messages
        self._reset_kwargs = reset_kwargs
        self.reward = reward
        self._bridge = bridge
        self.sampling = None if sampling is None else dict(sampling)
        #: Whether :meth:`create` makes loop-owning ``/harness`` sessions.
        self.loop_owning = sampling is not None if loop_owning is None else bool(loop_owning)
        self.run_timeout = run_timeout
        #: The capture proxy loop-owning sessions take their trace from (``None``:
        #: envlink's ``/harness`` extension).
        self.capture_url = None if capture_url is None else capture_url.rstrip("/")
        self._capture_admin_key = capture_admin_key
        self.agent_env = agent_env or openai_agent_env
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

    def create(self, task: Any, seed: int | None = None, episode_id: str | None = None
               ) -> EnvlinkResourceSession | EnvlinkHarnessSession | EnvlinkCaptureSession:
        """Open, reset and return one session, retrying until :attr:`create_timeout`.

        In loop-owning mode (:attr:`loop_owning`) the session is a ``/harness`` run
        of the task, already started: an :class:`EnvlinkHarnessSession`; with a
        :attr:`capture_url`, the rollout's key is minted on the capture proxy, the
        environment reset with its agent pointed there and the task's run started: an
        :class:`EnvlinkCaptureSession`.

        Args:
            task: the rollout's task (a prompt, messages, or a dataset row).
            seed: the environment seed.
            episode_id: the episode id to give the server.

        Raises:
            TrainingTraceUnavailableError: loop-owning mode, and the server has no
                ``/harness`` or its harness gives no training trace.
            CaptureProxyError: the capture proxy refused to mint the rollout's key
                (a policy it cannot capture for training, an engine without token
                capture, a wrong admin key).
            EnvlinkError: the session could not be made in time (the last failure, a
                ``CallTimeoutError`` or ``RetryBudgetExhaustedError``); nothing is left
                open on the server.
        """
        if self.loop_owning and self.capture_url is not None:
            return self._create_captured(task, seed, episode_id)
        if self.loop_owning:
            return self._create_run(task)
        lease = Lease()
        client = configured_client(self.client_class, self.base_url,
                                   self.client_config).sync(self._bridge or shared_bridge())
        lease.client = client
        try:
            # The facade's own bridge: a default bridge stopped since it was fetched
            # (its last client closed) was replaced by a live one for this facade.
            result: StepResult[Any] = client.bridge.call(
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

    def _create_captured(self, task: Any, seed: int | None, episode_id: str | None
                         ) -> EnvlinkCaptureSession:
        assert self.capture_url is not None
        proxy = CaptureProxy(self.capture_url, admin_key=self._capture_admin_key)
        # A run is never replayed on a new session: the agent's calls would be
        # captured twice under the rollout's key.
        config = dataclasses.replace(self.client_config, on_session_lost="raise")
        lease = Lease()
        client = configured_client(self.client_class, self.base_url,
                                   config).sync(self._bridge or shared_bridge())
        lease.client = client
        bridge = client.bridge
        policy = self.reconnect or client.async_client.reconnect_policy
        metadata = {"envlink_episode_id": episode_id} if episode_id is not None else {}
        minted: dict[str, Any] | None = None
        started = time.monotonic()
        try:
            minted = bridge.call(
                retry_until_ready, functools.partial(
                    mint_until_ready, proxy, sampling=self.sampling, metadata=metadata),
                deadline=self.create_timeout, policy=policy, operation="capture.mint",
                retry_on=retryable, timeout=self.create_timeout + 5.0,
                method="harness.create")
            key = str(minted["session_id"])
            kwargs = self._kwargs(task, seed, episode_id)
            kwargs["agent_env"] = dict(self.agent_env(self.capture_url, key))
            left = max(1.0, self.create_timeout - (time.monotonic() - started))
            result: StepResult[Any] = bridge.call(
                reset_until_ready, client.async_client, kwargs, deadline=left,
                policy=policy, timeout=left + 5.0, method="harness.create")
            session = EnvlinkCaptureSession(self, lease, proxy, minted, task, result,
                                            _openenv_types()[2])
            session._start(_task_text(session.initial_messages()))
        except BaseException:
            if minted is not None:
                with contextlib.suppress(Exception):
                    bridge.call(proxy.delete, str(minted["session_id"]), timeout=10.0)
            lease.release()
            with self._lock:
                self.failed += 1
            raise
        with self._lock:
            self.created += 1
        return session

    def _create_run(self, task: Any) -> EnvlinkHarnessSession:
        harness = HarnessClient(self.base_url, **_harness_options(self.client_config))
        # A run holds a lease on the default bridge, as a facade does: the bridge's thread
        # must not end (with another client's close) while the run goes on.
        bridge, release = lease_bridge(self._bridge, harness)
        policy = self.reconnect or ReconnectPolicy()

        async def connect(remaining: float) -> HarnessClient:
            async with deadline(remaining, "harness.create"):
                return await harness.connect()

        try:
            try:
                bridge.call(retry_until_ready, connect, deadline=self.create_timeout,
                            policy=policy, operation="harness.connect",
                            timeout=self.create_timeout + 5.0, method="harness.create")
            except HandshakeRejectedError as exc:
                # No such route: 404, or 403 from Starlette (OpenEnv's servers without
                # a harness environment).
                if exc.status not in (403, 404):
                    raise
                raise TrainingTraceUnavailableError(
                    f"{harness._endpoint.display} refused the /harness upgrade (HTTP "
                    f"{exc.status}): the server has no /harness (or refuses it to this "
                    "client), and loop-owning training needs one; train with the "
                    "trainer's own sampling instead (TRL: pass harness_adapter=)") from exc
            if not harness.training_trace:
                raise TrainingTraceUnavailableError(
                    f"the /harness of {harness._endpoint.display} (harness "
                    f"{harness.harness!r}) gives no training trace (its session_started "
                    "does not advertise training_trace): loop-owning training cannot "
                    "train on it; train with the trainer's own sampling instead (TRL: "
                    "pass harness_adapter=)")
            session = EnvlinkHarnessSession(self, harness, bridge, task, release)
            session._start()
        except BaseException:
            with contextlib.suppress(Exception):
                bridge.call(harness.close, timeout=5.0)
            if release is not None:
                release()
            with self._lock:
                self.failed += 1
            raise
        with self._lock:
            self.created += 1
        return session

    async def acreate(self, task: Any, seed: int | None = None, episode_id: str | None = None
                      ) -> EnvlinkResourceSession | EnvlinkHarnessSession | EnvlinkCaptureSession:
        """:meth:`create`, awaitable on any event loop (the wait does not block it).

        Raises:
            EnvlinkError: as :meth:`create`.
        """
        return await asyncio.to_thread(self.create, task, seed, episode_id)

    def __repr__(self) -> str:
        return f"<EnvlinkSessionFactory {self.base_url} created={self.created}>"
