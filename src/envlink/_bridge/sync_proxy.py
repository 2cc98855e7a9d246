""":class:`SyncProxy`: a blocking view of any async object, running it on a bridge."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from envlink._config import UNSET, check_timeout

if TYPE_CHECKING:
    from envlink._bridge.bridge import Bridge

__all__ = ["DEFAULT_TIMEOUT", "Invoke", "SyncProxy", "blocking_wrapper"]

ObjT = TypeVar("ObjT")


#: ``timeout=`` of a wrapped method when the caller gives none: the library's one
#: "not given" sentinel, :data:`~envlink.UNSET`.
DEFAULT_TIMEOUT: Final[Any] = UNSET

#: How a proxy runs one call of a coroutine method:
#: ``invoke(name, method, args, kwargs, timeout)``, ``timeout`` possibly
#: :data:`DEFAULT_TIMEOUT`. Holds no reference to the proxy (no cycle through the
#: wrappers cached on it).
Invoke = Callable[[str, Callable[..., Any], tuple[Any, ...], dict[str, Any], Any], Any]


def _invoke(bridge: Bridge, default: float | None, name: str, fn: Callable[..., Any],
            args: tuple[Any, ...], kwargs: dict[str, Any], timeout: Any) -> Any:
    # Bound here, so that an argument of the target named `method` (or anything
    # Bridge.call takes for itself) reaches the target, not the bridge.
    bound = functools.partial(fn, *args, **kwargs) if args or kwargs else fn
    return bridge.call(bound, timeout=default if timeout is DEFAULT_TIMEOUT else timeout,
                       method=name)


class SyncProxy(Generic[ObjT]):
    """A blocking view of an async object, running it on a :class:`Bridge`.

    Attribute access is forwarded to the wrapped object:

    * a coroutine method becomes a blocking method that takes an extra keyword
      ``timeout=`` (default: the proxy's ``timeout``);
    * an async-generator method becomes a method returning a blocking iterator
      (each item under the timeout, ``aclose`` on early exit);
    * any other attribute is returned as it is.

    Wrappers are cached on the proxy, per name, on first access. The proxy is a
    context manager when the wrapped object is an async context manager, and
    iterable when it is async iterable.

    The proxy does not own the bridge: close the bridge when done. Its own
    attributes are prefixed ``_envlink_`` so that they never hide the wrapped
    object's.

    Args:
        target: the async object.
        bridge: the bridge that runs its coroutines.
        timeout: default ``timeout`` of the wrapped methods (``None``: no limit).
    """

    def __init__(self, target: ObjT, bridge: Bridge, *, timeout: float | None = None) -> None:
        self._envlink_target = target
        self._envlink_bridge = bridge
        self._envlink_timeout = check_timeout(timeout, allow_zero=True)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_envlink_"):  # not yet set (during __init__ / unpickling)
            raise AttributeError(name)
        attr = getattr(self._envlink_target, name)
        wrapper = self._envlink_wrap(name, attr)
        if wrapper is None:
            return attr
        # Cache in the instance dict: later lookups never reach __getattr__.
        self.__dict__[name] = wrapper
        return wrapper

    def _envlink_wrap(self, name: str, attr: Any) -> Callable[..., Any] | None:
        """The blocking wrapper for attribute ``name``, or None to return it as is."""
        return blocking_wrapper(self, name, attr)

    def _envlink_invoke(self) -> Invoke:
        """How this proxy runs a coroutine method; subclasses change timeouts here."""
        return functools.partial(_invoke, self._envlink_bridge, self._envlink_timeout)

    def _envlink_context(self) -> AbstractContextManager[Any]:
        target = self._envlink_target
        return self._envlink_bridge.enter(target, timeout=self._envlink_timeout)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._envlink_target)))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} of {self._envlink_target!r}>"

    def __enter__(self) -> Any:
        result = self._envlink_context().__enter__()
        # `async with obj as obj` is the common case: keep the caller in sync land.
        return self if result is self._envlink_target else result

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        return bool(self._envlink_context().__exit__(exc_type, exc, tb))

    def __iter__(self) -> Iterator[Any]:
        target = self._envlink_target
        if not hasattr(target, "__aiter__"):
            raise TypeError(f"{type(target).__qualname__} is not async iterable")
        return self._envlink_bridge.iterate(lambda: target, timeout=self._envlink_timeout,
                                            method=f"{type(target).__name__}.__anext__")


def blocking_wrapper(proxy: SyncProxy[Any], name: str, attr: Any) -> Callable[..., Any] | None:
    """The blocking wrapper of ``proxy``'s attribute ``attr``, or None if it is not async.

    The one factory of wrappers: a coroutine method runs through the proxy's
    :meth:`~SyncProxy._envlink_invoke`, an async-generator method through
    :meth:`Bridge.iterate`. Both take a keyword ``timeout=``.
    """
    wrapper: Callable[..., Any]
    if inspect.iscoroutinefunction(attr):
        invoke = proxy._envlink_invoke()

        def call(*args: Any, timeout: Any = DEFAULT_TIMEOUT, **kwargs: Any) -> Any:
            return invoke(name, attr, args, kwargs, timeout)

        wrapper = call
    elif inspect.isasyncgenfunction(attr):
        # Captured by value, not through the proxy: no reference cycle proxy -> wrapper.
        bridge, default = proxy._envlink_bridge, proxy._envlink_timeout

        def iterate(*args: Any, timeout: Any = DEFAULT_TIMEOUT, **kwargs: Any) -> Iterator[Any]:
            return bridge.iterate(lambda: attr(*args, **kwargs),
                                  timeout=default if timeout is DEFAULT_TIMEOUT else timeout,
                                  method=name)

        wrapper = iterate
    else:
        return None
    functools.update_wrapper(wrapper, attr)
    wrapper.__name__ = name
    wrapper.__qualname__ = f"{type(proxy).__name__}.{name}"
    return wrapper
