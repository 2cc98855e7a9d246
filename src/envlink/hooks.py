"""Observing a client or a bridge: the hook interfaces and the frozen records they receive.

A client reports each call, and each phase within it (an attempt, a reconnect, a
recovery), to the :class:`ClientHook` objects given as ``EnvClient(..., hooks=[...])``;
a bridge reports each blocking call to its :class:`BridgeHook` objects. envlink's own
OpenTelemetry emitters are such hooks, installed by default::

    from envlink.hooks import CallFinished, ClientHook

    class SlowCalls(ClientHook):
        def call_finished(self, call: CallFinished, token: object) -> None:
            if call.duration > 1.0:
                print("slow", call.method, call.duration)

A client's hooks run on its event loop, a bridge's in the calling thread; either must
be quick and should not raise: an exception from a hook is logged and never reaches
the caller. The same names stay importable from :mod:`envlink` itself.
"""

from __future__ import annotations

from envlink._bridge.observers import BridgeCallFinished, BridgeCallStarted, BridgeHook
from envlink._events.client_events import (
    CallFinished,
    CallStarted,
    ClientEvent,
    ClientHook,
    PhaseFinished,
    PhaseStarted,
)

__all__ = [
    # a client's hook and what it is told
    "CallFinished",
    "CallStarted",
    "ClientEvent",
    "ClientHook",
    "PhaseFinished",
    "PhaseStarted",
    # a bridge's hook and what it is told
    "BridgeCallFinished",
    "BridgeCallStarted",
    "BridgeHook",
]
