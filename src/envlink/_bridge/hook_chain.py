"""Several hooks behaving as one: the chain, and its rules, for the client and the bridge.

The client (:func:`envlink._events.client_events.combine_client_hooks`) and the bridge
(:func:`envlink._bridge.observers.combine_hooks`) turn their ``hooks=`` into one hook with
:func:`combine`, so both follow the same rules:

- **No hooks**: the owner gets its stand-in (the client a do-nothing hook, the bridge
  ``None``) and nothing is called for a hook.
- **One hook** is called directly where nothing it raises can reach the caller: it
  declares ``never_raises = True`` (envlink's telemetry emitters), or its owner calls it
  under the same rules as the chain (the bridge's two call sites). Any other lone hook
  goes through a chain.
- **A chain** starts its hooks in the order given and finishes them in reverse order,
  so they nest like context managers: the first hook's span encloses the next one's.
  Each hook gets back the token its own start returned (a span, a start time, a
  context manager to exit...). One-off notifications (the client's ``message`` and
  ``event``) go to every hook, in order.
- **A hook that raises** (an ``Exception``; ``KeyboardInterrupt`` and other
  ``BaseException`` go through) is logged at WARNING on the owner's logger, with the
  traceback, and skipped: the other hooks still run and the caller never sees the
  exception. A hook whose start raised has no token and is not finished.

The bridge is generic and imports nothing of the client, so this module lives here,
where both may import it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

__all__ = ["HookChain", "combine"]

_H = TypeVar("_H")


class HookChain:
    """The rules above, for hooks whose methods come in pairs: ``*_started(record)``
    returns a token, ``*_finished(record, token)`` gets it back.

    A kind of chain (the client's, the bridge's) subclasses it with the methods of its
    hook protocol, each a call of :meth:`start`, :meth:`finish` or :meth:`failed`, and
    names the logger a failing hook is reported on.
    """

    __slots__ = ("hooks",)

    #: Where a failing hook is reported.
    log: ClassVar[logging.Logger] = logging.getLogger("envlink")
    #: Who the hooks belong to, at the start of that report ("envlink client").
    owner: ClassVar[str] = "envlink"

    def __init__(self, hooks: Sequence[Any]) -> None:
        self.hooks = tuple(hooks)

    def start(self, name: str, record: Any) -> list[tuple[Any, Any]]:
        """Call ``hook.<name>(record)`` on every hook, in order; return who started, with
        each one's token (what :meth:`finish` needs)."""
        started = []
        for hook in self.hooks:
            try:
                started.append((hook, getattr(hook, name)(record)))
            except Exception:
                self.failed(hook)
        return started

    def finish(self, name: str, record: Any, started: list[tuple[Any, Any]]) -> None:
        """Call ``hook.<name>(record, token)`` on the hooks that started, in reverse order."""
        for hook, token in reversed(started):
            try:
                getattr(hook, name)(record, token)
            except Exception:
                self.failed(hook)

    def failed(self, hook: Any) -> None:
        """Report a hook that raised (call it from an ``except`` block)."""
        self.log.warning("%s: hook %r failed", self.owner, hook, exc_info=True)


def combine(hooks: Sequence[_H], chain: type[HookChain], *,
            owner_catches: bool = False) -> _H | HookChain | None:
    """One hook standing for ``hooks``, so a call pays only for what it uses.

    Args:
        hooks: the owner's hooks, in the order they start.
        chain: the owner's kind of :class:`HookChain`.
        owner_catches: the owner calls a lone hook under the chain's rules itself
            (catches, logs, does not finish a hook whose start failed).

    Returns:
        ``None`` for no hooks; a lone hook itself when it declares
        ``never_raises = True`` or ``owner_catches``; else a chain of them.
    """
    if not hooks:
        return None
    if len(hooks) == 1 and (owner_catches or getattr(hooks[0], "never_raises", False) is True):
        return hooks[0]
    return chain(hooks)
