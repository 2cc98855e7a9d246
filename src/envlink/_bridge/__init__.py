"""The sync bridge: run coroutines of any async object from blocking code.

A :class:`Bridge` owns one asyncio event loop running in a named daemon thread
(``envlink-bridge...``), started on first use. Any number of async objects (and
thousands of sessions) can share one bridge. Every bridged call

* runs in a *copy of the caller's* :mod:`contextvars` context, so the caller's
  OpenTelemetry span and baggage, and structlog context variables, are the
  context of the coroutine on the loop thread;
* is reported to the bridge's hooks (:class:`BridgeHook`, frozen
  :class:`BridgeCallStarted` / :class:`BridgeCallFinished` records with queue
  wait, run time and outcome). By default the hook is envlink's OpenTelemetry
  emitter: an INTERNAL span ``envlink.bridge <method>`` started in the caller's
  thread (so it is the parent of whatever the coroutine creates), and the
  ``envlink.bridge.wait.duration`` and ``envlink.bridge.call.duration`` histograms;
* has a ``timeout``: on expiry the coroutine is cancelled on the loop, the
  bridge waits up to ``cancel_grace`` seconds for its cleanup, then raises
  :class:`~envlink.CallTimeoutError`;
* refuses to deadlock: a call from the bridge's own loop thread raises
  :class:`~envlink.ReentrantCallError` at once.

:class:`SyncProxy` is a generic blocking view of an async object built on a
bridge: its coroutine methods become blocking methods, its async-generator
methods become iterators, and an async context manager becomes a context
manager.

The bridge knows nothing about environments nor about telemetry libraries;
:mod:`envlink._sync.sync_client` builds the environment client's sync facade on it,
:mod:`envlink._bridge.dispatch` runs a client's calls without ``await`` on that facade, and
:mod:`envlink._telemetry.bridge_hook` is its OpenTelemetry hook. Which module owns
which of its rules is in ``docs/architecture.md`` ("Sync bridge").
"""

from __future__ import annotations

from envlink._bridge.bridge import Bridge, ForeignLoopPolicy
from envlink._bridge.handoff import INTERRUPTED, abandon, was_abandoned
from envlink._bridge.lazy import LazyCoroutine
from envlink._bridge.loop import _close_all_at_exit as _close_all_at_exit
from envlink._bridge.loop import is_bridge_loop
from envlink._bridge.observers import (
    BridgeCallFinished,
    BridgeCallStarted,
    BridgeHook,
    set_default_hooks,
)
from envlink._bridge.sync_proxy import DEFAULT_TIMEOUT, Invoke, SyncProxy, blocking_wrapper
from envlink._errors import (
    OUTCOME_CANCELLED,
    OUTCOME_ERROR,
    OUTCOME_OK,
    OUTCOME_TIMEOUT,
    OUTCOMES,
)

__all__ = [
    "DEFAULT_TIMEOUT",
    "INTERRUPTED",
    "OUTCOMES",
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "OUTCOME_TIMEOUT",
    "Bridge",
    "BridgeCallFinished",
    "BridgeCallStarted",
    "BridgeHook",
    "ForeignLoopPolicy",
    "Invoke",
    "LazyCoroutine",
    "SyncProxy",
    "abandon",
    "blocking_wrapper",
    "is_bridge_loop",
    "set_default_hooks",
    "was_abandoned",
]
