"""What a client tells its observers: a hook base class and frozen detail records.

In the manner of stamina's ``RetryHook`` and aiohttp's ``TraceConfig``: the
client (its session core and asyncio driver) reports what happens to hook
objects and knows nothing of what they do with it. envlink's OpenTelemetry and
structlog emitter (``_telemetry/client_hook.py``) is one such hook, installed by
default; users add their own with ``EnvClient(..., hooks=[...])``.

Every method runs on the client's event loop, must be quick, must not block and
should not raise: an exception from a user's hook is logged and never reaches
the caller. Several hooks start in order and finish in reverse order; the rules
are :mod:`envlink._bridge.hook_chain`'s, which the bridge's hooks follow too.
``*_started`` returns a token that is handed back to ``*_finished``
(a span, a start time, ...); both run in the same task, so a hook may make its
span the current one in between.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, NamedTuple, Protocol, cast

from envlink._bridge.hook_chain import HookChain, combine
from envlink._errors import OUTCOMES
from envlink._sansio.retry import carried
from envlink.names import (
    HOOK_RECONNECT,
    HOOK_RECOVERY_FINISHED,
    LOG_ATTACH_WAIT,
    LOG_CLIENT_CLOSED,
    LOG_CONNECTION_DISCARDED,
    LOG_DETACHED_UNAVAILABLE,
    LOG_DISCONNECT,
    LOG_PEER_UNRESPONSIVE,
    LOG_PROVIDER_STOP_FAILED,
    LOG_RECONNECT_SCHEDULED,
    LOG_RECOVERY_FALLBACK,
    LOG_REPLAY_DIVERGED,
    LOG_SESSION_LOST,
    LOG_SESSION_RELEASE_FAILED,
    LOG_STALE_ANSWER_DROPPED,
    LOG_UNATTRIBUTABLE_FRAME,
    LOG_UNKNOWN_STEP_SETTLED,
)

__all__ = [
    "EVENTS",
    "OUTCOMES",
    "PHASES",
    "CallFinished",
    "CallStarted",
    "ClientEvent",
    "ClientHook",
    "EpisodeTape",
    "PhaseFinished",
    "PhaseReport",
    "PhaseStarted",
    "Recorder",
    "combine_client_hooks",
]


#: Phases of a call reported through :meth:`ClientHook.phase_started`.
PHASES: tuple[str, ...] = ("attempt", "connect", "resume", "replay", "close")

#: Events reported through :meth:`ClientHook.event`, with the fields each carries.
EVENTS: Mapping[str, tuple[str, ...]] = {
    LOG_RECONNECT_SCHEDULED: ("operation", "attempt", "delay", "error", "reason"),
    LOG_ATTACH_WAIT: ("attempt", "delay", "waited", "error"),
    HOOK_RECONNECT: ("reason",),
    LOG_SESSION_LOST: ("method", "policy", "steps", "error", "mechanism"),
    HOOK_RECOVERY_FINISHED: ("policy", "result", "steps", "mechanism", "method", "error",
                             "planned", "owner_recovers"),
    LOG_RECOVERY_FALLBACK: ("mechanism", "next", "reason"),
    LOG_DETACHED_UNAVAILABLE: ("status",),
    LOG_REPLAY_DIVERGED: ("index",),
    LOG_PEER_UNRESPONSIVE: (),
    LOG_STALE_ANSWER_DROPPED: ("id", "expected"),
    LOG_UNATTRIBUTABLE_FRAME: ("reason",),
    LOG_CONNECTION_DISCARDED: (),
    LOG_DISCONNECT: (),
    LOG_CLIENT_CLOSED: (),
    LOG_SESSION_RELEASE_FAILED: ("error",),
    LOG_PROVIDER_STOP_FAILED: ("provider", "error"),
    LOG_UNKNOWN_STEP_SETTLED: ("applied", "source"),
}


class CallStarted(NamedTuple):
    """A public call (``reset``, ``step``, ``state``, ``connect``, ``disconnect``) begins.

    Attributes:
        method: the call.
        server_address: the server's host.
        server_port: the server's port.
        session_id: the session's public id, if one exists yet.
        episode_id: the current episode's id, inside an episode.
    """

    method: str
    server_address: str
    server_port: int
    session_id: str | None
    episode_id: str | None


class CallFinished(NamedTuple):
    """A public call has ended, from the caller's view.

    Attributes:
        method: the call.
        outcome: ``ok``, ``error``, ``timeout`` or ``cancelled`` (:data:`OUTCOMES`).
        duration: seconds from the call until its caller was released.
        error: what the caller gets raised, ``None`` on success.
        queue_wait: seconds the call waited behind other calls of the session
            (``None`` if it never got its turn).
        step_index: for ``step``, the index of the step in its episode.
        session_id: the session's public id when the call ended.
        server_address: the server's host.
        server_port: the server's port.
    """

    method: str
    outcome: str
    duration: float
    error: BaseException | None
    queue_wait: float | None
    step_index: int | None
    session_id: str | None
    server_address: str
    server_port: int


class PhaseStarted(NamedTuple):
    """A phase inside a call begins (:data:`PHASES`).

    Attributes:
        phase: ``attempt`` (one send of the request; ``attempt > 1`` is a
            retry), ``connect`` (one connection attempt), ``resume`` / ``replay``
            (one round of session recovery) or ``close``.
        method: the call the phase belongs to.
        attempt: the phase's try number, from 1.
        reason: for ``connect``: ``connect``, ``retry``, ``resume``, ``replay``.
        replay_steps: for ``replay``: steps to replay.
        server_address: the server's host.
        server_port: the server's port.
        mechanism: for ``resume`` / ``replay``: the recovery mechanism
            (``envlink-resume``, ``openenv-resume``, ``replay``).
    """

    phase: str
    method: str
    attempt: int = 1
    reason: str | None = None
    replay_steps: int | None = None
    server_address: str = ""
    server_port: int = 0
    mechanism: str | None = None


class PhaseFinished(NamedTuple):
    """A phase has ended.

    Attributes:
        phase: what :class:`PhaseStarted` said.
        error: the failure that ended it, ``None`` on success.
        session_id: for ``connect``: the new connection's public session id.
        extensions: for ``connect``: whether envlink's extensions were negotiated.
    """

    phase: PhaseStarted
    error: BaseException | None
    session_id: str | None = None
    extensions: bool | None = None


class PhaseReport:
    """Reports one phase around a block: the one way a phase is reported.

    Entering calls :meth:`ClientHook.phase_started`; leaving calls
    :meth:`ClientHook.phase_finished` with the error that ended the block, or
    ``None``, and lets that error through. A connect phase sets ``session_id`` and
    ``extensions`` inside the block once it knows them. A request for another try
    (:func:`~envlink._sansio.retry.again`) is reported as the error it carries.
    """

    __slots__ = ("_hook", "_phase", "_token", "extensions", "session_id")

    def __init__(self, hook: ClientHook, phase: PhaseStarted) -> None:
        self._hook = hook
        self._phase = phase
        self._token: Any = None
        self.session_id: str | None = None
        self.extensions: bool | None = None

    def __enter__(self) -> PhaseReport:
        self._token = self._hook.phase_started(self._phase)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc is not None:
            exc = carried(exc)
        self._hook.phase_finished(
            PhaseFinished(self._phase, exc, self.session_id, self.extensions), self._token)


class ClientEvent(NamedTuple):
    """Something that happened (:data:`EVENTS` lists the names and their fields).

    Attributes:
        name: the event's stable dotted name (``envlink.reconnect_scheduled``...).
        session_id: the session's public id, if any.
        fields: the event's data.
    """

    name: str
    session_id: str | None
    fields: Mapping[str, Any]


class ClientHook:
    """Observer of a client: subclass it and override what you need.

    The base class does nothing, so a hook pays only for what it overrides.
    """

    #: Whether the hook wants the ``attempt`` phase of a call's first try, the one
    #: that also opens and closes with the call itself. ``False`` (envlink's telemetry
    #: hook, which measures retries only) spares every call building those two records.
    first_attempt_phases: bool = True

    def call_started(self, call: CallStarted) -> Any:
        """A call begins; the return value is handed to :meth:`call_finished`."""
        return None

    def call_finished(self, call: CallFinished, token: Any) -> None:
        """The call has ended."""

    def phase_started(self, phase: PhaseStarted) -> Any:
        """A phase begins; the return value is handed to :meth:`phase_finished`."""
        return None

    def phase_finished(self, phase: PhaseFinished, token: Any) -> None:
        """The phase has ended."""

    def message(self, direction: str, size: int) -> None:
        """A frame of ``size`` bytes was ``"sent"`` or ``"received"``."""

    def event(self, event: ClientEvent) -> None:
        """Something happened (see :data:`EVENTS`)."""


class _HookChain(HookChain, ClientHook):
    """Several client hooks behaving as one, by the rules of :mod:`envlink._bridge.hook_chain`."""

    __slots__ = ()
    log = logging.getLogger("envlink.client")
    owner = "envlink client"

    @property
    def first_attempt_phases(self) -> bool:  # type: ignore[override]
        return any(getattr(hook, "first_attempt_phases", True) for hook in self.hooks)

    def call_started(self, call: CallStarted) -> list[tuple[ClientHook, Any]]:
        return self.start("call_started", call)

    def call_finished(self, call: CallFinished, token: list[tuple[ClientHook, Any]]) -> None:
        self.finish("call_finished", call, token)

    def phase_started(self, phase: PhaseStarted) -> list[tuple[ClientHook, Any]]:
        return self.start("phase_started", phase)

    def phase_finished(self, phase: PhaseFinished,
                       token: list[tuple[ClientHook, Any]]) -> None:
        self.finish("phase_finished", phase, token)

    # Notifications loop here rather than through a helper: they run per frame, and a
    # lone user hook must cost no more than it did.
    def message(self, direction: str, size: int) -> None:
        for hook in self.hooks:
            try:
                hook.message(direction, size)
            except Exception:
                self.failed(hook)

    def event(self, event: ClientEvent) -> None:
        for hook in self.hooks:
            try:
                hook.event(event)
            except Exception:
                self.failed(hook)


def combine_client_hooks(hooks: Sequence[ClientHook]) -> ClientHook:
    """One hook standing for ``hooks``, so a call pays only for what it uses.

    The rules are :mod:`envlink._bridge.hook_chain`'s, the bridge's too: no hooks give a
    hook that does nothing; a hook that may raise is always called through a chain that
    logs and skips it; only a lone hook that declares ``never_raises = True`` (envlink's
    emitter) is called directly.
    """
    combined = combine(hooks, _HookChain)
    if combined is None:
        return ClientHook()
    return cast(ClientHook, combined)


class EpisodeTape(Protocol):
    """What a client records its episodes into: one tape per session (a recorder's).

    The client calls it where the caller gets an answer, after any recovery, so that
    a tape holds exactly what the caller got. Declared here, below the client, so that
    the client knows a recorder by this shape only (``envlink._recording`` implements it).
    """

    def wrap(self, hook: ClientHook) -> ClientHook:
        """The client's hook, wrapped to see retries and recoveries."""
        ...

    def reset_started(self, core: Any) -> None:
        """A reset is about to be sent."""
        ...

    def reset_answered(self, call: Any, kwargs: dict[str, Any], frame: Any,
                       core: Any) -> None:
        """A reset was answered (``frame``), as the caller gets it."""
        ...

    def step_answered(self, call: Any, action: dict[str, Any], frame: Any,
                      started: float) -> None:
        """A step was answered, as the caller gets it."""
        ...

    def step_failed(self, call: Any, action: dict[str, Any], core: Any) -> None:
        """A step failed: its outcome may be unknown."""
        ...

    def close(self) -> None:
        """The session ended: the episode in progress ends as ``close``."""
        ...

    def keep_lost(self) -> None:
        """Keep an episode this session loses for :meth:`hand_over` (a pool's rebuild)."""
        ...

    def hand_over(self) -> Any:
        """The episode this session lost and kept, or ``None``; no longer written here."""
        ...

    def continue_episode(self, episode: Any, mechanism: str = "replay") -> None:
        """This session rebuilt ``episode`` (handed over, or ``None``): continue it."""
        ...

    def rebuild_failed(self, episode: Any) -> None:
        """The rebuild this session began failed: ``episode`` is written as lost."""
        ...

    def restore_failed(self, journal: Any) -> None:
        """The rebuild of another process's episode failed: it is written as lost, as
        ``journal`` (what the caller got) holds it."""
        ...


class Recorder(Protocol):
    """A client's ``recorder=``: gives each session its :class:`EpisodeTape`."""

    def tape(self, server: str, *, tracing: bool = False) -> EpisodeTape:
        """A new tape for one session on ``server`` (its URL, no credentials)."""
        ...

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until the episodes finished so far are on disk (``False``: timed out)."""
        ...
