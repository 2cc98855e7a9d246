"""The event loops envlink creates for itself: uvloop where it is installed.

The bridge's loop thread and ``envlink serve`` run loops of envlink's own; they use
uvloop when it can be imported (the ``fast`` extra), unless ``ENVLINK_LOOP=asyncio``.
A loop the application runs is never replaced: nothing here sets an event loop
policy or touches a loop envlink did not make.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any, Final, TypeVar

from envlink._errors import InvalidArgumentError

__all__ = ["LOOP_VARIABLE", "loop_factory", "loop_name", "run"]

#: ``asyncio`` turns uvloop off for the loops envlink creates; ``uvloop`` (or unset):
#: uvloop where it is installed.
LOOP_VARIABLE: Final = "ENVLINK_LOOP"

_T = TypeVar("_T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes envlink's own loops: ``uvloop.new_event_loop`` where uvloop is installed
    and ``ENVLINK_LOOP`` is not ``asyncio``, else ``asyncio.new_event_loop``.

    Raises:
        InvalidArgumentError: ``ENVLINK_LOOP`` is neither ``asyncio`` nor ``uvloop``.
    """
    wanted = os.environ.get(LOOP_VARIABLE, "").strip().lower()
    if wanted not in ("", "asyncio", "uvloop"):
        raise InvalidArgumentError(f"{LOOP_VARIABLE} must be 'asyncio' or 'uvloop', got {wanted!r}")
    if wanted != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
            return factory
    return asyncio.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"``: which kind of loop ``loop`` is."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, _T]) -> _T:
    """``asyncio.run(main)`` on a loop of :func:`loop_factory` (for envlink's own CLI)."""
    factory = loop_factory()
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=factory) as runner:
            return runner.run(main)
    loop = factory()  # pragma: no cover - Python 3.10: what asyncio.run does
    try:  # pragma: no cover
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(main)
    finally:  # pragma: no cover
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()
