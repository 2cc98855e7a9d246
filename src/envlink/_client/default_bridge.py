"""The process-wide default :class:`~envlink.Bridge`: one loop thread for a process's clients.

A sync facade (``client.sync()``, ``pool.sync()``) that is not given a bridge runs on
this one, so that a training process holding hundreds of independent sync clients
(one per rollout, one per trajectory) has one event-loop thread, not hundreds. It is
created on first use, closed by the bridge's ``atexit`` hook, and safe across
``os.fork()``: the child's first call starts a fresh loop thread and never touches
the parent's (the loop thread's own fork handling). Closing a facade never closes it.

Opting out is passing a bridge of your own (``client.sync(bridge=Bridge())``), which
you then close; a client with its own tracer or meter provider, or with
``nested_spans=True``, gets a bridge of its own anyway, so that the bridge's telemetry
goes where the client's goes.
"""

from __future__ import annotations

import os
import threading

from envlink._bridge import Bridge
from envlink._telemetry.bridge_hook import BridgeTelemetryHook

__all__ = ["DEFAULT_BRIDGE_NAME", "default_bridge"]

#: Prefix of the default bridge's loop-thread name (a counter is appended).
DEFAULT_BRIDGE_NAME = "envlink-bridge-default"

_lock = threading.Lock()
_bridge: Bridge | None = None


def default_bridge() -> Bridge:
    """The process-wide bridge that sync clients and pools not given one share.

    Created on the first call (its thread starts on its first bridged call); a new
    one replaces it if it was closed. Its hook is envlink's OpenTelemetry emitter in
    the merged shape on the global providers: one span per client call, the client's,
    carrying the hop's queue wait.

    Returns:
        The default :class:`~envlink.Bridge` of this process.
    """
    bridge = _bridge
    if bridge is not None and not bridge.closed:
        return bridge
    return _create()


def _create() -> Bridge:
    global _bridge
    with _lock:
        if _bridge is None or _bridge.closed:
            _bridge = Bridge(name=DEFAULT_BRIDGE_NAME,
                             hooks=[BridgeTelemetryHook(nested=False)])
        return _bridge


def _after_fork_in_child() -> None:
    # The lock may have been held by another thread of the parent at the fork. The
    # bridge object itself stays: its loop thread resets itself for the child.
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
