"""One blocking facade over an async object on a bridge: ``client.sync()`` and ``pool.sync()``.

:class:`BlockingFacade` is the part the client's facade and the pool's share: the
bridge it runs on (leased from the process-wide default bridge, owned, or given),
the one way into a blocking call, and ``close()``.

Deadlines: the wrapped object names the deadline of each of its calls,
``target.call_deadline(method, timeout)`` (the client's from its :class:`~envlink.Timeout`,
the pool's from ``batch_timeout`` and its sessions' timeouts). A blocking call resolves
that deadline once, in the caller's thread: a ``timeout=`` given is checked there, once,
and handed to the coroutine as the call's deadline, whose expiry cleans up properly;
the bridge waits the same deadline plus the facade's margin, which only a stuck loop
ever reaches. No wait of a facade is a fixed number of seconds.

``close()``: idempotent; the first caller closes the target (bounded by the close
deadline plus the margin), then gives the bridge back (the default bridge's thread
ends with its last facade) or closes its own. A caller in another thread meanwhile
waits for that close to finish, bounded the same way (its own ``timeout=`` or the
close deadline, plus the margin), and raises :class:`~envlink.CallTimeoutError` if it
did not. From the bridge's own loop thread, ``close()`` raises
:class:`~envlink.ReentrantCallError` at once and leaves the facade open. A facade
that reopens (the client's, as OpenEnv's starts its loop again after ``close()``)
runs on a bridge again: the default bridge leased anew, or a new bridge of its own.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Literal, TypeVar

from envlink._bridge import Bridge, SyncProxy
from envlink._config import UNSET, CheckedTimeout, UnsetType, check_timeout
from envlink._errors import CallTimeoutError, ClientClosedError, ReentrantCallError
from envlink._sync.default_bridge import lease_bridge

__all__ = ["TIMEOUT_MARGIN", "BlockingFacade", "blocking_call", "blocking_iterate"]

T = TypeVar("T")

#: Seconds the bridge waits beyond a call's own deadline, so that the call's timeout
#: (which cleans up its connection properly) fires first.
TIMEOUT_MARGIN = 0.5

_timeout_params: dict[tuple[type, str], bool] = {}


def _accepts_timeout(target: Any, method: str, fn: Callable[..., Any]) -> bool:
    """Whether the coroutine method has a ``timeout`` parameter of its own (cached per class)."""
    key = (type(target), method)
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


def _given_timeout(target: Any, margin: float, method: str, fn: Callable[..., Any],
                   kwargs: dict[str, Any], timeout: Any) -> tuple[dict[str, Any], float | None]:
    """A call's ``timeout=``, checked once: the arguments that hand it to ``fn`` as the
    call's deadline, and how long the bridge waits (``None``: no limit).

    Raises:
        TypeError, ValueError: ``timeout`` is not a valid number of seconds (or None).
    """
    seconds = check_timeout(timeout)
    if not _accepts_timeout(target, method, fn):
        return kwargs, seconds  # it bounds the bridge's wait alone
    # Handed on as checked: the coroutine takes it as its deadline, unchecked.
    kwargs = {**kwargs, "timeout": None if seconds is None else CheckedTimeout(seconds)}
    seconds = target.call_deadline(method, seconds)
    return kwargs, None if seconds is None else seconds + margin


def blocking_call(bridge: Bridge, target: Any, margin: float, method: str,
                  fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                  timeout: Any) -> Any:
    """The one way into a blocking call: run ``fn(*args, **kwargs)`` (the coroutine method
    ``method`` of ``target``) on ``bridge`` under one deadline.

    Without ``timeout=`` the coroutine keeps its own default and the bridge waits the
    target's deadline for ``method`` plus ``margin``. With it, the value is checked here,
    once (the error names the caller's value), passed on as the coroutine's deadline (a
    :class:`~envlink._config.CheckedTimeout`, which the coroutine does not check again),
    and the bridge waits that deadline plus ``margin``; for a method without a
    ``timeout`` parameter it bounds the bridge's wait alone.

    Raises:
        TypeError, ValueError: ``timeout`` is not a valid number of seconds (or None).
        Whatever the call raises; :class:`~envlink.CallTimeoutError` from the bridge
        only if the loop itself is stuck.
    """
    if timeout is UNSET:
        seconds = target.call_deadline(method)
        wait = None if seconds is None else seconds + margin
    else:
        kwargs, wait = _given_timeout(target, margin, method, fn, kwargs, timeout)
    # The arguments as they came (no unpacking and packing again); an argument named
    # `timeout` or `method` reaches the target.
    return bridge._call_packed(fn, args, kwargs, wait, method)


def blocking_iterate(bridge: Bridge, target: Any, margin: float, method: str,
                     fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any],
                     timeout: Any) -> Iterator[Any]:
    """The blocking form of the async-generator method ``method`` of ``target``: an
    iterator of ``fn(*args, **kwargs)``'s items, run on ``bridge``.

    ``timeout=`` is handled as by :func:`blocking_call`: checked once, here, and handed to
    the generator as its deadline; each item waits the target's deadline for ``method``
    plus ``margin``.

    Raises:
        TypeError, ValueError: ``timeout`` is not a valid number of seconds (or None).
    """
    if timeout is UNSET:
        seconds = target.call_deadline(method)
        wait = None if seconds is None else seconds + margin
    else:
        kwargs, wait = _given_timeout(target, margin, method, fn, kwargs, timeout)
    return bridge.iterate(lambda: fn(*args, **kwargs), timeout=wait, method=method)


class BlockingFacade(SyncProxy[T]):
    """A blocking facade of an async object with ``call_deadline`` and ``close``.

    Args:
        target: the async object; it names its calls' deadlines with
            ``call_deadline(method, timeout=UNSET)``.
        bridge: the bridge to run on, ``None`` for the process-wide default bridge
            (leased until :meth:`close`).
        owns_bridge: :meth:`close` closes ``bridge`` too.
        timeout_margin: seconds the bridge waits beyond a call's own deadline.
        new_bridge: with ``owns_bridge``, how a reopened facade makes its next bridge.

    Raises:
        TypeError, ValueError: ``timeout_margin`` is not a number of seconds >= 0.
    """

    def __init__(self, target: T, bridge: Bridge | None, *, owns_bridge: bool = False,
                 timeout_margin: float = TIMEOUT_MARGIN,
                 new_bridge: Callable[[], Bridge] | None = None) -> None:
        margin = check_timeout(timeout_margin, "timeout_margin", allow_zero=True)
        if margin is None:
            raise TypeError("timeout_margin must be a number of seconds, not None")
        # On the default bridge, a lease until close(): its thread ends with its last facade.
        bridge, self._envlink_release = lease_bridge(bridge, self)
        self._envlink_leased = self._envlink_release is not None
        self._envlink_new_bridge = new_bridge
        deadline = target.call_deadline("call")  # type: ignore[attr-defined]
        super().__init__(target, bridge, timeout=None if deadline is None else deadline + margin)
        self._envlink_owns_bridge = owns_bridge
        self._envlink_margin = margin
        #: How this facade runs one coroutine method: ``blocking_call`` with the bridge,
        #: the target and the margin bound (no reference to the facade: no cycle through
        #: the wrappers cached on it).
        self._envlink_call = functools.partial(blocking_call, bridge, target, margin)
        self._envlink_close_lock = threading.Lock()
        self._envlink_closed = False
        #: Set by ``close(final=True)``: the facade never reopens.
        self._envlink_final = False
        self._envlink_close_done = threading.Event()

    @property
    def bridge(self) -> Bridge:
        """The bridge this facade runs on."""
        return self._envlink_bridge

    def _envlink_invoke(self) -> Callable[..., Any]:
        return self._envlink_call

    def _envlink_closed_again(self) -> None:
        """A later ``close()`` once the first has finished (nothing to do by default)."""

    def _envlink_reopen(self) -> None:
        """A call on the closed facade: run on a bridge again (the default bridge leased
        anew, a new bridge of its own, or the bridge it was given, still open).

        Raises:
            ClientClosedError: closed with ``close(final=True)``, a close is still
                running in another thread, or the bridge it was given is closed.
        """
        with self._envlink_close_lock:
            if not self._envlink_closed:
                return
            if self._envlink_final:
                raise ClientClosedError(
                    "the client is closed for good: its close(final=True) was called; "
                    "create a new client")
            if not self._envlink_close_done.is_set():
                raise ClientClosedError(
                    "the client's close() is running in another thread; call again once "
                    "it returned")
            bridge = self._envlink_bridge
            if self._envlink_leased:
                bridge, self._envlink_release = lease_bridge(None, self)
            elif self._envlink_owns_bridge and self._envlink_new_bridge is not None:
                bridge = self._envlink_new_bridge()
            elif bridge.closed:
                raise ClientClosedError(
                    "the bridge this client was given is closed: its close() was called; "
                    "give the client an open bridge")
            self._envlink_bridge = bridge
            self._envlink_call = functools.partial(blocking_call, bridge,
                                                   self._envlink_target, self._envlink_margin)
            self._envlink_forget_wrappers()
            self._envlink_close_done = threading.Event()
            self._envlink_closed = False

    def _envlink_forget_wrappers(self) -> None:
        """Drop the cached blocking wrappers: they run on the bridge of their time."""
        for name in [name for name in self.__dict__ if not name.startswith("_envlink_")]:
            del self.__dict__[name]

    def close(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """Close the wrapped object, and the bridge if this facade owns it. Idempotent.

        Afterwards, with an owned bridge, no envlink thread is left running; nor with
        the process-wide default bridge once no other facade is open on it (its
        thread is joined). A bridge given to ``sync()`` stays open. A second caller
        (another thread) waits for the first close to finish.

        Args:
            timeout: deadline in seconds of the close (default: the configured close
                deadline); a second caller waits for the first as long.

        Raises:
            CallTimeoutError: the close did not finish in time (the bridge is closed
                anyway when owned), or, for a second caller, the first close did not.
            ReentrantCallError: called from the bridge's own loop thread.
        """
        self._envlink_close(timeout, {})

    def _envlink_close(self, timeout: float | UnsetType | None,
                       kwargs: dict[str, Any]) -> None:
        """:meth:`close`, with ``kwargs`` for the wrapped object's ``close()``
        (``final=True``: the facade never reopens either)."""
        bridge = self._envlink_bridge
        if bridge.on_loop_thread():
            # Checked before claiming the close, so that a proper close() can follow.
            noun = type(self._envlink_target).__name__
            raise ReentrantCallError(
                f"{type(self).__name__}.close() called from its bridge's event-loop thread; "
                f"await the {noun}'s close() instead")
        with self._envlink_close_lock:
            first = not self._envlink_closed
            self._envlink_closed = True
            if kwargs.get("final"):
                self._envlink_final = True
        if not first:
            self._envlink_wait_for_close(timeout)
            return
        try:
            if not bridge.closed:
                # ClientClosedError: the shared bridge closed under us; nothing to do.
                with contextlib.suppress(ClientClosedError):
                    self._envlink_call("close", self._envlink_close_method(), (), kwargs,
                                       timeout)
        finally:
            try:
                if self._envlink_owns_bridge:
                    bridge.close()
                elif self._envlink_release is not None:
                    self._envlink_release()  # the last facade closes the default bridge
            finally:
                self._envlink_forget_wrappers()
                self._envlink_close_done.set()

    def _envlink_close_method(self) -> Callable[..., Any]:
        close: Callable[..., Any] = self._envlink_target.close  # type: ignore[attr-defined]
        return close

    def _envlink_wait_for_close(self, timeout: float | UnsetType | None) -> None:
        seconds = self._envlink_target.call_deadline(  # type: ignore[attr-defined]
            "close", UNSET if timeout is UNSET else check_timeout(timeout))
        wait = None if seconds is None else seconds + self._envlink_margin
        if not self._envlink_close_done.wait(wait):
            raise CallTimeoutError(
                f"close() in another thread did not finish within {wait:g} s",
                method="close", timeout=wait)
        self._envlink_closed_again()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._envlink_target!r} on {self._envlink_bridge!r}>"
