"""The hardened async client for the OpenEnv WebSocket protocol.

One :class:`EnvClient` is one session: at most one request in flight, callers
queued FIFO, a deadline on every call, reconnects under a
:class:`~envlink.ReconnectPolicy`, session recovery under ``on_session_lost``,
and never a step applied twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Literal, TypeVar, cast

from pydantic import BaseModel

from envlink._bridge.dispatch import (
    ASYNC,
    SYNC,
    AutoDispatch,
    aclose_after_failed_enter,
    claim,
    close_after_failed_enter,
    run_blocking,
)
from envlink._client import handles
from envlink._client.blocking import SyncEnv, make_sync_facade
from envlink._client.capacity import CapacityGate
from envlink._client.configuration import (
    CLIENT_OPTIONS,
    ClientConfig,
    ClientOptions,
    changed_fields,
    check_keywords,
    check_policy,
    client_mode,
)
from envlink._client.connector import Connector
from envlink._client.driver import SessionDriver, end_turn, take_turn, wait_turn
from envlink._client.handles import SessionHandle
from envlink._client.tasks import TaskAPI
from envlink._config import (
    UNSET,
    CheckedTimeout,
    ConnectionOptions,
    Timeout,
    UnsetType,
    call_seconds,
)
from envlink._errors import (
    ClientClosedError,
    EnvlinkError,
    ProtocolError,
)
from envlink._events.client_events import (
    ClientEvent,
    ClientHook,
    EpisodeTape,
    combine_client_hooks,
)
from envlink._launch import discovery, lifecycle
from envlink._launch.discovery import EnvironmentMetadata, EnvironmentSchema, Health
from envlink._launch.lifecycle import Bootstrap
from envlink._launch.providers import add_note, one_user_call
from envlink._sansio import jsonrpc
from envlink._sansio.journal import EpisodeJournal
from envlink._sansio.policies import (
    ReconnectPolicy,
    RecoveryMechanism,
    SessionLostPolicy,
)
from envlink._sansio.protocol import McpFrame, ObservationFrame, StateFrame, StepResult
from envlink._sansio.replay import same_answer
from envlink._sansio.session import Call, SessionCore
from envlink._transports.base import Endpoint, Transport, parse_endpoint
from envlink.names import LOG_PROVIDER_STOP_FAILED

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # typing_extensions comes with pydantic
    from typing_extensions import Unpack

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider
    from typing_extensions import Self

    from envlink._bridge import Bridge

__all__ = ["EnvClient", "GenericEnvClient", "StepResult", "configured_client"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")
_R = TypeVar("_R")
_F = TypeVar("_F", ObservationFrame, StateFrame, McpFrame)
_perf = time.perf_counter


def _raw(cls: type, name: str) -> Callable[..., Any]:
    """The coroutine method behind the dispatched method ``name`` of ``cls``."""
    raw: Callable[..., Any] = getattr(cls, name)._envlink_raw
    return raw


def _transport_of(given: Transport | str | None) -> Transport:
    # websockets or picows (with urllib.request, http.client, email...) is imported by
    # the first client that needs it, not by `import envlink`.
    if given is None or isinstance(given, str):
        from envlink._transports.choice import transport_named

        return transport_named(given)
    return given


def _telemetry_hook(tracer_provider: TracerProvider | None,
                    meter_provider: MeterProvider | None, url: str) -> ClientHook:
    # The emitter (OpenTelemetry's metrics API, envlink's instruments) is imported by
    # the first client that uses it, not by `import envlink`.
    from envlink._telemetry.client_hook import ClientTelemetryHook

    return ClientTelemetryHook(tracer_provider, meter_provider, url=url)


def _check_tls(endpoint: Endpoint, options: ConnectionOptions) -> None:
    if options.ssl is not None and not endpoint.secure:
        # Authorization would go out in clear while the caller believes it is on TLS.
        raise ValueError(f"ssl= was given but {endpoint.display} is not TLS: use "
                         "https:// or wss://")


class EnvClient(AutoDispatch, Generic[ActT, ObsT, StateT]):
    """Async client for one session on an OpenEnv-compatible server.

    Same surface as OpenEnv's ``EnvClient`` (``connect``, ``reset``, ``step``,
    ``state``, ``close``, ``async with`` and ``with``, the ``_step_payload`` /
    ``_parse_result`` / ``_parse_state`` hooks, ``sync()``), plus deadlines, reconnects
    and recovery. Used as is, actions may be dicts or pydantic models and observations
    are dicts.

    As in OpenEnv 0.10, calls also work without ``await``: in plain code they block
    (on a bridge, as ``sync()``); the client claims "sync" or "async" on first use.

    OpenEnv's own keywords (its five aliases, ``provider`` and ``mode``) are named
    parameters, as in its ``EnvClient``; envlink's are ``**options``, declared once
    in ``ClientOptions`` (``envlink._client.configuration``), which type checkers and
    IDEs read. A keyword that is neither raises ``TypeError``, as Python does.

    Args:
        base_url: ``http(s)://`` or ``ws(s)://`` URL of the server (``/ws`` is added),
            or a Hugging Face Space's name (``"owner/space"``); optional with a provider.
        timeout: a :class:`Timeout`, a number for every phase, or ``None`` for none.
        headers: extra handshake headers (e.g. ``Authorization``); never logged.
        reconnect: the :class:`ReconnectPolicy` for opening connections.
        on_session_lost: ``"raise"`` (default), ``"replay"``, ``"resume"`` or
            ``"auto"`` (resume when the server can, else replay).
        replay_verify: compares a recorded answer with the replayed one during
            ``replay`` (default: equality of the whole ``data`` object).
        max_journal_steps: bound on the steps recorded for ``replay``.
        ping_interval: keepalive ping interval in seconds (``None``: off).
        ping_timeout: seconds without a pong before the peer is declared dead.
        max_message_size: largest accepted frame, in bytes.
        compression: ``None`` (default) or ``"deflate"``.
        ssl: an ``ssl.SSLContext`` for ``wss://`` (default: verified system trust).
        proxy: ``True`` (honour proxy env vars), ``None`` or a proxy URL.
        extensions: offer envlink's protocol extensions to the server.
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).
        connect_timeout_s: OpenEnv-compatible alias for ``Timeout(connect=...)``.
        message_timeout_s: OpenEnv-compatible alias for ``Timeout(call=...)``.
        max_message_size_mb: OpenEnv-compatible alias for ``max_message_size``.
        websocket_ping_interval_s: OpenEnv-compatible alias for ``ping_interval``.
        websocket_ping_timeout_s: OpenEnv-compatible alias for ``ping_timeout``.
        transport: how connections are opened: ``"websockets"``, ``"picows"`` (the
            ``fast`` extra) or ``"auto"`` (picows when installed), or a transport such
            as a :class:`~envlink.MockTransport` to test code without a server
            (default: ``"auto"``; ``ENVLINK_TRANSPORT`` forces one).
        options: every connection option as one :class:`ConnectionOptions`, instead
            of ``headers``, ``ping_interval``, ... (which must then be left out).
        hooks: observers of the client (:class:`ClientHook`); by default envlink's
            OpenTelemetry and structlog emitter. Given, they replace it: include
            ``envlink.telemetry.ClientTelemetryHook(...)`` to keep its telemetry.
        mode: OpenEnv's ``"simulation"`` (default) or ``"production"`` (MCP tool
            calls over ``POST /mcp`` to this session); default ``OPENENV_CLIENT_MODE``
            (MCP clients, :class:`~envlink.MCPToolClient`: ``"production"``).
        limits, on_capacity: sessions per endpoint, and ``"raise"`` or ``"wait"`` when full.
        recorder: a :class:`~envlink.RolloutRecorder` that records every episode of
            the client (``docs/recording.md``).
        fleet: a :class:`~envlink.FleetLimits`: session, start and open-rate limits
            shared by every process that names its store (``docs/fleet.md``).
        provider: an OpenEnv ``ContainerProvider`` or ``RuntimeProvider``, started on
            connect (without ``base_url``), stopped on close, shared with children.
        token: a Space's Hugging Face token (default: ``HF_TOKEN``, the token file).
        config: the whole configuration as one :class:`ClientConfig`, instead of the
            keyword arguments above from ``timeout`` to ``fleet`` (which must
            then be left out); ``client.config`` is it. The keyword arguments build
            one with :meth:`ClientConfig.from_keywords`.

    Raises:
        ValueError: for a malformed URL or option, or ``config`` with keyword
            arguments that set the configuration too.
        InvalidArgumentError: neither ``base_url`` nor ``provider`` (a ``ValueError``).
        TypeError: ``base_url`` is not a string.
        ProviderError: ``provider`` is not a provider.
    """

    #: The mode when ``mode=`` is not given (MCP clients: ``"production"``); ``None``:
    #: ``OPENENV_CLIENT_MODE``, else ``"simulation"``.
    _default_mode: ClassVar[str | None] = None
    #: The methods that dispatch on how they are called (a typed client's overrides too).
    _dispatched_methods: ClassVar[frozenset[str]] = frozenset({
        "connect", "reset", "step", "state", "disconnect", "close", "new_session", "detach",
        "mcp_request", "mcp_list_tools", "mcp_call_tool", "wait_until_ready", "health",
        "schema", "metadata"})

    def __init__(
        self,
        base_url: str | None = None,
        *,
        connect_timeout_s: float | None = None,
        message_timeout_s: float | None = None,
        max_message_size_mb: float | None = None,
        websocket_ping_interval_s: float | UnsetType | None = UNSET,
        websocket_ping_timeout_s: float | UnsetType | None = UNSET,
        provider: Any = None,
        mode: str | None = None,
        token: str | None = None,
        config: ClientConfig | None = None,
        **options: Unpack[ClientOptions],
    ) -> None:
        # OpenEnv's own parameters are named, as in its EnvClient; envlink's are
        # declared once, in ClientOptions (their names computed at import).
        if options and not CLIENT_OPTIONS.issuperset(options):
            check_keywords(options, CLIENT_OPTIONS, f"{type(self).__name__}()")
        inherited = _INHERITED.get()
        if inherited is not None and inherited[0] is type(self):
            # Built by configured_client() (new_session(), a pool, an adapter): the
            # configuration is given whole, whatever this class's own __init__ passed.
            _INHERITED.set(None)
            _cls, config, provider, token = inherited
        else:
            given = ClientConfig.from_keywords(
                connect_timeout_s=connect_timeout_s, message_timeout_s=message_timeout_s,
                max_message_size_mb=max_message_size_mb,
                websocket_ping_interval_s=websocket_ping_interval_s,
                websocket_ping_timeout_s=websocket_ping_timeout_s, mode=mode, **options)
            if config is None:
                config = given
            elif not isinstance(config, ClientConfig):
                raise TypeError(f"config must be a ClientConfig or None, "
                                f"got {type(config).__name__}")
            else:
                conflicting = changed_fields(given)
                if conflicting:
                    raise ValueError(
                        f"pass the configuration either as config= or as keyword arguments, "
                        f"not both (the keyword arguments set {', '.join(conflicting)})")
        self._config: ClientConfig = config
        self._mode = client_mode(config.mode, self._default_mode)
        #: Whether MCP calls go over ``POST /mcp`` (production mode); an MCP client's
        #: ``use_production_mode`` sets it, as OpenEnv's attribute of that name.
        self._production = self._mode == "production"
        wanted = dict(config.options.headers) or None
        self._target = lifecycle.Target.resolve(base_url, provider, wanted, token)
        if config.fleet is not None and self._target.lease is not None:
            # The provider's starts are paced and bounded fleet-wide.
            self._target.lease.fleet = config.fleet
        # Made when first needed: an idle session keeps neither.
        self._children: list[EnvClient[Any, Any, Any]] | None = None
        self._mcp_ids: Iterator[int] | None = None
        self._endpoint = parse_endpoint(self._target.base_url)
        self.timeouts: Timeout = config.timeout
        connection = config.options
        if self._target.headers is not wanted:
            # A Space's token, for that host only: not part of the configuration.
            connection = dataclasses.replace(
                connection, headers=tuple((self._target.headers or {}).items()))
        _check_tls(self._endpoint, connection)
        self._options: ConnectionOptions = connection
        self._transport: Transport = _transport_of(config.transport)
        policy = config.reconnect
        self.tracer_provider = config.tracer_provider
        self.meter_provider = config.meter_provider
        if config.hooks is None:
            hook = _telemetry_hook(config.tracer_provider, config.meter_provider,
                                   self._endpoint.display)
        else:
            hook = combine_client_hooks(list(config.hooks))
        # Every episode on disk, as the caller got it (docs/recording.md).
        self._tape = None if config.recorder is None else config.recorder.tape(
            self._endpoint.display, tracing=config.hooks is None)
        if self._tape is not None:
            hook = self._tape.wrap(hook)
        self._core = SessionCore(policy=policy, on_session_lost=config.on_session_lost,
                                 max_journal_steps=config.max_journal_steps,
                                 production=self._production)
        connector = Connector(self._endpoint, self._options, self._transport, self.timeouts,
                              policy, config.extensions, self._core, hook)
        self._driver: SessionDriver = SessionDriver(
            self._core, connector, hook, self._options, self.timeouts,
            config.replay_verify or same_answer)
        # A provider's server is the client's own (started on connect): no shared limit.
        gate = CapacityGate(self._endpoint.ws_url, config.limits, config.on_capacity,
                            config.fleet,
                            (config.tracer_provider, config.meter_provider))
        self._driver.capacity = gate if self._target.started else None
        connector.prepare = self._prepare_server

    # ------------------------------------------------------------------ properties

    @property
    def config(self) -> ClientConfig:
        """The :class:`ClientConfig` this client runs with (a frozen value).

        The one given as ``config=``, or the one the keyword arguments built; the
        ``reconnect_policy`` and ``on_session_lost`` setters replace it.
        """
        return self._config

    @property
    def reconnect_policy(self) -> ReconnectPolicy:
        """The :class:`ReconnectPolicy` for opening connections and every retry."""
        return self._core.policy

    @reconnect_policy.setter
    def reconnect_policy(self, policy: ReconnectPolicy) -> None:
        if not isinstance(policy, ReconnectPolicy):
            raise TypeError(f"reconnect_policy must be a ReconnectPolicy, "
                            f"got {type(policy).__name__}")
        self._core.set_reconnect_policy(policy)
        self._driver.connector.policy = policy
        if policy is not self._config.reconnect:
            self._config = dataclasses.replace(self._config, reconnect=policy)

    @property
    def on_session_lost(self) -> SessionLostPolicy:
        """The recovery policy: ``"raise"``, ``"replay"``, ``"resume"`` or ``"auto"``."""
        return self._core.on_session_lost.value

    @on_session_lost.setter
    def on_session_lost(self, policy: SessionLostPolicy) -> None:
        checked = self._core.set_recovery_policy(check_policy(policy))
        if checked.value != self._config.on_session_lost:
            self._config = dataclasses.replace(self._config, on_session_lost=checked.value)

    @property
    def record_steps(self) -> bool:
        """Whether :attr:`journal` keeps each step's action and answer.

        By default only under ``on_session_lost="replay"`` or ``"auto"``, where
        recovery replays them; under ``"raise"`` and ``"resume"`` the journal only
        counts steps (``steps_applied``), so memory does not grow with an episode's
        length. Set it to keep them anyway (to rebuild the episode from a
        :class:`~envlink.SessionLostError`'s journal elsewhere); it takes effect from
        the next ``reset()``.
        """
        return self._core.record_steps

    @record_steps.setter
    def record_steps(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"record_steps must be a bool, got {type(value).__name__}")
        self._core.set_record_steps(value)

    @property
    def recovery(self) -> str:
        """How a session lost now would be recovered (``envlink-resume``, ``openenv-resume``,
        ``replay``, ``raise``), per ``on_session_lost`` and what the server offered so far."""
        mechanism: RecoveryMechanism = self._core.mechanism
        return mechanism.value

    @property
    def base_url(self) -> str | None:
        """The base URL as given, no trailing slash or credentials (``None`` until started)."""
        return self._endpoint.base_url if self._target.started else None

    @property
    def ws_url(self) -> str:
        """The server's ``/ws`` URL (no credentials or secret query values)."""
        return self._endpoint.display

    @property
    def mode(self) -> str:
        """``"simulation"`` or ``"production"`` (OpenEnv's ``mode=``); fixed at creation."""
        return self._mode

    @property
    def provider(self) -> Any:
        """The provider given as ``provider=``, or ``None``."""
        return self._target.provider

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called and no call has opened the client again since
        (a later call does, as OpenEnv's, unless it was ``close(final=True)``)."""
        return self._driver.closed

    @property
    def connected(self) -> bool:
        """Whether a connection is currently open."""
        return self._driver.connector.is_open

    @property
    def session_id(self) -> str | None:
        """The server's public session id when it advertised one, else a client-side id.

        Never the resume token, which is a secret.
        """
        return self._core.session_id

    @property
    def journal(self) -> EpisodeJournal:
        """A copy of the current episode's journal."""
        return self._core.journal.snapshot()

    @property
    def tape(self) -> EpisodeTape | None:
        """This session's recording (its config's ``recorder``), or ``None`` without one.

        A pool that rebuilds a lost session through another client hands the episode
        from one tape to the other, so that it is recorded once.
        """
        return self._tape

    @property
    def extensions_active(self) -> bool:
        """Whether the current connection negotiated envlink's extensions."""
        conn = self._driver.connector.conn
        return conn is not None and conn.extensions.enabled

    @property
    def _resume_token(self) -> str | None:
        return self._core.resume_token

    def _restore(self, handle: SessionHandle) -> EpisodeJournal:
        """``attach()``'s way in: this client takes ``handle``'s episode, its connection lost.

        Call it on the event loop the client will run on, before its first call; the
        next call resumes the session.

        Returns:
            the journal the client now follows (a copy of the handle's), where the
            caller settles steps cut before the detach once the server's count is read.
        """
        journal = handle.journal.snapshot()
        self._driver.restore(journal, session_id=handle.session_id,
                             resume_token=handle.resume_token, detached_id=handle.detached_id)
        return journal

    def _serves_live_loop(self) -> bool:
        """The dispatch's question: whether the client is connected on an event loop
        still open (a blocking call may then not take it over from async use)."""
        return self._driver.serves_live_loop()

    # ------------------------------------------------------------- typed-client hooks

    def _step_payload(self, action: ActT) -> dict[str, Any]:
        """Turn an action into the ``data`` of a step frame (override in typed clients)."""
        if type(action) is dict:  # the common case, without the two class checks
            return dict(action)  # type: ignore[call-overload,no-any-return]
        if isinstance(action, BaseModel):
            return action.model_dump(mode="json", exclude_none=True)
        if isinstance(action, Mapping):
            return dict(action)
        raise TypeError(
            f"action must be a dict or a pydantic model, got {type(action).__name__}; "
            "override _step_payload for other action types"
        )

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[ObsT]:
        """Turn an observation frame's ``data`` into a :class:`StepResult` (override)."""
        get = payload.get
        observation: ObsT = get("observation", {})
        return StepResult(observation=observation, reward=get("reward"),
                          done=bool(get("done", False)), metadata=get("metadata"))

    def _parse_state(self, payload: dict[str, Any]) -> StateT:
        """Turn a state frame's ``data`` into the state type (override)."""
        return cast(StateT, payload)

    # -------------------------------------------------------------------- public API

    async def connect(
        self, *, timeout: float | UnsetType | None = UNSET
    ) -> EnvClient[ActT, ObsT, StateT]:
        """Open the connection now (otherwise the first call opens it).

        Raises:
            ConnectError: the server could not be reached within the reconnect policy.
            CallTimeoutError: the deadline expired.
            ClientClosedError: the client was closed.
        """
        if self._target.lease is not None:
            await self._provider_first(timeout)
        # The connect phase timeout bounds each attempt; the whole (re)connect loop is
        # bounded like any call.
        driver = self._driver

        async def run(call: Call) -> None:
            lock = take_turn(driver, call) or await wait_turn(driver, call)
            try:
                if not self.connected:
                    await driver.connector.open_session("connect", reason="connect")
            finally:
                end_turn(driver, lock)

        await driver.call("connect", call_seconds(timeout, self.timeouts.call), run)
        return self

    async def reset(self, *, timeout: float | UnsetType | None = UNSET,
                    **kwargs: Any) -> StepResult[ObsT]:
        """Start a new episode.

        Args:
            timeout: this call's deadline (default: the client's call timeout).
            **kwargs: reset arguments for the environment (seed, episode_id, ...).

        Raises:
            ServerError: the server answered with an error frame.
            CallTimeoutError, ConnectError, ConnectionLostError, ProtocolError,
            ClientClosedError.
        """
        if self._target.lease is not None:
            await self._provider_first(timeout)
        data = dict(kwargs)
        driver = self._driver

        async def run(call: Call) -> StepResult[ObsT]:
            lock = take_turn(driver, call) or await wait_turn(driver, call)
            try:
                if self._tape is not None:
                    self._tape.reset_started(self._core)
                frame = driver.expect(await driver.request(call, data), ObservationFrame, "reset")
                self._core.answered("reset", data, frame, episode_id=kwargs.get("episode_id"))
                if self._tape is not None:
                    self._tape.reset_answered(call, data, frame, self._core)
                return _parse(self._parse_result, frame.raw_data, "observation")
            finally:
                end_turn(driver, lock)

        return await driver.call("reset", call_seconds(timeout, self.timeouts.call), run)

    async def step(self, action: ActT, *, timeout: float | UnsetType | None = UNSET,
                   **kwargs: Any) -> StepResult[ObsT]:
        """Apply one action. Never applied twice, whatever fails.

        Args:
            action: the action (a dict, a pydantic model, or what ``_step_payload`` takes).
            timeout: this call's deadline (default: the client's call timeout).
            **kwargs: accepted for OpenEnv compatibility; unused.

        Raises:
            SessionLostError: the connection was lost mid-episode and the session could
                not be recovered under ``on_session_lost`` (carries the journal).
            ReplayDivergedError: replay gave a different observation.
            OutcomeUnknownError: the connection was lost after sending, outside an episode.
            ServerError, CallTimeoutError, ProtocolError, ClientClosedError.
        """
        if self._target.lease is not None:
            await self._provider_first(timeout)
        payload = self._step_payload(action)
        driver, core, tape = self._driver, self._core, self._tape

        # The parse is written out here (step is the hot call); the turn is every call's.
        async def run(call: Call) -> StepResult[ObsT]:
            lock = take_turn(driver, call) or await wait_turn(driver, call)
            try:
                call.step_index = core.journal.step_count
                started = 0.0 if tape is None else _perf()  # the tape's alone
                try:
                    frame = await driver.request(call, payload)
                    if type(frame) is not ObservationFrame:  # an error frame, or out of step
                        frame = driver.expect(frame, ObservationFrame, "step")
                except BaseException:
                    if tape is not None:
                        tape.step_failed(call, payload, core)
                    raise
                core.answered("step", payload, frame, call=call)
                if tape is not None:  # what the caller gets, after any recovery
                    tape.step_answered(call, payload, frame, started)
                try:
                    return self._parse_result(frame.raw_data)
                except EnvlinkError:
                    raise
                except Exception as exc:
                    raise _parse_failed("observation", exc) from exc
            finally:
                end_turn(driver, lock)

        # The default and a facade's checked timeout are taken here, without a call: step
        # is the hot call.
        if timeout is UNSET:
            seconds = self.timeouts.call
        elif type(timeout) is CheckedTimeout:
            seconds = timeout
        else:
            seconds = call_seconds(timeout, None)
        return await driver.call("step", seconds, run)

    async def state(self, *, timeout: float | UnsetType | None = UNSET) -> StateT:
        """Read the environment's state (episode id, step count, ...).

        Raises:
            SessionLostError, ServerError, CallTimeoutError, ProtocolError, ClientClosedError.
        """
        if self._target.lease is not None:
            await self._provider_first(timeout)
        driver = self._driver

        async def run(call: Call) -> StateT:
            lock = take_turn(driver, call) or await wait_turn(driver, call)
            try:
                frame = driver.expect(await driver.request(call, None), StateFrame, "state")
                self._core.answered("state", None, frame)
                return _parse(self._parse_state, frame.data, "state")
            finally:
                end_turn(driver, lock)

        return await driver.call("state", call_seconds(timeout, self.timeouts.call), run)

    async def disconnect(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """End the session (``{"type": "close"}``) and close the connection.

        The client stays usable: the next call opens a new connection and session.
        """
        seconds = call_seconds(timeout, self.timeouts.close)
        if self.closed:
            return
        driver = self._driver

        async def run(call: Call) -> None:
            lock = take_turn(driver, call) or await wait_turn(driver, call)
            try:
                await driver.connector.close(graceful=True)
            finally:
                end_turn(driver, lock)

        await driver.call("disconnect", seconds, run)

    async def close(self, *, timeout: float | UnsetType | None = UNSET,
                    final: bool = False) -> None:
        """Close the client: release what it holds, as OpenEnv's ``close()``. Idempotent.

        A call in flight is cancelled and its caller gets :class:`ClientClosedError`,
        as does every call queued behind it. The server session is ended (an OpenEnv
        detached session with ``openenv/session/close``, attached or not), and so are
        the sessions opened with :meth:`new_session`.

        A server started by this client's provider is stopped when its last client
        closes, with one try, as OpenEnv stops it; a stop that failed is tried once more
        by each later call (closing again included), and one that succeeded never again.

        As with OpenEnv, a later call (``connect()``, ``reset()``, ``new_session()``...)
        opens the client again: a new connection and session, and with a provider a new
        server (once a pending stop succeeded).

        Args:
            timeout: deadline in seconds (default: the client's close deadline).
            final: close for good: every later call raises :class:`ClientClosedError`
                (for a client that must never come back).

        Raises:
            Exception: the provider's own stop error, unchanged (the same object, with a
                note on Python 3.11+ and an ``envlink.provider_stop_failed`` log event):
                its server may still run.
        """
        if self.closed:
            if final:
                self._driver.make_final()
            # A provider whose stop failed is stopped again (it raises if it fails still).
            try:
                await self._target.retry_stop()
            except BaseException:
                self._report_stop_failure()
                raise
            return
        seconds = call_seconds(timeout, self.timeouts.close)
        children, self._children = self._children, None
        if children:
            await asyncio.gather(*(child.close(timeout=timeout, final=final)
                                   for child in children), return_exceptions=True)
        try:
            await self._driver.close(seconds, final=final)
        finally:
            if self._tape is not None:
                self._tape.close()  # the episode in progress ends as "close"
            try:
                await self._target.release()
            except BaseException:
                self._report_stop_failure()
                raise

    def __enter__(self) -> Self:
        """``with EnvClient(...) as env``: connect now, in sync mode, on the client's bridge.

        If the connect fails, the client is closed before the error propagates, as
        leaving the block would close it: the bridge's thread (the default bridge's,
        once no other client uses it) and a provider's server do not outlive it.

        Raises:
            ExecutionModeError: the client is in async mode (it is left as it was).
            ConnectError, CallTimeoutError, ClientClosedError: as ``connect()``.
        """
        claim(self, SYNC)  # refused: nothing was taken
        with one_user_call():  # the cleanup close tries no stop the connect tried
            try:
                run_blocking(self, _raw(type(self), "connect"), "connect", (), {})
            except BaseException as exc:
                close_after_failed_enter(
                    exc, lambda: run_blocking(self, _raw(type(self), "close"), "close", (), {}))
                raise
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        run_blocking(self, _raw(type(self), "close"), "close", (), {})
        return False

    async def __aenter__(self) -> Self:
        """``async with EnvClient(...) as env``: connect now, in async mode.

        If the connect fails, the client is closed before the error propagates, as
        leaving the block would close it (a provider's server is stopped).

        Raises:
            ExecutionModeError: the client is in sync mode (it is left as it was).
            ConnectError, CallTimeoutError, ClientClosedError: as ``connect()``.
        """
        claim(self, ASYNC)
        with one_user_call():  # the cleanup close tries no stop the connect tried
            try:
                await self.connect()
            except BaseException as exc:
                await aclose_after_failed_enter(exc, self.close)
                raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def sync(self, bridge: Bridge | None = None, *,
             nested_spans: bool = False) -> SyncEnv[ActT, ObsT, StateT]:
        """A blocking facade that runs this client on a background event-loop thread.

        Args:
            bridge: run on this :class:`~envlink.Bridge` (default: :func:`~envlink.default_bridge`).
            nested_spans: a span of the bridge's as the parent of each call's
                client span (default: one span per call; see :class:`SyncEnvClient`).
        """
        facade: SyncEnv[ActT, ObsT, StateT] = make_sync_facade(self, bridge, nested_spans)
        return facade

    def call_deadline(self, method: str,
                      timeout: float | UnsetType | None = UNSET) -> float | None:
        """Seconds a call of ``method`` with this ``timeout`` may last at most (None: no limit).

        The sync facade waits this long, plus a margin, so that the client's own
        deadline (which cleans up properly) always fires before the bridge's.

        Args:
            method: ``connect``, ``reset``, ``step``, ``state``, ``disconnect``,
                ``close`` or any other coroutine method (bounded by the call deadline).
            timeout: the ``timeout=`` the call gets; ``UNSET`` for the default.
        """
        if method in ("disconnect", "close", "detach"):
            seconds = self.timeouts.close if timeout is UNSET else timeout
            # close() waits for the call in flight, then for the closing handshake;
            # detach() ends the connection, then closes.
            if method in ("close", "detach") and seconds is not None:
                return (2 if method == "close" else 3) * seconds
            return seconds
        if method == "attach":
            # The resuming state call, then closing the client if the session is gone.
            call = self.timeouts.call if timeout is UNSET else timeout
            close = self.timeouts.close
            return None if call is None or close is None else call + 2 * close
        # connect() is bounded by the call deadline too (the connect phase bounds each
        # attempt within it).
        return self.timeouts.call if timeout is UNSET else timeout

    # ------------------------------------------------- sessions, MCP, moving sessions

    async def new_session(self) -> Self:
        """Open another session on the same server, as OpenEnv's ``new_session()`` does.

        The child is a connected client of the same class with the same options (and
        its own episode); :meth:`close` closes it with this client. With a provider,
        this client starts it first (a pending stop tried first), and the child is
        built with the started server's URL; if building the child fails, a server
        started by this call is stopped again.

        Raises:
            ConnectError, CapacityReachedError, ClientClosedError: as :meth:`connect`.
            Exception: the provider's own start, readiness or stop error, unchanged.
        """
        target = self._target
        held = target.held
        if target.lease is not None:
            await self._provider_first(UNSET)
        if self.closed:
            self._driver.reopen()
        url = target.requested
        if target.lease is not None:
            url = self.base_url
        try:
            child = configured_client(type(self), url, self._config,
                                      provider=target.provider, token=target.token)
        except BaseException as exc:
            if target.lease is not None and not held and target.held:
                # The server this call started serves nobody: stop it (one try; a
                # failure is noted on the constructor's error and stays pending).
                try:
                    await target.release()
                except Exception as failure:
                    self._report_stop_failure()
                    add_note(exc, f"envlink: stopping {type(target.provider).__name__} "
                                  f"after the failed new_session() failed too "
                                  f"({type(failure).__name__}: {failure}): it may still be "
                                  "running; the next call tries the stop again")
            raise
        try:
            await child.connect()
        except BaseException:
            await child.close()
            raise
        if self._children is None:
            self._children = []
        self._children.append(child)
        return child

    async def mcp_request(self, method: str, params: Mapping[str, Any] | None = None, *,
                          timeout: float | UnsetType | None = UNSET) -> Any:
        """Send one JSON-RPC request as an ``mcp`` message on the session's socket.

        OpenEnv 0.10 answers ``tools/list`` and ``tools/call`` this way, on the
        session's own environment, around ``step()`` (a tool call is not a step). In
        production ``mode=`` the request goes over ``POST /mcp`` with the session's id.

        Returns:
            the JSON-RPC ``result``.

        Raises:
            McpError: the server answered with a JSON-RPC error object (``rpc_code``).
            ServerError: the server does not know the ``mcp`` message type (an error
                frame, e.g. ``UNKNOWN_TYPE``).
            OutcomeUnknownError: the connection was lost after a ``tools/call`` was
                sent (it is never resent); ``tools/list`` is resent.
            CallTimeoutError, ProtocolError, SessionLostError, ClientClosedError.
        """
        if self._target.lease is not None:
            await self._provider_first(timeout)
        ids = self._mcp_ids
        if ids is None:
            ids = self._mcp_ids = itertools.count(1)
        rpc_id = next(ids)
        data = jsonrpc.rpc_request(rpc_id, method, params)
        driver = self._driver
        production = self._production

        async def run(call: Call) -> Any:
            lock = take_turn(driver, call) or await wait_turn(driver, call)
            try:
                if production:
                    return await driver.connector.post_rpc(method, data["params"])
                frame = driver.expect(await driver.request(call, data), McpFrame, "mcp")
            finally:
                end_turn(driver, lock)
            return jsonrpc.rpc_result(frame.data, rpc_id)

        return await driver.call("mcp", call_seconds(timeout, self.timeouts.call), run)

    async def mcp_list_tools(self, *, timeout: float | UnsetType | None = UNSET
                             ) -> list[dict[str, Any]]:
        """The environment's tools (``tools/list`` as an ``mcp`` message): name,
        description and input schema of each.

        Raises:
            McpError, ProtocolError and the errors of :meth:`mcp_request`.
        """
        return jsonrpc.tool_list(await self.mcp_request("tools/list", timeout=timeout))

    async def mcp_call_tool(self, name: str, arguments: Mapping[str, Any] | None = None, *,
                            timeout: float | UnsetType | None = UNSET, **kwargs: Any) -> Any:
        """Call a tool (``tools/call`` as an ``mcp`` message) and return its value.

        Args:
            name: the tool.
            arguments: its arguments (or pass them as keyword arguments).
            timeout: this call's deadline.

        Returns:
            the tool's value (the ``data`` of a FastMCP result, as OpenEnv's client
            unwraps it), else the whole result.

        Raises:
            ToolCallError: the tool reported an error.
            McpError: unknown tool, bad arguments, an environment without MCP...
            OutcomeUnknownError: the connection was lost after the call was sent.
        """
        args = {**dict(arguments or {}), **kwargs}
        result = await self.mcp_request("tools/call", {"name": name, "arguments": args},
                                        timeout=timeout)
        return jsonrpc.tool_value(name, result)

    async def detach(self, *, timeout: float | UnsetType | None = UNSET) -> SessionHandle:
        """End this client, keeping its server session, and return a handle to it.

        The episode must be in progress and the server must offer resumption
        (envlink's extension, or an OpenEnv 0.10 detached session, which the client
        holds under ``on_session_lost="resume"`` or ``"auto"``). The client is
        closed afterwards; continue with :meth:`attach` here or in another process.

        Args:
            timeout: deadline in seconds (default: the client's close deadline).

        Raises:
            EnvlinkError: no episode in progress, or the session cannot be resumed.
            ClientClosedError: the client is closed.
        """
        handle = await handles.detach(self, self._driver,
                                      self.timeouts.close if timeout is UNSET else timeout)
        await self.close(timeout=timeout)
        return handle

    if TYPE_CHECKING:
        @classmethod
        async def attach(cls, handle: SessionHandle, **options: Any) -> Self: ...
    else:
        @classmethod
        def attach(cls, handle, **options):
            """Continue a detached session (from :meth:`detach`, in any process).

            In plain code it blocks and returns the client, in blocking use; in async
            code it is awaited, as every method of the client.

            The client re-attaches to the same server session at once and settles steps
            of unknown outcome from the server's ``step_count``: a step is never applied
            twice. The session's state call is that check.

            Args:
                handle: the :class:`SessionHandle`.
                **options: keyword arguments of the client (``headers=``, ``timeout=``...);
                    ``on_session_lost`` defaults to ``"resume"``. Or ``config=`` a
                    :class:`ClientConfig` alone (its ``"raise"``, which could never
                    re-attach, becomes ``"resume"``).

            Raises:
                SessionGoneError: the server no longer has the session (with the journal).
                TypeError: ``handle`` is not a :class:`SessionHandle`.
            """
            return handles.attach(cls, handle, dict(options))

    # ------------------------------------------------------ the server, over plain HTTP

    @classmethod
    def from_docker_image(cls, image: str, provider: Any = None,
                          **kwargs: Any) -> Bootstrap[Self]:
        """A client of a server run from a container image, as OpenEnv's ``from_docker_image``.

        Lazy: nothing starts until the handle is awaited (a connected client) or
        ``.sync()`` is called (a connected :class:`SyncEnvClient`). The container
        is started under the connect deadline and stopped when the client closes,
        or at once if starting or connecting fails.

        Args:
            image: the image (``"echo-env:latest"``).
            provider: a container provider (default: :class:`DockerProvider`).
            **kwargs: passed to ``provider.start_container(image, ...)``.

        Raises:
            ProviderError: on resolution: docker is missing, or the start failed.
        """
        return lifecycle.from_docker_image(cls, image, provider, kwargs)

    @classmethod
    def from_env(cls, repo_id: str, *, use_docker: bool = True, provider: Any = None,
                 **provider_kwargs: Any) -> Bootstrap[Self]:
        """A client of a Hugging Face Space run locally, as OpenEnv's ``from_env``.

        With ``use_docker`` the Space's image ``registry.hf.space/<subdomain>:<tag>``
        runs in a container provider (default :class:`DockerProvider`); otherwise a
        runtime provider runs it (default: ``uv run`` of a local checkout given as
        ``project_path``). To use the hosted Space instead, pass its name as
        ``base_url``: ``EnvClient("owner/space")``.

        Args:
            repo_id: ``owner/space``.
            use_docker: run the image (``True``) or the project (``False``).
            provider: the provider to use.
            **provider_kwargs: ``port``, ``env_vars``, ``tag`` (docker), ``project_path``
                and ``app`` (uv), or more ``start_container`` arguments.

        Raises:
            ValueError: a malformed ``repo_id``, or ``provider_kwargs`` with a runtime
                ``provider``.
            ProviderError: on resolution, as :meth:`from_docker_image`.
        """
        return lifecycle.from_env(cls, repo_id, use_docker=use_docker, provider=provider,
                                  provider_kwargs=provider_kwargs)

    async def wait_until_ready(self, timeout: float | UnsetType | None = UNSET) -> Health:
        """Wait until the server answers ``GET /health`` healthy (a Space wakes up).

        Polls with the client's backoff (a wait: its retry budget is not spent, and it
        ends at ``timeout``, not after a number of tries). A client with a provider
        starts it first.

        Args:
            timeout: seconds to wait at most (default: the client's call timeout).

        Raises:
            NotReadyError: still not ready at the deadline (``SpaceNotAwakeError``
                for a Hugging Face Space).
            HttpStatusError: an answer that waiting will not change (401, 404...).
            RetryBudgetExhaustedError, ProviderError, ClientClosedError.
        """
        seconds = await self._before_http(timeout)
        return await discovery.wait_until_ready(
            self._endpoint, self._options, self.reconnect_policy, seconds,
            attempt_timeout=self.timeouts.connect, space=self._target.space)

    async def health(self, *, timeout: float | UnsetType | None = UNSET) -> Health:
        """``GET /health`` once.

        Raises:
            HttpStatusError: the server answered another status than 200.
            ProtocolError: the answer is not OpenEnv's health JSON.
            ConnectError, ConnectionLostError, CallTimeoutError, ClientClosedError.
        """
        seconds = await self._before_http(timeout)
        return await discovery.fetch_model(Health, self._endpoint, self._options, "/health",
                                           seconds)

    async def schema(self, *, timeout: float | UnsetType | None = UNSET) -> EnvironmentSchema:
        """``GET /schema``: the JSON schemas of the action, observations and state.

        Raises:
            As :meth:`health`.
        """
        seconds = await self._before_http(timeout)
        return await discovery.fetch_model(EnvironmentSchema, self._endpoint, self._options,
                                           "/schema", seconds)

    async def metadata(self, *,
                       timeout: float | UnsetType | None = UNSET) -> EnvironmentMetadata:
        """``GET /metadata``: the environment's name, description, version...

        Raises:
            As :meth:`health`.
        """
        seconds = await self._before_http(timeout)
        return await discovery.fetch_model(EnvironmentMetadata, self._endpoint, self._options,
                                           "/metadata", seconds)

    @property
    def tasks(self) -> TaskAPI:
        """OpenEnv 0.10's Task API of this client's server (:class:`TaskAPI`).

        ``await env.tasks.splits()``, ``num_tasks(split)``, ``list_tasks(split)``,
        ``get_task(split, index)``, ``get_task_range(split, start, stop)``,
        ``list_environments()``: plain HTTP reads, dispatched as the client's methods.
        """
        return TaskAPI(self)

    # --------------------------------------------------------------------- internals

    async def _before_http(self, timeout: float | UnsetType | None) -> float | None:
        """Before a plain-HTTP read: the client is open, the server started; the deadline."""
        if self.closed:
            self._driver.reopen()
        seconds = call_seconds(timeout, self.timeouts.call)
        await self._prepare_server()
        return seconds

    async def _provider_first(self, timeout: float | UnsetType | None) -> None:
        """Before a call, with a provider: its pending stop, then its start.

        Outside the call's deadline, as OpenEnv starts it: ``wait_for_ready`` keeps the
        provider's own timeout unless the call was given ``timeout=``. A pending stop
        is tried once, by the start, and the start follows once it succeeds, as
        OpenEnv's; except on a closed client a bootstrap handle made, whose stop only
        ``close()`` tries again, as OpenEnv's.

        Raises:
            ClientClosedError: closed with ``close(final=True)``, or a bootstrapped
                client's stop is pending.
        """
        target = self._target
        if self.closed:
            self._driver.check_reopen()
            if target.bootstrapped and target.stop_pending and not target.held:
                raise ClientClosedError(
                    "Provider cleanup is pending for this client: retry close() to finish "
                    "the cleanup, then create a new client")
        if not target.held:
            await self._prepare_server(None if timeout is UNSET else timeout)

    def _report_stop_failure(self) -> None:
        """A provider's stop failed (pending now): the ``envlink.provider_stop_failed``
        log event, in the caller's span (its trace id)."""
        lease = self._target.lease
        failure = lease.stop_failure if lease is not None else None
        if lease is None or failure is None:
            return
        self._driver.connector.hook.event(ClientEvent(
            LOG_PROVIDER_STOP_FAILED, self._core.session_id,
            {"provider": type(lease.provider).__name__,
             "error": f"{type(failure).__name__}: {failure}"}))

    async def _prepare_server(self, ready_timeout: float | None = None) -> None:
        """Start the provider's server, or wait for a sleeping Space: before a connection
        (the connector calls it before each open).

        Args:
            ready_timeout: the provider's ``wait_for_ready`` timeout (``None``: its own).
        """
        try:
            started = await self._target.ready(
                self._endpoint, self._options, self.reconnect_policy,
                timeout=self.timeouts.call, attempt_timeout=self.timeouts.connect,
                ready_timeout=ready_timeout)
        except BaseException:
            self._report_stop_failure()
            raise
        if started is not None and started.base_url != self._endpoint.base_url:
            self._endpoint = self._driver.connector.endpoint = started


def _parse(hook: Callable[[dict[str, Any]], _R], data: dict[str, Any], what: str) -> _R:
    """Run an OpenEnv parsing hook; its failure is the server's ``ProtocolError``."""
    try:
        return hook(data)
    except EnvlinkError:
        raise
    except Exception as exc:
        raise _parse_failed(what, exc) from exc


def _parse_failed(what: str, exc: Exception) -> ProtocolError:
    return ProtocolError(f"could not parse the server's {what}: {exc}")


_C = TypeVar("_C", bound="EnvClient[Any, Any, Any]")
#: The configuration (and server) of the client configured_client() is building.
_INHERITED: ContextVar[tuple[type, ClientConfig, Any, str | None] | None] = ContextVar(
    "envlink_configured_client", default=None)


def configured_client(cls: type[_C], base_url: str | None, config: ClientConfig, *,
                      provider: Any = None, token: str | None = None) -> _C:
    """A client of class ``cls`` on ``base_url`` that runs with exactly ``config``.

    Whatever ``cls``'s own ``__init__`` takes (a typed client may have one that passes
    keywords of its own to ``EnvClient``), it is called as ``cls(base_url=base_url)``
    and the ``EnvClient`` it builds takes ``config`` (and ``provider``, ``token``)
    whole, not the keywords: how ``new_session()``, the pools and the training
    adapters build clients, without replaying a constructor's arguments.

    Raises:
        TypeError: ``config`` is not a :class:`ClientConfig`.
    """
    if not isinstance(config, ClientConfig):
        raise TypeError(f"config must be a ClientConfig, got {type(config).__name__}")
    mark = _INHERITED.set((cls, config, provider, token))
    try:
        return cls(base_url=base_url)
    finally:
        _INHERITED.reset(mark)


class GenericEnvClient(EnvClient[dict[str, Any], dict[str, Any], dict[str, Any]]):
    """A client for any environment, with dict actions, observations and state.

    Actions may also be pydantic models (dumped to dicts).
    """
