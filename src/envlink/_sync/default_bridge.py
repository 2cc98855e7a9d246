"""The process-wide default :class:`~envlink.Bridge`: one loop thread for a process's clients.

A sync facade (``client.sync()``, ``pool.sync()``, a client's plain calls) that is not
given a bridge runs on this one, so that a training process holding hundreds of
independent sync clients (one per rollout, one per trajectory) has one event-loop
thread, not hundreds.

Its thread lives while a facade on it is open: each facade on the default bridge
(given none, or given the default bridge itself) holds a lease, and when the last one
is given back (the facade closed, or collected unclosed), the bridge is closed and its
thread joined, so that no envlink thread is left behind. The next facade gets a new
default bridge, whose thread starts on its first call. A facade opened while the old
bridge is stopping gets the new one: the old one is unset under the lock before it is
closed, and a closed bridge is never handed out again.

It is also closed by the bridge's ``atexit`` hook, and safe across ``os.fork()``: the
child's first call starts a fresh loop thread and never touches the parent's (the loop
thread's own fork handling).

Opting out is passing a bridge of your own (``client.sync(bridge=Bridge())``), which
you then close; a client with its own tracer or meter provider, or with
``nested_spans=True``, gets a bridge of its own anyway, so that the bridge's telemetry
goes where the client's goes.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

from envlink._bridge import Bridge
from envlink._telemetry.bridge_hook import BridgeTelemetryHook

__all__ = ["DEFAULT_BRIDGE_NAME", "default_bridge", "lease_bridge"]

#: Prefix of the default bridge's loop-thread name (a counter is appended).
DEFAULT_BRIDGE_NAME = "envlink-bridge-default"

# Reentrant: a lease given back by the collector (a facade collected unclosed) may run
# while this thread holds the lock, allocating a new bridge.
_lock = threading.RLock()
_bridge: Bridge | None = None
#: Leases held on ``_bridge``: facades open on it.
_users = 0
#: Every default bridge of this process, current or closed.
_defaults: weakref.WeakSet[Bridge] = weakref.WeakSet()


def default_bridge() -> Bridge:
    """The process-wide bridge that sync clients and pools not given one share.

    Created on the first call (its thread starts on its first bridged call); a new
    one replaces it once it is closed, which happens when the last facade on it
    closes. Its hook is envlink's OpenTelemetry emitter in the merged shape on the
    global providers: one span per client call, the client's, carrying the hop's
    queue wait.

    Calling it does not keep the bridge open: a bridge used directly
    (``default_bridge().call(...)``) is closed with the last facade on it, and
    ``default_bridge()`` then returns a new one. For calls of your own, use a
    :class:`~envlink.Bridge` of your own.

    Returns:
        The default :class:`~envlink.Bridge` of this process.
    """
    bridge = _bridge
    if bridge is not None and not bridge.closed:
        return bridge
    with _lock:
        return _current()


def _current() -> Bridge:
    global _bridge, _users
    if _bridge is None or _bridge.closed:
        _bridge = Bridge(name=DEFAULT_BRIDGE_NAME, hooks=[BridgeTelemetryHook(nested=False)])
        _defaults.add(_bridge)
        _users = 0
    return _bridge


def lease_bridge(bridge: Bridge | None, owner: object
                 ) -> tuple[Bridge, Callable[[], None] | None]:
    """The bridge a new facade ``owner`` runs on, and how it gives its lease back.

    Args:
        bridge: the bridge the facade was given; ``None`` for the default one. A
            default bridge closed since it was fetched (by its last facade) is
            replaced by the current one: a facade never starts on a dead loop.
        owner: the facade; collected unclosed, it gives its lease back then.

    Returns:
        ``(bridge, release)``: ``release`` (call it once the facade is closed; later
        calls do nothing) when the bridge is the default one, else ``None``.
    """
    global _users
    with _lock:
        if bridge is None or (bridge in _defaults and bridge is not _bridge):
            # A default bridge fetched before its last facade closed it: the current one.
            bridge = _current()
        elif bridge is not _bridge:
            return bridge, None  # a bridge of the caller's own: not leased
        _users += 1
    release = weakref.finalize(owner, _release, bridge)
    release.atexit = False  # at exit, the bridge's own hook closes it
    return bridge, release


def _release(bridge: Bridge) -> None:
    global _bridge, _users
    with _lock:
        if bridge is not _bridge:
            return  # closed (by hand, or at exit) and replaced: nothing to give back
        _users -= 1
        if _users > 0:
            return
        # Unset before closing: a facade opened from now on gets a new bridge.
        _bridge = None
    bridge.close()


def _after_fork_in_child() -> None:
    # The lock may have been held by another thread of the parent at the fork. The
    # bridge object itself stays: its loop thread resets itself for the child.
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
