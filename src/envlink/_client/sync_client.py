"""The blocking facade of the environment client: ``client.sync()`` → :class:`SyncEnvClient`.

It runs an async :class:`~envlink.EnvClient` on a :class:`~envlink._bridge.Bridge`
(an event loop in a daemon thread) and inherits the bridge's guarantees: the
caller's context (OpenTelemetry span, baggage, structlog context variables) is
the context of the async call, every call is traced and measured, and every
blocking wait has a timeout.

Timeouts: each method takes an optional keyword ``timeout=``. When it is given
and the async method accepts ``timeout`` itself, it is passed on, so the client's
own deadline fires (with its cleanup semantics) and the bridge waits that long
plus a margin. When it is not given, the bridge waits for the client's default
deadline for that method plus the margin: the client's :class:`CallTimeoutError`
always comes first, the bridge's only if the loop itself is stuck.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from envlink._bridge import Bridge, Invoke, SyncProxy, blocking_wrapper
from envlink._client.default_bridge import lease_bridge
from envlink._client.dispatch import SYNC, AutoDispatch, claim, raw_method
from envlink._client.tasks import TaskAPI
from envlink._config import UNSET, UnsetType, check_timeout
from envlink._errors import ClientClosedError, ReentrantCallError
from envlink._telemetry.bridge_hook import BridgeTelemetryHook

if TYPE_CHECKING:
    from envlink._client.client import EnvClient, StepResult

__all__ = ["TIMEOUT_MARGIN", "SyncEnvClient"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
StateT = TypeVar("StateT")

#: Seconds the bridge waits beyond the client's own deadline, so that the client's
#: timeout (which cleans up its connection properly) fires first.
TIMEOUT_MARGIN = 0.5


_timeout_params: dict[tuple[type, str], bool] = {}


def _accepts_timeout(client: Any, method: str, fn: Callable[..., Any]) -> bool:
    """Whether the async method has a ``timeout`` parameter of its own (cached per class)."""
    key = (type(client), method)
    known = _timeout_params.get(key)
    if known is None:
        try:
            param = inspect.signature(fn).parameters.get("timeout")
        except (TypeError, ValueError):
            param = None
        known = param is not None and param.kind in (
            inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        _timeout_params[key] = known
    return known


def _bridged(bridge: Bridge, client: EnvClient[Any, Any, Any], margin: float, method: str,
             fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
             timeout: Any) -> Any:
    """Run one client call on the bridge, waiting the client's own deadline plus ``margin``."""
    if timeout is UNSET:
        deadline = client.call_deadline(method)
    elif _accepts_timeout(client, method, fn):
        # Validated before the margin is added: the error names the caller's value.
        timeout = check_timeout(timeout)
        kwargs = {**kwargs, "timeout": timeout}
        deadline = client.call_deadline(method, timeout)
    else:
        # The method has no deadline of its own: timeout= bounds only the bridge's wait.
        deadline, margin = timeout, 0.0
    wait = None if deadline is None else deadline + margin
    # The caller's arguments are bound here: Bridge.call keeps `timeout=` and `method=`
    # for itself, and an argument of the same name must reach the client.
    bound = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
    return bridge.call(bound, timeout=wait, method=method)


