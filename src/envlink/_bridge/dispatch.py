"""Calls without ``await``: a client's methods dispatched as OpenEnv 0.10 dispatches them.

A dispatched method (``reset``, ``step``, ``state``, ``connect``, ``close``, ...)

* in async code returns its coroutine, to be awaited as always;
* in plain code (no running event loop) blocks and returns the result. The call
  runs on the client's bridge, through the same path as ``client.sync()`` (so
  deadlines, context propagation, spans and cancellation on timeout are those of
  the sync facade);
* inside a running loop, before the client has been awaited, returns an
  :class:`AutoResult`: awaiting it runs the coroutine; using it (an attribute,
  ``bool``, ``str``, ``repr``, indexing, iteration) runs the call on the bridge's
  loop thread and blocks until it is done. Blocking there cannot deadlock: the
  work does not need the caller's loop.

Generic over its client: an :class:`AutoDispatch` subclass names the methods that
dispatch (``_dispatched_methods``) and makes the facade that runs its blocking calls with
``sync()`` (a :class:`BlockingRunner`).

The client claims ``"sync"`` or ``"async"`` on first use and refuses to mix them
with :class:`~envlink.ExecutionModeError`, as OpenEnv's does. Once awaited, a call
costs one function call more than a plain coroutine method.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import threading
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, ClassVar, Final, Protocol, TypeVar, cast

from envlink._bridge import LazyCoroutine, is_bridge_loop
from envlink._config import UNSET
from envlink._errors import ExecutionModeError
from envlink._speedups import running_loop_getter

__all__ = ["ASYNC", "SYNC", "AutoDispatch", "AutoResult", "BlockingRunner",
           "aclose_after_failed_enter", "claim", "close_after_failed_enter", "dispatch_call",
           "dispatched", "raw_method", "run_blocking"]

F = TypeVar("F", bound=Callable[..., Any])

SYNC: Final = "sync"
ASYNC: Final = "async"

_get_running_loop = running_loop_getter()
_facade_lock = threading.Lock()
# Attributes asyncio and inspect probe on a coroutine (task reprs, debugging): answered
# from the coroutine once started, never by running the call.
_COROUTINE_ATTRS = frozenset({
    "cr_await", "cr_code", "cr_frame", "cr_origin", "cr_running", "cr_suspended",
    "gi_code", "gi_frame", "gi_running", "gi_suspended", "gi_yieldfrom", "_is_coroutine",
})


class BlockingRunner(Protocol):
    """What runs a client's blocking calls (its ``sync()`` facade), as the dispatch sees it."""

    _envlink_closed: bool

    def _envlink_reopen(self) -> None: ...
    def _envlink_call(self, method: str, fn: Callable[..., Any], args: tuple[Any, ...],
                      kwargs: dict[str, Any], timeout: Any) -> Any: ...
    def close(self, *, timeout: Any = UNSET, final: bool = False) -> None: ...
    def new_session(self) -> Any: ...


def dispatched(fn: F) -> F:
    """Make the coroutine method ``fn`` dispatch on how it is called (see the module)."""
    name = fn.__name__

    @functools.wraps(fn)
    def method(self: AutoDispatch, *args: Any, **kwargs: Any) -> Any:
        # The async path: one check, then the plain coroutine.
        if self._execution_mode is ASYNC and _get_running_loop() is not None:
            return fn(self, *args, **kwargs)
        return _dispatch(self, fn, name, args, kwargs)

    method._envlink_raw = fn  # type: ignore[attr-defined]
    return cast(F, method)


def raw_method(attr: Any) -> Any:
    """The coroutine method behind a dispatched bound method (``attr`` itself otherwise)."""
    raw = getattr(getattr(attr, "__func__", None), "_envlink_raw", None)
    return attr if raw is None else raw.__get__(attr.__self__)


