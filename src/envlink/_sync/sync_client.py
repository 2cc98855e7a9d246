"""The blocking facade of the environment client: ``client.sync()`` → :class:`SyncEnvClient`.

It runs an async :class:`~envlink.EnvClient` on a :class:`~envlink._bridge.Bridge`
(an event loop in a daemon thread) and inherits the bridge's guarantees: the
caller's context (OpenTelemetry span, baggage, structlog context variables) is
the context of the async call, every call is traced and measured, and every
blocking wait has a timeout.

Timeouts: each method takes an optional keyword ``timeout=``, and every call takes the
one way into a blocking call of :mod:`envlink._sync.facade`: the given timeout is
checked once and becomes the client's own deadline for the call (with its cleanup
semantics), and the bridge waits that deadline plus a margin. When it is not given,
the client keeps its default deadline for that method and the bridge waits it plus the
margin: the client's :class:`CallTimeoutError` always comes first, the bridge's only if
the loop itself is stuck.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from envlink._bridge import Bridge, SyncProxy, blocking_wrapper
from envlink._bridge.dispatch import (
    SYNC,
    AutoDispatch,
    claim,
    close_after_failed_enter,
    raw_method,
)
from envlink._config import UNSET, UnsetType
from envlink._launch.providers import one_user_call
from envlink._sansio.protocol import StepResult
from envlink._sync.facade import TIMEOUT_MARGIN, BlockingFacade, blocking_call
from envlink._telemetry.bridge_hook import BridgeTelemetryHook

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from envlink._sansio.journal import EpisodeJournal
    from envlink._sansio.policies import ReconnectPolicy

__all__ = ["TIMEOUT_MARGIN", "AsyncEnv", "SyncEnvClient"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")
_ActT = TypeVar("_ActT", contravariant=True)
_ObsT = TypeVar("_ObsT")
_StateT = TypeVar("_StateT", covariant=True)


class AsyncEnv(Protocol[_ActT, _ObsT, _StateT]):
    """The async environment client a :class:`SyncEnvClient` runs (an
    :class:`~envlink.EnvClient`), as the blocking layer sees it: declared here, so
    that this layer does not import the client that it serves."""

    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None

    @property
    def session_id(self) -> str | None: ...
    @property
    def journal(self) -> EpisodeJournal: ...
    @property
    def reconnect_policy(self) -> ReconnectPolicy: ...
    @property
    def tasks(self) -> Any: ...

    def call_deadline(self, method: str,
                      timeout: float | UnsetType | None = UNSET) -> float | None: ...
    async def connect(self, *, timeout: float | UnsetType | None = UNSET) -> Any: ...
    async def reset(self, *, timeout: float | UnsetType | None = UNSET,
                    **kwargs: Any) -> StepResult[_ObsT]: ...
    async def step(self, action: _ActT, *, timeout: float | UnsetType | None = UNSET,
                   **kwargs: Any) -> StepResult[_ObsT]: ...
    async def state(self, *, timeout: float | UnsetType | None = UNSET) -> _StateT: ...
    async def disconnect(self, *, timeout: float | UnsetType | None = UNSET) -> None: ...
    async def close(self, *, timeout: float | UnsetType | None = UNSET) -> None: ...


class SyncEnvClient(BlockingFacade["AsyncEnv[ActT, ObsT, StateT]"],
                    Generic[ActT, ObsT, StateT]):
    """Blocking facade of an async environment client; get one with ``client.sync()``.

    Safe to use from many threads (calls to one session are queued FIFO by the
    client). Any other coroutine method of the client is available in blocking
    form too (with the same ``timeout=`` keyword), through attribute access.

    Example::

        with GenericEnvClient(base_url=url).sync() as env:
            result = env.reset()
            result = env.step({"message": "hi"})

    Args:
        client: the async client (an :class:`~envlink.EnvClient`).
        bridge: a bridge to share with other clients (one thread for many
            sessions); :meth:`close` then leaves it open. By default the facade
            runs on the process-wide :func:`~envlink.default_bridge` (one loop
            thread for every such client), whose thread ends when the last
            facade on it closes (and starts again with the next one).
            A client with its own tracer or meter provider, or ``nested_spans``,
            gets a bridge of its own on those providers instead, closed by
            :meth:`close`. (A shared bridge traces with its own hooks:
            ``Bridge(hooks=[BridgeTelemetryHook(nested=False)])`` gives the
            merged shape below.)
        timeout_margin: seconds the bridge waits beyond the client's own deadline.
        nested_spans: on the facade's own bridge, give every call the bridge's
            span ``envlink.bridge <method>`` as the parent of the client's span.
            Default: one span per call, the client's, which starts when the
            caller called and carries the hop's queue wait
            (``envlink.bridge.queue_wait_s``); see ``docs/telemetry.md``.
    """

    def __init__(self, client: AsyncEnv[ActT, ObsT, StateT], *, bridge: Bridge | None = None,
                 timeout_margin: float = TIMEOUT_MARGIN, nested_spans: bool = False) -> None:
        owns = False
        new_bridge = None
        if bridge is None and (client.tracer_provider is not None
                               or client.meter_provider is not None or nested_spans):
            # The bridge's telemetry goes where the client's goes.
            owns = True

            def new_bridge() -> Bridge:
                return Bridge(hooks=[BridgeTelemetryHook(client.tracer_provider,
                                                         client.meter_provider,
                                                         nested=bool(nested_spans))])

            bridge = new_bridge()
        super().__init__(client, bridge, owns_bridge=owns, timeout_margin=timeout_margin,
                         new_bridge=new_bridge)
        #: Set once the first call claimed the client's blocking mode.
        self._envlink_claimed = False
        #: The client's coroutine methods by name, each looked up at its first call once
        #: the client's blocking mode is claimed (empty until then).
        self._envlink_methods: dict[str, Callable[..., Any]] = {}

    # ------------------------------------------------------------------ plumbing

    def _envlink_method(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                        timeout: float | UnsetType | None) -> Any:
        """Run the client's coroutine method named ``method`` on the bridge: every call
        of the facade's own methods, ``step`` included."""
        if self._envlink_closed:  # a call after close() opens the facade again
            self._envlink_reopen()
        fn = self._envlink_methods.get(method)
        if fn is None:  # this method's first call (the facade's first claims)
            fn = self._envlink_look_up(method)
        # blocking_call itself, as _envlink_call binds it: a partial of three arguments
        # given five more would copy the eight into a buffer it allocates, on every call.
        return blocking_call(self._envlink_bridge, self._envlink_target, self._envlink_margin,
                             method, fn, args, kwargs, timeout)

    def _envlink_look_up(self, method: str) -> Callable[..., Any]:
        if not self._envlink_claimed:
            self._envlink_claim()
        fn: Callable[..., Any] = raw_method(getattr(self._envlink_target, method))
        self._envlink_methods[method] = fn
        return fn

    def _envlink_run(self, method: str, fn: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any], timeout: Any) -> Any:
        """Run the client's coroutine function ``fn`` (named ``method``) on the bridge,
        claiming the client's blocking mode first."""
        if self._envlink_closed:
            self._envlink_reopen()
        if not self._envlink_claimed:
            self._envlink_claim()
        return self._envlink_call(method, fn, args, kwargs, timeout)

    def _envlink_claim(self) -> None:
        """The facade's first call locks the client to blocking use, as OpenEnv's facade
        does: its own plain calls then block and return results, inside a running event
        loop too (not an :class:`~envlink.AutoResult`).

        Raises:
            ExecutionModeError: the client is in use with ``await`` on a live loop.
        """
        client = self._envlink_target
        if isinstance(client, AutoDispatch):
            claim(client, SYNC, handoff=True)
        self._envlink_claimed = True

    def _envlink_wrap(self, name: str, attr: Any) -> Callable[..., Any] | None:
        # The client's dispatched methods are bridged as the coroutine methods they wrap.
        return blocking_wrapper(self, name, raw_method(attr))

    def _envlink_invoke(self) -> Callable[..., Any]:
        if self._envlink_closed:  # a wrapper made after close() is for a call: reopen
            self._envlink_reopen()
        if not self._envlink_claimed:
            self._envlink_claim()  # a first call through another method claims too
        return self._envlink_call

    def _envlink_close_method(self) -> Callable[..., Any]:
        return raw_method(self._envlink_target.close)  # type: ignore[no-any-return]

    def _envlink_closed_again(self) -> None:
        # A provider whose stop failed is stopped again (raises if it fails still).
        target = getattr(self._envlink_target, "_target", None)
        if target is not None:
            target.retry_stop_blocking()

    # ------------------------------------------------------------------ properties

    @property
    def async_client(self) -> AsyncEnv[ActT, ObsT, StateT]:
        """The wrapped async client (use it only from the bridge's loop)."""
        return self._envlink_target

    @property
    def tasks(self) -> Any:
        """The client's Task API (:attr:`EnvClient.tasks`), each call blocking on this
        facade's bridge: ``env.tasks.get_task("train", 3)``."""
        return _BlockingMethods(self._envlink_target.tasks, self, "tasks.")

    # ------------------------------------------------------------------ protocol calls

    def connect(self, *, timeout: float | UnsetType | None = UNSET
                ) -> SyncEnvClient[ActT, ObsT, StateT]:
        """Open the connection now (otherwise the first call opens it).

        Args:
            timeout: deadline in seconds (default: the client's connect deadline).

        Returns:
            This facade.

        Raises:
            ConnectError, CallTimeoutError, ClientClosedError, ReentrantCallError.
        """
        self._envlink_method("connect", (), {}, timeout)
        return self

    def reset(self, *, timeout: float | UnsetType | None = UNSET,
              **kwargs: Any) -> StepResult[ObsT]:
        """Start a new episode.

        Args:
            timeout: deadline in seconds (default: the client's call deadline).
            **kwargs: reset arguments for the environment (seed, episode_id, ...).

        Raises:
            ServerError, CallTimeoutError, ConnectError, ConnectionLostError,
            ProtocolError, ClientClosedError, ReentrantCallError.
        """
        result: StepResult[ObsT] = self._envlink_method("reset", (), kwargs, timeout)
        return result

    def step(self, action: ActT, *, timeout: float | UnsetType | None = UNSET,
             **kwargs: Any) -> StepResult[ObsT]:
        """Apply one action.

        Args:
            action: the action.
            timeout: deadline in seconds (default: the client's call deadline).
            **kwargs: passed on to the async client's ``step``.

        Raises:
            SessionLostError, ReplayDivergedError, OutcomeUnknownError, ServerError,
            CallTimeoutError, ProtocolError, ClientClosedError, ReentrantCallError.
        """
        result: StepResult[ObsT] = self._envlink_method("step", (action,), kwargs, timeout)
        return result

    def state(self, *, timeout: float | UnsetType | None = UNSET) -> StateT:
        """Read the environment's state.

        Args:
            timeout: deadline in seconds (default: the client's call deadline).

        Raises:
            SessionLostError, ServerError, CallTimeoutError, ProtocolError,
            ClientClosedError, ReentrantCallError.
        """
        result: StateT = self._envlink_method("state", (), {}, timeout)
        return result

    def disconnect(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """End the session and close the connection; the client stays usable.

        Args:
            timeout: deadline in seconds (default: the client's close deadline).

        Raises:
            CallTimeoutError, ClientClosedError, ReentrantCallError.
        """
        self._envlink_method("disconnect", (), {}, timeout)

    def new_session(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """Open another session on the same server (see :meth:`EnvClient.new_session`).

        The child's facade runs on this facade's bridge; closing this client closes the
        child's session too.

        Raises:
            ConnectError, CapacityReachedError, CallTimeoutError, ClientClosedError,
            ReentrantCallError.
        """
        child = self._envlink_method("new_session", (), {}, UNSET)
        return SyncEnvClient(child, bridge=self._envlink_bridge,
                             timeout_margin=self._envlink_margin)

    def close(self, *, timeout: float | UnsetType | None = UNSET,
              final: bool = False) -> None:
        """Close the client, and the bridge if this facade owns it. Idempotent.

        Afterwards, with an owned bridge, no envlink thread is left running; nor with
        the process-wide default bridge once no other facade is open on it (its
        thread is joined). A bridge given to :meth:`EnvClient.sync` stays open. A
        second caller (another thread) waits for the first close to finish, as long
        as a close may take (the close deadline plus the margin); a later one
        retries a provider's failed stop.

        As OpenEnv's, a later call opens the client again, on a bridge again (the
        default bridge leased anew, or a new bridge of its own), unless ``final``.

        Args:
            timeout: deadline in seconds for the client's close (default: the
                client's close deadline).
            final: close for good (:meth:`EnvClient.close`): later calls raise
                :class:`~envlink.ClientClosedError`.

        Raises:
            CallTimeoutError: the client did not close in time (the bridge is
                closed anyway when owned), or, for a second caller, the first close did not.
            ProviderError: the provider's server did not stop (closing again retries).
            ReentrantCallError: called from the bridge's own loop thread.
        """
        self._envlink_close(timeout, {"final": True} if final else {})

    def __enter__(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """``with client.sync() as env``: connect now.

        If the connect fails, the facade is closed before the error propagates, as
        leaving the block would close it: the client, then the bridge (its own, or
        the default bridge's lease, whose thread ends with its last facade).

        Raises:
            As :meth:`connect`.
        """
        with one_user_call():  # the cleanup close tries no stop the connect tried
            try:
                return self.connect()
            except BaseException as exc:
                close_after_failed_enter(exc, self.close)
                raise


class _BlockingMethods(SyncProxy[Any]):
    """Methods of an object of the client's (``client.tasks``), each call blocking on a
    facade's bridge as the facade's own calls do: the method's coroutine (its
    ``_envlink_raw``, as a dispatched method's) runs through the facade."""

    def __init__(self, target: Any, facade: SyncEnvClient[Any, Any, Any], prefix: str) -> None:
        super().__init__(target, facade._envlink_bridge)
        run = facade._envlink_run

        def invoke(name: str, fn: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any], timeout: Any) -> Any:
            return run(prefix + name, fn, args, kwargs, timeout)

        self._envlink_run_method = invoke

    def _envlink_wrap(self, name: str, attr: Any) -> Callable[..., Any] | None:
        return blocking_wrapper(self, name, raw_method(attr))

    def _envlink_invoke(self) -> Callable[..., Any]:
        return self._envlink_run_method