class SyncEnvClient(SyncProxy["EnvClient[ActT, ObsT, StateT]"], Generic[ActT, ObsT, StateT]):
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

    def __init__(self, client: EnvClient[ActT, ObsT, StateT], *, bridge: Bridge | None = None,
                 timeout_margin: float = TIMEOUT_MARGIN, nested_spans: bool = False) -> None:
        margin = check_timeout(timeout_margin, "timeout_margin", allow_zero=True)
        if margin is None:
            raise TypeError("timeout_margin must be a number of seconds, not None")
        timeout_margin = margin
        owns = False
        if bridge is None and (client.tracer_provider is not None
                               or client.meter_provider is not None or nested_spans):
            # The bridge's telemetry goes where the client's goes.
            owns = True
            bridge = Bridge(hooks=[BridgeTelemetryHook(client.tracer_provider,
                                                       client.meter_provider,
                                                       nested=bool(nested_spans))])
        # On the default bridge, the facade holds a lease until it closes: the bridge's
        # thread ends when the last facade on it closes.
        bridge, self._envlink_release = lease_bridge(bridge, self)
        deadline = client.call_deadline("call")
        super().__init__(client, bridge,
                         timeout=None if deadline is None else deadline + timeout_margin)
        self._envlink_owns_bridge = owns
        self._envlink_margin = float(timeout_margin)
        #: The client's step coroutine method, looked up once (the hot call); set once the
        #: first call claimed the client's blocking mode (until then, steps take the
        #: general path, which claims it).
        step = getattr(client, "step", None)
        self._envlink_step_raw = None if step is None else raw_method(step)
        self._envlink_step: Callable[..., Any] | None = None
        self._envlink_close_lock = threading.Lock()
        self._envlink_closed = False
        self._envlink_close_done = threading.Event()

    # ------------------------------------------------------------------ plumbing

    def _envlink_call(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                      timeout: float | UnsetType | None) -> Any:
        return self._envlink_run(method, raw_method(getattr(self._envlink_target, method)),
                                 args, kwargs, timeout)

    def _envlink_run(self, method: str, fn: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any], timeout: Any) -> Any:
        """Run the client's coroutine method ``fn`` (named ``method``) on the bridge."""
        if self._envlink_step is None and method != "close":
            self._envlink_claim()
        return _bridged(self._envlink_bridge, self._envlink_target, self._envlink_margin,
                        method, fn, args, kwargs, timeout)

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
        self._envlink_step = self._envlink_step_raw

    def _envlink_wrap(self, name: str, attr: Any) -> Callable[..., Any] | None:
        # The client's dispatched methods are bridged as the coroutine methods they wrap.
        return blocking_wrapper(self, name, raw_method(attr))

    def _envlink_invoke(self) -> Invoke:
        if self._envlink_step is None:
            self._envlink_claim()  # a first call through another method claims too
        # Captured by value: no reference cycle through the facade.
        return functools.partial(_bridged, self._envlink_bridge, self._envlink_target,
                                 self._envlink_margin)

    # ------------------------------------------------------------------ properties

    @property
    def async_client(self) -> EnvClient[ActT, ObsT, StateT]:
        """The wrapped async client (use it only from the bridge's loop)."""
        return self._envlink_target

    @property
    def bridge(self) -> Bridge:
        """The bridge this facade runs on."""
        return self._envlink_bridge

    @property
    def tasks(self) -> Any:
        """The client's Task API (:attr:`EnvClient.tasks`), each call blocking on this
        facade's bridge: ``env.tasks.get_task("train", 3)``."""
        return TaskAPI(self._envlink_target, self)

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
        self._envlink_call("connect", (), {}, timeout)
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
        result: StepResult[ObsT] = self._envlink_call("reset", (), kwargs, timeout)
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
        step = self._envlink_step
        if timeout is UNSET and not kwargs and step is not None:
            # The hot call, without the generic plumbing: the same coroutine, the same
            # wait (the client's deadline plus the margin), the action passed as it is.
            deadline = self._envlink_target.call_deadline("step")
            wait = None if deadline is None else deadline + self._envlink_margin
            done: StepResult[ObsT] = self._envlink_bridge.call(
                step, action, timeout=wait, method="step")
            return done
        result: StepResult[ObsT] = self._envlink_call("step", (action,), kwargs, timeout)
        return result

    def state(self, *, timeout: float | UnsetType | None = UNSET) -> StateT:
        """Read the environment's state.

        Args:
            timeout: deadline in seconds (default: the client's call deadline).

        Raises:
            SessionLostError, ServerError, CallTimeoutError, ProtocolError,
            ClientClosedError, ReentrantCallError.
        """
        result: StateT = self._envlink_call("state", (), {}, timeout)
        return result

    def disconnect(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """End the session and close the connection; the client stays usable.

        Args:
            timeout: deadline in seconds (default: the client's close deadline).

        Raises:
            CallTimeoutError, ClientClosedError, ReentrantCallError.
        """
        self._envlink_call("disconnect", (), {}, timeout)

    def new_session(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        """Open another session on the same server (see :meth:`EnvClient.new_session`).

        The child's facade runs on this facade's bridge; closing this client closes the
        child's session too.

        Raises:
            ConnectError, CapacityReachedError, CallTimeoutError, ClientClosedError,
            ReentrantCallError.
        """
        child = self._envlink_call("new_session", (), {}, UNSET)
        return SyncEnvClient(child, bridge=self._envlink_bridge,
                             timeout_margin=self._envlink_margin)

    def close(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """Close the client, and the bridge if this facade owns it. Idempotent.

        Afterwards, with an owned bridge, no envlink thread is left running; nor with
        the process-wide default bridge once no other facade is open on it (its
        thread is joined). A bridge given to :meth:`EnvClient.sync` stays open.

        Args:
            timeout: deadline in seconds for the client's close (default: the
                client's close deadline).

        Raises:
            CallTimeoutError: the client did not close in time (the bridge is
                closed anyway when owned).
            ProviderError: the provider's server did not stop (closing again retries).
            ReentrantCallError: called from the bridge's own loop thread.
        """
        bridge = self._envlink_bridge
        if bridge.on_loop_thread():
            # Checked before claiming the close, so that a proper close() can follow.
            raise ReentrantCallError(
                "SyncEnvClient.close() called from its bridge's event-loop thread; "
                "await the async client's close() instead")
        with self._envlink_close_lock:
            first = not self._envlink_closed
            self._envlink_closed = True
        if not first:
            # Another thread is closing: return only once it has finished.
            self._envlink_close_done.wait()
            # A provider whose stop failed is stopped again (raises if it fails still).
            target = getattr(self._envlink_target, "_target", None)
            if target is not None:
                target.retry_stop_blocking()
            return
        try:
            if not bridge.closed:
                # ClientClosedError: the shared bridge closed under us; nothing to do.
                with contextlib.suppress(ClientClosedError):
                    self._envlink_call("close", (), {}, timeout)
        finally:
            try:
                if self._envlink_owns_bridge:
                    bridge.close()
                elif self._envlink_release is not None:
                    self._envlink_release()  # the last facade closes the default bridge
            finally:
                self._envlink_close_done.set()

    def __enter__(self) -> SyncEnvClient[ActT, ObsT, StateT]:
        return self.connect()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<SyncEnvClient of {self._envlink_target!r} on {self._envlink_bridge!r}>"
