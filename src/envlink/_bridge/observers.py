"""What a bridge tells its observers: a hook protocol and frozen detail records.

In the manner of stamina's ``RetryHook``: the bridge reports each call to hook
objects and knows nothing of what they do with it. envlink's OpenTelemetry
emitter (:mod:`envlink._telemetry.bridge_hook`) is one such hook, installed by
default; users may add their own.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, cast

__all__ = [
    "OUTCOMES",
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "OUTCOME_TIMEOUT",
    "BridgeCallFinished",
    "BridgeCallStarted",
    "BridgeHook",
    "DefaultHooksFactory",
    "combine_hooks",
    "default_hooks",
    "set_default_hooks",
]

from envlink._bridge.hook_chain import HookChain, combine
from envlink._errors import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
    OUTCOMES,
)


class BridgeCallStarted(NamedTuple):
    """A bridged call about to be handed to the loop (reported in the caller's thread).

    Attributes:
        method: the call's name (``method=`` of :meth:`Bridge.call`).
        context: the copy of the caller's :mod:`contextvars` context the coroutine
            will run in. A hook may set variables in it (``context.run(var.set, x)``),
            e.g. make its span the coroutine's current span.
    """

    method: str
    context: contextvars.Context


class BridgeCallFinished(NamedTuple):
    """A bridged call that has ended, from the caller's view (reported in its thread).

    Attributes:
        method: the call's name.
        outcome: ``ok``, ``error``, ``timeout`` or ``cancelled`` (:data:`OUTCOMES`):
            timeouts are the bridge's own or a ``TimeoutError`` of the coroutine,
            ``cancelled`` an interrupt or the bridge closing under the call.
        queue_wait: seconds from the hand-off until the loop started the coroutine
            (until the end if it never started).
        run_time: seconds the coroutine ran, ``None`` if it never started.
        duration: seconds from the hand-off until the caller was released.
        error: what the caller gets raised, ``None`` on success.
    """

    method: str
    outcome: str
    queue_wait: float
    run_time: float | None
    duration: float
    error: BaseException | None

    @property
    def error_type(self) -> type[BaseException] | None:
        """The type of :attr:`error`, ``None`` on success."""
        return None if self.error is None else type(self.error)


class BridgeHook(Protocol):
    """Observer of bridged calls. Both methods run in the caller's thread.

    Hooks must be quick and should not raise: an exception from a hook is logged
    and never reaches the caller. Several hooks start in order and finish in reverse
    order (:mod:`envlink._bridge.hook_chain` has the rules, the client's hooks follow
    them too).
    """

    def call_started(self, call: BridgeCallStarted) -> Any:
        """A call is about to be handed off; the return value is given back at the end."""

    def call_finished(self, call: BridgeCallFinished, token: Any) -> None:
        """The call has ended; ``token`` is what :meth:`call_started` returned."""


class _HookChain(HookChain):
    """Several bridge hooks behaving as one, by the rules of :mod:`envlink._bridge.hook_chain`."""

    __slots__ = ()
    log = logging.getLogger("envlink.bridge")
    owner = "envlink bridge"

    def call_started(self, call: BridgeCallStarted) -> list[tuple[BridgeHook, Any]]:
        return self.start("call_started", call)

    def call_finished(self, call: BridgeCallFinished,
                      token: list[tuple[BridgeHook, Any]]) -> None:
        self.finish("call_finished", call, token)


def combine_hooks(hooks: Sequence[BridgeHook]) -> BridgeHook | None:
    """One hook standing for ``hooks`` (``None`` for none), so a call pays for what it uses.

    The rules are :mod:`envlink._bridge.hook_chain`'s, the client's too. A lone hook is
    called directly: :meth:`Bridge.call` calls it under those rules itself.
    """
    return cast("BridgeHook | None", combine(hooks, _HookChain, owner_catches=True))


#: Builds the default hooks of a bridge from its ``tracer_provider`` and ``meter_provider``.
DefaultHooksFactory = Callable[[Any, Any], Sequence[BridgeHook]]
_default_factory: DefaultHooksFactory | None = None


def set_default_hooks(factory: DefaultHooksFactory | None) -> None:
    """Install what builds the hooks of bridges created without ``hooks=``.

    envlink installs its OpenTelemetry emitter when it is imported; the bridge
    itself depends on no telemetry library.
    """
    global _default_factory
    _default_factory = factory


def default_hooks(tracer_provider: Any, meter_provider: Any) -> Sequence[BridgeHook]:
    """The hooks of a bridge created without ``hooks=``."""
    factory = _default_factory
    return () if factory is None else factory(tracer_provider, meter_provider)
