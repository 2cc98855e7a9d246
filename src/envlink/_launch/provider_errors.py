"""A provider's own exception stays catchable by its class through :class:`ProviderError`.

OpenEnv 0.10 lets whatever a provider raises (``RuntimeError`` for a missing docker,
``TimeoutError`` from ``wait_for_ready``, ``subprocess.CalledProcessError``...) reach
the caller unchanged, so OpenEnv-era code catches those classes. envlink raises a
:class:`ProviderError` instead, of a class made once per provider exception class
that derives from both: ``except ProviderError`` and ``except RuntimeError`` (the
provider's class) both catch it, and the provider exception's attributes are copied
onto it. Such an error pickles (its class is made again on the other side).
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from envlink._errors import EnvlinkError, ProviderError

__all__ = ["provider_error", "provider_error_class"]

_CLASSES: dict[type[BaseException], type[ProviderError]] = {}
_LOCK = threading.Lock()


def _extra_bases(kind: type[BaseException]) -> tuple[type[BaseException], ...]:
    """The classes the error must also derive from for ``except kind`` to catch it."""
    if issubclass(ProviderError, kind):
        return ()
    if issubclass(kind, EnvlinkError):
        # envlink's own error from a provider (NotReadyError from DockerProvider's
        # wait_for_ready): the builtins it is, that ProviderError is not (TimeoutError).
        return tuple(base for base in kind.__mro__ if base.__module__ == "builtins"
                     and issubclass(base, Exception) and not issubclass(ProviderError, base))
    return (kind,)


def provider_error_class(kind: type[BaseException]) -> type[ProviderError]:
    """The :class:`ProviderError` class that is also a ``kind`` (made once per class).

    ``ProviderError`` itself when it already is one, or when no class can derive from
    both (a ``kind`` whose C layout conflicts with ``ConnectionError``'s, such as
    ``ImportError``): the provider's exception is then the error's ``__cause__`` only.
    """
    known = _CLASSES.get(kind)
    if known is not None:
        return known
    with _LOCK:
        known = _CLASSES.get(kind)
        if known is not None:
            return known
        bases = _extra_bases(kind)
        made: type[ProviderError] = ProviderError
        if bases:
            try:
                made = type(f"ProviderError[{kind.__name__}]", (ProviderError, *bases),
                            {"__module__": ProviderError.__module__,
                             "__reduce__": _reduce, "_envlink_kind": kind})
            except TypeError:  # instance lay-out conflict, or no consistent MRO
                made = ProviderError
        _CLASSES[kind] = made
        return made


def provider_error(message: str, cause: BaseException) -> ProviderError:
    """A :class:`ProviderError` for ``cause`` that ``except type(cause)`` also catches,
    with ``cause``'s attributes (``returncode``, ``cmd``...) readable on it. The
    caller chains ``cause`` (``raise ... from cause``)."""
    error = provider_error_class(type(cause))(message)
    if type(error) is not ProviderError and not isinstance(cause, EnvlinkError):
        state = getattr(cause, "__dict__", None)
        for name, value in (state or {}).items():
            error.__dict__.setdefault(name, value)
    return error


def _importable(kind: type[BaseException]) -> bool:
    module = sys.modules.get(kind.__module__)
    found: Any = module
    for part in kind.__qualname__.split("."):
        found = getattr(found, part, None)
    return found is kind


def _reduce(self: ProviderError) -> tuple[Any, ...]:
    kind: type[BaseException] = type(self)._envlink_kind  # type: ignore[attr-defined]
    # A provider class the other side could not import: a plain ProviderError there.
    rebuilt = kind if _importable(kind) else None
    return (_rebuild_provider_error, (rebuilt, self.args, dict(self.__dict__)))


def _rebuild_provider_error(kind: type[BaseException] | None, args: tuple[Any, ...],
                            state: dict[str, Any]) -> ProviderError:
    # As EnvlinkError.__reduce__ rebuilds: the attributes whatever the constructor takes.
    cls = ProviderError if kind is None else provider_error_class(kind)
    error = cls.__new__(cls)
    error.args = args
    error.__dict__.update(state)
    return error
