"""Short tracebacks for envlink's own errors: the caller's frames and the error's origin.

An error that leaves envlink has passed through the driver, the retry loop (tenacity,
which re-raises through ``concurrent.futures``), the bridge's hand-off and the facade:
forty frames between the caller's line and the line that raised it, none of which
tells the caller anything. :func:`shorten` drops them from the error's traceback,
keeping every frame of anyone else's code (a typed client's hooks) and the innermost
frame, where the error was raised; each exception it was raised from (the root cause,
such as the ``OSError`` of a refused connection) keeps its innermost frame. Only
tracebacks are touched, never the exceptions' types, messages or chain.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType

__all__ = ["shorten"]

#: Modules whose frames add nothing to an envlink error's traceback, by package folder.
_MACHINERY = ("tenacity", "concurrent.futures")
_ENVLINK_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_dirs: tuple[str, ...] | None = None


def _machinery_dirs() -> tuple[str, ...]:
    global _dirs
    if _dirs is None or len(_dirs) <= len(_MACHINERY):
        found = [_ENVLINK_DIR]
        for name in _MACHINERY:
            module = sys.modules.get(name)
            path = getattr(module, "__file__", None)
            if path:
                found.append(os.path.dirname(os.path.abspath(path)) + os.sep)
        _dirs = tuple(found)
    return _dirs


def _innermost(tb: TracebackType) -> TracebackType:
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _filtered(tb: TracebackType, dirs: tuple[str, ...]) -> TracebackType:
    """``tb`` without the machinery's frames, but its innermost one."""
    kept: list[TracebackType] = []
    entry: TracebackType | None = tb
    while entry is not None:
        if entry.tb_next is None or not entry.tb_frame.f_code.co_filename.startswith(dirs):
            kept.append(entry)
        entry = entry.tb_next
    if len(kept) == 1:
        return kept[0]
    rebuilt: TracebackType | None = None
    for entry in reversed(kept):
        rebuilt = TracebackType(rebuilt, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    assert rebuilt is not None
    return rebuilt


def shorten(error: BaseException) -> BaseException:
    """Drop the frames of envlink and its retry machinery from ``error``'s traceback.

    Kept: every other frame, and the innermost one (where ``error`` was raised). Each
    exception in its chain (``__cause__``, or an unsuppressed ``__context__``) keeps
    only its innermost frame. Call it where the error is about to leave envlink;
    frames added as it propagates further (the public method's, the caller's) show.

    Returns:
        ``error`` itself.
    """
    tb = error.__traceback__
    if tb is not None:
        error.__traceback__ = _filtered(tb, _machinery_dirs())
    seen = {id(error)}
    link = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if link.__traceback__ is not None:
            link.__traceback__ = _innermost(link.__traceback__)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return error
