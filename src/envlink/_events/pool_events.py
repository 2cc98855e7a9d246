"""What a pool tells its observers: a hook base class and frozen detail records.

As the client does (``_events/client_events.py``), the pools (``EnvPool``, ``RayEnvPool``
and the shards inside Ray actors) report what happens to a :class:`PoolHook` and
know nothing of what it does with it. envlink's OpenTelemetry and structlog emitter
(``_telemetry/pool_hook.py``) is the hook every pool gets; it is the only place that
creates the pool's spans, records its metrics or logs its events.

Every method runs on the pool's event loop and must not block or raise.
``batch_started`` returns a token handed back to ``batch_finished``; both run in
the same task, and the slots' tasks are created in between, so a hook may make a
span the current one and the sessions' own spans become its children.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, NamedTuple, Protocol

from envlink.names import LOG_POOL_CAPACITY_WAIT, LOG_POOL_SESSION_MOVED, LOG_SESSION_LOST

__all__ = ["EVENTS", "BatchFinished", "BatchReport", "BatchStarted", "BreakerChange",
           "BreakerStates", "PoolEvent", "PoolHook"]

#: Events reported through :meth:`PoolHook.event`, with the fields each carries.
EVENTS: Mapping[str, tuple[str, ...]] = {
    LOG_POOL_CAPACITY_WAIT: ("wait", "delay_s", "error_type"),
    LOG_POOL_SESSION_MOVED: ("slot", "from_url", "to_url", "steps", "error_type", "recovery",
                             "error"),
    LOG_SESSION_LOST: ("slot", "policy", "recovery", "steps", "error"),
}


class BatchStarted(NamedTuple):
    """A batch call begins.

    Attributes:
        method: ``reset``, ``step``, ``step_send`` (steps started, collected later)
            or ``recv`` (a ready-first collection); inside a shard actor also
            ``restore``.
        size: the pool's (or the shard's) number of slots.
        slots: the slots the call is for.
        min_ready: for ``recv``: the answers it waits for.
        shards: for a ``RayEnvPool``: its number of shard actors.
        shard: inside a shard actor: the shard's number (the call is the shard's
            part of a driver's batch).
    """

    method: str
    size: int
    slots: int
    min_ready: int | None = None
    shards: int | None = None
    shard: int | None = None


class BatchFinished(NamedTuple):
    """A batch call has ended.

    Attributes:
        started: what :class:`BatchStarted` said.
        batch: the answers, the pool's :class:`~envlink.Batch` (a list, one entry per
            slot; ``None`` when the call failed, or gives none yet). Typed as the list it
            is: the records sit below the pool and do not import it.
        error: what escaped the call (a caller's bug, a cancellation), else ``None``.
    """

    started: BatchStarted
    batch: list[Any] | None
    error: BaseException | None


class BreakerChange(NamedTuple):
    """An endpoint's circuit breaker moved.

    Attributes:
        host: the endpoint's host.
        port: its port.
        url: its URL, safe to show.
        old: the state it left (``closed``, ``open``, ``half_open``).
        new: the state it is in now.
        failures: consecutive connection failures.
    """

    host: str
    port: int
    url: str
    old: str
    new: str
    failures: int


class PoolEvent(NamedTuple):
    """Something that happened (:data:`EVENTS` lists the names and their fields)."""

    name: str
    fields: Mapping[str, Any]


class BreakerStates(Protocol):
    """What can be asked for each endpoint's ``(host, port, breaker state)`` at any time."""

    def breaker_states(self) -> Iterable[tuple[str, int, str]]: ...


class PoolHook:
    """Observer of a pool: subclass it and override what you need (the base does nothing)."""

    def batch_started(self, batch: BatchStarted) -> Any:
        """A batch call begins; the return value is handed to :meth:`batch_finished`."""
        return None

    def batch_finished(self, batch: BatchFinished, token: Any) -> None:
        """The batch call has ended."""

    def sessions_changed(self, host: str, port: int, state: str, delta: int) -> None:
        """``delta`` (+1 or -1) of the pool's sessions on ``host:port`` in ``state``."""

    def placement(self, host: str, port: int, result: str) -> None:
        """A placement attempt on ``host:port`` ended: ``placed``, ``capacity_reached``
        or ``unreachable``."""

    def breaker_changed(self, change: BreakerChange) -> None:
        """An endpoint's circuit breaker moved."""

    def watch_breakers(self, source: BreakerStates) -> None:
        """From now on, ``source``'s breakers may be read at any time (until unwatched)."""

    def unwatch_breakers(self, source: BreakerStates) -> None:
        """``source``'s breakers are gone (the pool closed)."""

    def shard_replaced(self, shard: int, kind: str, reason: str, policy: str) -> None:
        """A ``RayEnvPool`` replaced a shard actor that ``kind`` (died, unresponsive)."""

    def event(self, event: PoolEvent) -> None:
        """Something happened (see :data:`EVENTS`)."""


class BatchReport:
    """Reports one batch call around a block: the one way a batch is reported.

    Entering calls :meth:`PoolHook.batch_started`; leaving calls
    :meth:`PoolHook.batch_finished` with the ``batch`` set inside the block and the
    error that ended it, which it lets through.
    """

    __slots__ = ("_hook", "_started", "_token", "batch")

    def __init__(self, hook: PoolHook, started: BatchStarted) -> None:
        self._hook = hook
        self._started = started
        self._token: Any = None
        self.batch: list[Any] | None = None

    def __enter__(self) -> BatchReport:
        self._token = self._hook.batch_started(self._started)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._hook.batch_finished(BatchFinished(self._started, self.batch, exc), self._token)