def dispatch_call(client: Any, fn: Callable[..., Any], name: str,
                  args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``fn(client, *args, **kwargs)`` by the rule above, for a call that is not a
    dispatched method (a classmethod that makes its client: ``attach``)."""
    if client._execution_mode is ASYNC and _get_running_loop() is not None:
        return fn(client, *args, **kwargs)
    return _dispatch(client, fn, name, args, kwargs)


def _dispatch(client: Any, fn: Callable[..., Any], name: str,
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    running = _get_running_loop()
    if running is None:
        return run_blocking(client, fn, name, args, kwargs, handoff=True)
    mode = client._execution_mode
    if mode is ASYNC or is_bridge_loop(running):
        # On a bridge's loop the call is envlink's own work for a blocking caller
        # (a facade, a typed client's method calling step()): always the coroutine.
        return fn(client, *args, **kwargs)
    if mode is SYNC:
        # A blocking client called from someone else's loop: block it (the bridge
        # warns once); the work runs on the bridge's loop thread.
        return run_blocking(client, fn, name, args, kwargs)
    return AutoResult(client, fn, name, args, kwargs)


def claim(client: AutoDispatch, mode: str, *, handoff: bool = False) -> None:
    """Record the client's execution mode on first use; refuse the other one after.

    Args:
        client: the client.
        mode: :data:`SYNC` or :data:`ASYNC`.
        handoff: a plain call with no loop running may take over an async client
            whose loop is gone (OpenEnv allows it: ``asyncio.run(...)`` then plain
            calls), but not one still connected on a live loop.

    Raises:
        ExecutionModeError: the client already claimed the other mode.
    """
    current = client._execution_mode
    if current is mode:
        return
    if current is None:
        client._execution_mode = mode
        return
    if handoff and current is ASYNC and not client._serves_live_loop():
        client._execution_mode = SYNC
        return
    if current is ASYNC:
        raise ExecutionModeError(
            "this client is used with await (async mode); a blocking call (plain code, "
            "`with`, or using an un-awaited result) cannot share it. Create another "
            "client for blocking use, or call client.sync() for a blocking facade")
    raise ExecutionModeError(
        "this client is used by blocking calls (sync mode); it cannot be awaited or "
        "used with `async with`. Create another client for async use")


def close_after_failed_enter(error: BaseException, close: Callable[[], object]) -> None:
    """A failed ``__enter__``'s cleanup: ``close()`` what it took before ``error`` propagates
    (no ``__exit__`` follows a failed ``__enter__``). An error of the close is noted on
    ``error`` (Python 3.11+), never raised in its place; an interrupt propagates."""
    try:
        close()
    except Exception as failure:
        _note_cleanup(error, failure)


async def aclose_after_failed_enter(error: BaseException,
                                    close: Callable[[], Awaitable[object]]) -> None:
    """:func:`close_after_failed_enter` for a failed ``__aenter__``: ``await close()`` (a
    cancellation of the close propagates: the task was asked to stop)."""
    try:
        await close()
    except Exception as failure:
        _note_cleanup(error, failure)


def _note_cleanup(error: BaseException, failure: Exception) -> None:
    add = getattr(error, "add_note", None)  # Python 3.11+
    if add is not None:
        add(f"closing what the failed __enter__ took failed too: {failure!r}")


def _facade(client: AutoDispatch) -> BlockingRunner:
    facade = client._envlink_auto
    if facade is None:
        with _facade_lock:
            facade = client._envlink_auto
            if facade is None:
                # Whatever bridge sync() takes, plain calls take the same one.
                facade = client._envlink_auto = client.sync()
    return facade


def run_blocking(client: AutoDispatch, fn: Callable[..., Any], name: str,
                 args: tuple[Any, ...], kwargs: dict[str, Any], *,
                 handoff: bool = False) -> Any:
    """Run one call of ``fn`` (a method named ``name``) for a blocking caller.

    Raises:
        ExecutionModeError: the client is in async mode.
        Whatever the call raises (its own deadline's ``CallTimeoutError`` included).
    """
    claim(client, SYNC, handoff=handoff)
    facade = _facade(client)
    timeout = UNSET
    if "timeout" in kwargs:
        kwargs = dict(kwargs)
        timeout = kwargs.pop("timeout")
    if name == "close":
        facade.close(timeout=timeout, final=bool(kwargs.get("final")))
        return None
    if name == "new_session":
        return facade.new_session()
    if facade._envlink_closed:  # a call after close() opens the client again
        facade._envlink_reopen()
    result = facade._envlink_call(name, fn.__get__(client), args, kwargs, timeout)
    return client if name == "connect" else result


class AutoDispatch:
    """The client's side of the dispatch: its mode, its blocking facade, the methods that
    dispatch (:attr:`_dispatched_methods`, and a subclass's overrides of them)."""

    _execution_mode: str | None = None
    #: The facade that runs the client's blocking calls (made on first such call).
    _envlink_auto: BlockingRunner | None = None
    #: The names of the client's coroutine methods that dispatch.
    _dispatched_methods: ClassVar[frozenset[str]] = frozenset()
    if TYPE_CHECKING:
        def sync(self) -> Any: ...

        def _serves_live_loop(self) -> bool: ...

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The client's own methods, and a typed client's overrides of
        # any dispatched method, dispatch.
        own = cls._dispatched_methods
        for name in set(vars(cls)) | own:
            value = getattr(cls, name, None)
            if not inspect.iscoroutinefunction(value):
                continue  # not a coroutine method, or already dispatching
            inherited = getattr(super(cls, cls), name, None)
            if name in own or hasattr(inherited, "_envlink_raw"):
                setattr(cls, name, dispatched(value))


class AutoResult(LazyCoroutine[Any]):
    """The result of a call made inside a running event loop without ``await``.

    Await it (the call runs as a coroutine, and the client is in async mode from
    then on), or use it as the result: its attributes, ``bool``, ``str``,
    ``repr``, ``==``, indexing, iteration and ``len`` are the result's, the call
    running on the client's bridge while the caller's loop waits (the client is
    in sync mode from then on). A call whose result is never used does not run,
    and a warning says so.
    """

    __slots__ = ("_args", "_client", "_ctx", "_error", "_fn", "_kwargs", "_name",
                 "_resolved", "_value")

    def __init__(self, client: AutoDispatch, fn: Callable[..., Any], name: str,
                 args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().__init__()
        self._client = client
        self._fn = fn
        self._name = name
        self._args = args
        self._kwargs = kwargs
        # The caller's context as of the call (span, baggage), for a later resolution.
        self._ctx = contextvars.copy_context()
        self._resolved = False
        self._value: Any = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ as awaited

    def _start(self) -> Coroutine[Any, Any, Any]:
        if self._resolved:
            raise ExecutionModeError(
                f"the result of {self._name}() was already used without await; "
                "it cannot be awaited too")
        claim(self._client, ASYNC)
        coro: Coroutine[Any, Any, Any] = self._fn(self._client, *self._args, **self._kwargs)
        return coro

    def _unstarted_close(self) -> None:
        self._resolved = True

    # ------------------------------------------------------------------ as used

    def _result(self) -> Any:
        if not self._resolved:
            if self._coro is not None:
                raise ExecutionModeError(
                    f"the result of {self._name}() is being awaited; use the awaited value")
            self._resolved = True
            try:
                self._value = self._ctx.run(run_blocking, self._client, self._fn, self._name,
                                            self._args, self._kwargs)
            except BaseException as exc:
                # Kept, so that using the result again re-raises instead of calling again.
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._value

    def __getattr__(self, name: str) -> Any:
        if name in _COROUTINE_ATTRS:
            if self._coro is None:
                raise AttributeError(name)
            return getattr(self._coro, name)
        if name in _OWN_SLOTS or (name.startswith("__") and name.endswith("__")):
            raise AttributeError(name)
        return getattr(self._result(), name)

    def __bool__(self) -> bool:
        return bool(self._result())

    def __str__(self) -> str:
        return str(self._result())

    def __repr__(self) -> str:
        return repr(self._result())

    def __eq__(self, other: object) -> bool:
        return bool(self._result() == other)

    __hash__ = object.__hash__

    def __getitem__(self, key: Any) -> Any:
        return self._result()[key]

    def __contains__(self, item: object) -> bool:
        return item in self._result()

    def __iter__(self) -> Iterator[Any]:
        return iter(self._result())

    def __len__(self) -> int:
        return len(self._result())

    def __del__(self) -> None:
        try:
            if self._coro is None and not self._resolved:
                warnings.warn(
                    f"envlink: {type(self._client).__name__}.{self._name}() was called "
                    "inside a running event loop, but its result was neither awaited nor "
                    "used, so the call did not run", RuntimeWarning, stacklevel=2)
        except AttributeError:  # __init__ did not finish
            pass


# Never looked up on the result (an unset one during __init__ or __del__ included).
_OWN_SLOTS = frozenset(AutoResult.__slots__) | frozenset(LazyCoroutine.__slots__)
