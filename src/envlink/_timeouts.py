"""Deadlines that never swallow a caller's cancellation, and timeout validation.

``asyncio.wait_for`` must not be used in envlink: on Python 3.11 it returns the
inner result when the caller's cancellation (or an enclosing deadline, which is a
cancellation too) arrives in the same loop iteration as that result, and the
cancellation is lost. :func:`bounded` is the replacement (``asyncio.timeout`` on
3.11+, an equivalent on 3.10), :func:`deadline` the per-call form raising
:class:`~envlink.CallTimeoutError`, and :func:`check_timeout` the one validation of
every ``timeout=`` envlink accepts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import sys
from collections.abc import AsyncIterator

from envlink._errors import CallTimeoutError

__all__ = ["bounded", "check_timeout", "deadline"]


def check_timeout(value: object, name: str = "timeout", *, allow_zero: bool = False
                  ) -> float | None:
    """Validate a duration in seconds given by a caller; ``None`` means no limit.

    Args:
        value: what the caller passed.
        name: the parameter's name, for the message.
        allow_zero: accept ``0`` (e.g. a grace period), not only positive values.

    Returns:
        the duration as a float, or ``None``.

    Raises:
        TypeError: not a real number (``"5"``, ``True``: a bool is not a duration).
        ValueError: NaN, negative, or zero unless ``allow_zero``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number of seconds or None, "
                        f"got {type(value).__name__} {value!r}")
    seconds = float(value)
    ok = seconds >= 0 if allow_zero else seconds > 0
    if math.isnan(seconds) or not ok:
        bound = ">= 0" if allow_zero else "positive"
        raise ValueError(f"{name} must be a {bound} number of seconds or None, got {value!r}")
    return seconds


class _Expiry:
    """Whether a :func:`bounded` block's own deadline expired."""

    __slots__ = ("fired",)

    def __init__(self) -> None:
        self.fired = False

    def expired(self) -> bool:
        """``True`` once the deadline has expired."""
        return self.fired


if sys.version_info >= (3, 11):

    @contextlib.asynccontextmanager
    async def bounded(seconds: float | None) -> AsyncIterator[_Expiry]:
        """Cancel the block after ``seconds`` and raise :class:`TimeoutError`.

        A cancellation from outside (the caller's, or an enclosing deadline's) is
        always passed on, even when it coincides with the block finishing.
        """
        expiry = _Expiry()
        try:
            async with asyncio.timeout(seconds) as cm:
                yield expiry
        except TimeoutError:
            expiry.fired = cm.expired()
            raise

else:  # pragma: no cover - exercised on Python 3.10 only

    _EXPIRED = "envlink: deadline expired"

    @contextlib.asynccontextmanager
    async def bounded(seconds: float | None) -> AsyncIterator[_Expiry]:
        """Cancel the block after ``seconds`` and raise :class:`TimeoutError`.

        A cancellation from outside is passed on: only a cancellation carrying this
        deadline's own message becomes a :class:`TimeoutError` (a later ``cancel()``
        by anyone else replaces the message on 3.10, so it is never mistaken for ours).
        """
        expiry = _Expiry()
        if seconds is None:
            yield expiry
            return
        task = asyncio.current_task()
        assert task is not None

        def expire() -> None:
            expiry.fired = True
            task.cancel(_EXPIRED)

        handle = asyncio.get_running_loop().call_later(seconds, expire)
        try:
            yield expiry
        except asyncio.CancelledError as exc:
            if expiry.fired and exc.args == (_EXPIRED,):
                raise TimeoutError from exc
            raise
        finally:
            handle.cancel()


@contextlib.asynccontextmanager
async def deadline(seconds: float | None, method: str) -> AsyncIterator[None]:
    """A call's deadline: :class:`~envlink.CallTimeoutError` when it expires.

    Raises:
        CallTimeoutError: the deadline expired inside the block.
    """
    if seconds is None:
        yield
        return
    expiry: _Expiry | None = None
    try:
        async with bounded(seconds) as expiry:
            yield
    except TimeoutError as exc:
        if expiry is None or not expiry.expired() or isinstance(exc, CallTimeoutError):
            raise  # not this deadline's
        raise CallTimeoutError(
            f"{method} did not complete within {seconds:g} s", method=method, timeout=seconds,
        ) from exc
