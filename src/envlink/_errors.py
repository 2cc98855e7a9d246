"""The exception tree of envlink.

Every error that leaves the public API derives from :class:`EnvlinkError`;
no ``websockets`` or ``asyncio`` exception escapes it (the original is chained
as ``__cause__``)::

    EnvlinkError
    ├── InvalidArgumentError          an argument envlink cannot use (also a ValueError)
    │   ├── InvalidURLError           ... a URL: no or another scheme, no host, a bad port
    │   └── InvalidActionError        ... an action JSON cannot carry, refused before sending
    │                                 (also a TypeError)
    ├── ConnectError                  the connection could not be opened (also a ConnectionError)
    │   ├── HandshakeRejectedError    the server answered the upgrade with an HTTP error
    │   ├── DetachedSessionGone       an attach found the server no longer knows the session
    │   ├── NotReadyError             the server did not become ready (``/health``) in time
    │   │   │                         (also a TimeoutError)
    │   │   └── SpaceNotAwakeError    ... a Hugging Face Space that did not wake up
    │   └── ProviderError             a provider could not start (or stop) the server; also
    │                                 an instance of the provider's own exception's class
    ├── ConnectionLostError           an open connection died
    │   ├── OutcomeUnknownError       ... while a non-idempotent call was in flight
    │   ├── NotWrittenError           ... before a frame was written (provably not sent)
    │   └── NoAnswerError             ... an HTTP request accepted, then closed unanswered
    ├── CallTimeoutError              a deadline expired (also a TimeoutError)
    ├── ServerError                   the server answered with an error frame (also a
    │   │                             RuntimeError)
    │   ├── CapacityReachedError      ... with code CAPACITY_REACHED
    │   ├── ServerValidationError     ... with code VALIDATION_ERROR
    │   ├── FactoryError              ... with code FACTORY_ERROR
    │   ├── SessionError              ... with code SESSION_ERROR
    │   ├── ToolCallError             an MCP tool call reported an error
    │   ├── McpError                  a JSON-RPC ``mcp`` request got an error object
    │   ├── HarnessProtocolError      a ``/harness`` frame rejected (recoverable)
    │   └── HarnessTurnError          a ``/harness`` turn failed (terminal)
    ├── ProtocolError                 the server sent something the protocol forbids
    ├── HttpStatusError               an HTTP endpoint (``/schema``...) answered an error
    ├── SessionLostError              the server-side session is gone mid-episode
    │   ├── SessionGoneError          ... and resuming it is impossible (says why)
    │   └── ReplayDivergedError       replay gave a different observation
    ├── RetryBudgetExhaustedError     the shared retry budget refused a retry
    ├── FleetStoreError               the store of the fleet's shared limits could not be
    │                                 reached (also a ConnectionError)
    ├── FeatureUnavailableError       the server lacks a feature the call needs (names it
    │                                 and the fix; also a RuntimeError)
    ├── TrainingTraceUnavailableError loop-owning training, and the server has no trace
    │   └── CaptureProxyError         ... OpenEnv's capture proxy refused or failed a request
    ├── ClientClosedError             the client or bridge was closed, or a provider's
    │                                 cleanup is pending (also a RuntimeError)
    ├── ReentrantCallError            a blocking call from the bridge's own loop thread
    │                                 (also a RuntimeError)
    └── ExecutionModeError            a client used both with and without ``await``
                                      (also a RuntimeError)

Apart from the tree, :class:`ActionRejectedError` (a ``ValueError``) is what a served
environment raises for input it refuses; the reference server answers it with a
``VALIDATION_ERROR`` frame.

Every exception class of envlink is defined here; one that only carries control flow
inside a module has a leading underscore and stays there.

Each error is also the builtin exception OpenEnv 0.10's client raises in the same
situation, so an ``except RuntimeError:`` / ``except ConnectionError:`` /
``except TimeoutError:`` / ``except ValueError:`` written for OpenEnv still catches
it (``docs/migrating-from-openenv.md`` has the table).
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from types import TracebackType
from typing import Any, Protocol


class CarriedJournal(Protocol):
    """An episode's journal as an error carries it: an
    :class:`~envlink.EpisodeJournal` (``envlink._sansio.journal``), declared here by
    what a caller reads of it, so that the error tree imports nothing of envlink."""

    reset_kwargs: dict[str, Any]
    entries: list[Any]
    episode_id: str | None
    unknown_steps: list[str]
    steps_applied: int
    truncated: bool

    @property
    def step_count(self) -> int: ...
    @property
    def replayable(self) -> bool: ...
    def snapshot(self) -> Any: ...
    def to_dict(self) -> dict[str, Any]: ...

if sys.version_info >= (3, 11):
    _Timeout = TimeoutError
else:
    # Before 3.11 asyncio's TimeoutError (what OpenEnv's client raises for a late
    # answer, and what `except asyncio.TimeoutError:` catches) is not the builtin one.
    from asyncio.exceptions import TimeoutError as _AsyncioTimeoutError

    class _Timeout(TimeoutError, _AsyncioTimeoutError):
        """The builtin ``TimeoutError`` and asyncio's, which differ before Python 3.11."""

__all__ = [
    "OUTCOMES",
    "OUTCOME_CANCELLED",
    "OUTCOME_ERROR",
    "OUTCOME_OK",
    "OUTCOME_TIMEOUT",
    "ActionRejectedError",
    "CallTimeoutError",
    "CapacityReachedError",
    "CaptureProxyError",
    "ClientClosedError",
    "ConnectError",
    "ConnectionLostError",
    "DetachedSessionGone",
    "EnvlinkError",
    "ErrorCode",
    "ExecutionModeError",
    "FactoryError",
    "FleetStoreError",
    "HandshakeRejectedError",
    "HarnessProtocolError",
    "HarnessTurnError",
    "HttpStatusError",
    "InvalidActionError",
    "InvalidArgumentError",
    "InvalidURLError",
    "McpError",
    "NoAnswerError",
    "NotReadyError",
    "NotWrittenError",
    "OutcomeUnknownError",
    "ProtocolError",
    "ProviderError",
    "ReentrantCallError",
    "ReplayDivergedError",
    "RetryBudgetExhaustedError",
    "ServerError",
    "ServerValidationError",
    "SessionError",
    "SessionGoneError",
    "SessionLostError",
    "SpaceNotAwakeError",
    "ToolCallError",
    "TrainingTraceUnavailableError",
    "FeatureUnavailableError",
    "shorten",
]

#: How a call ended (the ``envlink.outcome`` telemetry attribute): the one set for the
#: client, the bridge and the pool. ``envlink.names`` lists them publicly.
OUTCOME_OK = "ok"
OUTCOME_ERROR = "error"
OUTCOME_TIMEOUT = "timeout"
OUTCOME_CANCELLED = "cancelled"
OUTCOMES: tuple[str, ...] = (OUTCOME_OK, OUTCOME_ERROR, OUTCOME_TIMEOUT, OUTCOME_CANCELLED)


class ErrorCode(str, Enum):
    """Error codes an OpenEnv server puts in ``{"type": "error"}`` frames."""

    INVALID_JSON = "INVALID_JSON"
    UNKNOWN_TYPE = "UNKNOWN_TYPE"
    VALIDATION_ERROR = "VALIDATION_ERROR"
    EXECUTION_ERROR = "EXECUTION_ERROR"
    CAPACITY_REACHED = "CAPACITY_REACHED"
    FACTORY_ERROR = "FACTORY_ERROR"
    SESSION_ERROR = "SESSION_ERROR"


class EnvlinkError(Exception):
    """Base class of every error raised by envlink."""

    #: Low-cardinality name used as ``error.type`` in telemetry.
    error_type: str = "envlink_error"

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled with their attributes whatever their constructor takes (keyword-only
        # fields, a formatted message), so that errors cross processes intact
        # (envlink.ray, multiprocessing). The cause and traceback stay behind.
        return (_rebuild_error, (type(self), self.args, dict(self.__dict__)))


def _rebuild_error(cls: type[EnvlinkError], args: tuple[Any, ...],
                   state: dict[str, Any]) -> EnvlinkError:
    err = cls.__new__(cls)
    err.args = args
    err.__dict__.update(state)
    return err


class InvalidArgumentError(EnvlinkError, ValueError):
    """An argument envlink cannot use: for example a client given neither a server
    URL nor a provider. Also a :class:`ValueError`, as OpenEnv raises there."""

    error_type = "invalid_argument"


class ConnectError(EnvlinkError, ConnectionError):
    """The WebSocket connection could not be opened (refused, DNS, TLS, handshake)."""

    error_type = "connect_error"

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


class HandshakeRejectedError(ConnectError):
    """The server answered the WebSocket upgrade with an HTTP error status.

    Attributes:
        status: the HTTP status code.
        retry_after: seconds from a ``Retry-After`` header, if the server sent one.
    """

    error_type = "handshake_rejected"

    def __init__(self, status: int, *, retry_after: float | None = None) -> None:
        retryable = status >= 500 or status in (408, 425, 429)
        super().__init__(f"server rejected the WebSocket upgrade with HTTP {status}",
                         retryable=retryable)
        self.status = status
        self.retry_after = retry_after


class NotReadyError(ConnectError, _Timeout):
    """The server did not answer ``GET /health`` with a healthy JSON status in time.

    Attributes:
        url: the health URL polled (no credentials).
        attempts: how many times it was polled.
        last_status: the last HTTP status seen, ``None`` if none was answered.
    """

    error_type = "not_ready"

    def __init__(self, message: str, *, url: str = "", attempts: int = 0,
                 last_status: int | None = None) -> None:
        super().__init__(message, retryable=False)
        self.url = url
        self.attempts = attempts
        self.last_status = last_status


class SpaceNotAwakeError(NotReadyError):
    """A Hugging Face Space was still asleep (503 or its HTML page) when the deadline ended."""

    error_type = "space_not_awake"


class ProviderError(ConnectError):
    """A provider (``provider=``) could not start the server, or is not a provider.

    The original failure is chained as ``__cause__``. Whatever the provider started
    has been stopped when this is raised.
    """

    error_type = "provider_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class DetachedSessionGone(ConnectError):
    """Attaching failed: the server no longer knows the client's detached session."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class HttpStatusError(EnvlinkError):
    """An HTTP endpoint of the server (``/health``, ``/schema``, ``/metadata``) answered
    with an error status, or with something that is not the expected JSON.

    Attributes:
        url: the URL (no credentials).
        status: the HTTP status.
    """

    error_type = "http_status"

    def __init__(self, message: str, *, url: str, status: int) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class ConnectionLostError(EnvlinkError):
    """An open connection was lost (closed, reset, or the peer stopped answering pings)."""

    error_type = "connection_lost"


class OutcomeUnknownError(ConnectionLostError):
    """The connection was lost after a non-idempotent request was sent.

    The server may or may not have applied it, so envlink does not resend it.

    Attributes:
        applied: ``True`` when the client learned afterwards that the server *did*
            apply it (for example from a resumed session's ``step_count``) but its
            answer was lost; ``None`` when nobody can tell.
    """

    error_type = "outcome_unknown"

    def __init__(self, message: str, *, applied: bool | None = None) -> None:
        super().__init__(message)
        self.applied = applied


class NotWrittenError(ConnectionLostError):
    """The connection was already closed: the frame was provably never written."""


class NoAnswerError(ConnectionLostError):
    """The server accepted an HTTP request, then closed without sending a byte back."""


class CallTimeoutError(EnvlinkError, _Timeout):
    """A call's deadline expired; the client stopped waiting and cancelled its work.

    If the request frame may already have reached the server (``outcome_unknown``),
    the server may or may not have applied it: a deadline cannot take back a frame
    on the wire. The client never delivers the late answer to another call, and the
    episode's journal keeps such a step in ``unknown_steps`` until its outcome is
    known.

    Attributes:
        method: the protocol method (``reset``, ``step``, ...), if known.
        timeout: the deadline in seconds that expired.
        outcome_unknown: ``True`` when the request may have been applied by the
            server; ``False`` when it provably was not sent (or was answered).
    """

    error_type = "timeout"

    def __init__(self, message: str, *, method: str | None = None,
                 timeout: float | None = None, outcome_unknown: bool = False) -> None:
        super().__init__(message)
        self.method = method
        self.timeout = timeout
        self.outcome_unknown = outcome_unknown


class ServerError(EnvlinkError, RuntimeError):
    """The server answered a request with an error frame.

    Attributes:
        code: the server's error code (an :class:`ErrorCode` when known, else the raw string).
        message: the server's message.
        details: every other field of the frame's ``data``, as sent (for example
            ``active_sessions``, ``errors``, ``factory_name``); empty if none.
    """

    error_type = "server_error"

    def __init__(self, message: str, code: ErrorCode | str, *,
                 details: dict[str, Any] | None = None) -> None:
        code_text = code.value if isinstance(code, ErrorCode) else code
        super().__init__(f"[{code_text}] {message}")
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    @classmethod
    def from_frame(cls, message: str, code: str, *, active_sessions: int | None = None,
                   max_sessions: int | None = None,
                   details: dict[str, Any] | None = None) -> ServerError:
        """Build the most specific subclass for ``code``.

        Args:
            message: the server's message.
            code: the server's error code.
            active_sessions: the frame's ``active_sessions`` (``CAPACITY_REACHED`` only).
            max_sessions: the frame's ``max_sessions`` (``CAPACITY_REACHED`` only).
            details: every other field of the frame's ``data``.
        """
        try:
            known: ErrorCode | str = ErrorCode(code)
        except ValueError:
            known = code
        extra = dict(details or {})
        if known is ErrorCode.CAPACITY_REACHED:
            return CapacityReachedError(message, known, active_sessions=active_sessions,
                                        max_sessions=max_sessions, details=extra)
        if known is ErrorCode.VALIDATION_ERROR:
            errors = extra.get("errors")
            return ServerValidationError(
                message, known, errors=errors if isinstance(errors, list) else None,
                details=extra)
        if known is ErrorCode.FACTORY_ERROR:
            name = extra.get("factory_name")
            return FactoryError(message, known,
                                factory_name=name if isinstance(name, str) else None,
                                details=extra)
        if known is ErrorCode.SESSION_ERROR:
            return SessionError(message, known, details=extra)
        return cls(message, known, details=extra)


class CapacityReachedError(ServerError):
    """The server refused a new session: its session limit is reached.

    Attributes:
        active_sessions: sessions the server had when it refused, if it said so.
        max_sessions: the server's session limit, if it said so.
    """

    error_type = "capacity_reached"

    def __init__(self, message: str, code: ErrorCode | str = ErrorCode.CAPACITY_REACHED, *,
                 active_sessions: int | None = None, max_sessions: int | None = None,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message, code, details=details)
        self.active_sessions = active_sessions
        self.max_sessions = max_sessions


class ServerValidationError(ServerError):
    """The server refused a request or an action as invalid (``VALIDATION_ERROR``).

    Attributes:
        errors: the server's list of field errors, as sent (OpenEnv sends pydantic's:
            ``type``, ``loc``, ``msg``, ``input``...); empty if it sent none.
    """

    error_type = "validation_error"

    def __init__(self, message: str, code: ErrorCode | str = ErrorCode.VALIDATION_ERROR, *,
                 errors: list[Any] | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, code, details=details)
        self.errors: list[Any] = list(errors or [])
        summary = _field_errors_text(self.errors)
        if summary:
            self.args = (f"{self.args[0]}: {summary}",)


#: The most characters of field errors a :class:`ServerValidationError`'s text carries.
_FIELD_ERRORS_TEXT_LIMIT = 400


def _field_errors_text(errors: list[Any]) -> str:
    """``"loc: msg; loc: msg"`` for the server's field errors, at most
    `_FIELD_ERRORS_TEXT_LIMIT` characters, then how many more there were. Only
    the location and the message: never the rejected ``input``, which may be a secret."""
    parts: list[str] = []
    for item in errors:
        if isinstance(item, dict):
            loc = item.get("loc")
            where = ".".join(str(p) for p in loc) if isinstance(loc, (list, tuple)) else ""
            msg = str(item.get("msg", "")) or str(item.get("type", "")) or "invalid"
            parts.append(f"{where}: {msg}" if where else msg)
        else:
            parts.append(str(item))
    text = ""
    for shown, part in enumerate(parts):
        piece = part if not text else f"; {part}"
        if len(text) + len(piece) > _FIELD_ERRORS_TEXT_LIMIT:
            more = len(parts) - shown
            clipped = piece[: max(0, _FIELD_ERRORS_TEXT_LIMIT - len(text))]
            return f"{text}{clipped}... ({more} more)" if clipped else f"{text} ({more} more)"
        text += piece
    return text


class FactoryError(ServerError):
    """The server could not create the environment for a session (``FACTORY_ERROR``).

    Attributes:
        factory_name: the name of the server's environment factory, if it said so.
    """

    error_type = "factory_error"

    def __init__(self, message: str, code: ErrorCode | str = ErrorCode.FACTORY_ERROR, *,
                 factory_name: str | None = None, details: dict[str, Any] | None = None) -> None:
        super().__init__(message, code, details=details)
        self.factory_name = factory_name


class SessionError(ServerError):
    """The server refused the session itself (``SESSION_ERROR``): for example an
    unknown or already attached ``session_id``."""

    error_type = "session_error"

    def __init__(self, message: str, code: ErrorCode | str = ErrorCode.SESSION_ERROR, *,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message, code, details=details)


class McpError(ServerError):
    """A JSON-RPC request sent as an ``mcp`` message was answered with an error object.

    Attributes:
        rpc_code: the JSON-RPC error code (``-32601`` method not found, ...).
        data: the error object's ``data``, if any.
    """

    error_type = "mcp_error"

    def __init__(self, message: str, rpc_code: int, *, data: Any = None) -> None:
        super().__init__(message, "MCP_ERROR", details={"code": rpc_code, "data": data})
        self.rpc_code = rpc_code
        self.data = data


class ToolCallError(ServerError):
    """An MCP-style tool call failed on the server (unknown tool, invalid arguments, ...).

    ``code`` is the server's error type (e.g. ``tool_not_found``), ``tool_name`` the tool.
    """

    error_type = "tool_call_error"

    def __init__(self, message: str, code: str, *, tool_name: str) -> None:
        super().__init__(message, code)
        self.tool_name = tool_name


class HarnessProtocolError(ServerError):
    """The server rejected a frame with a recoverable ``protocol_error``; no turn ran.

    The session is still usable: correct the message and send again.
    """

    error_type = "harness_protocol_error"


class HarnessTurnError(ServerError):
    """The turn failed with a terminal ``error`` event; the server ended the session."""

    error_type = "harness_turn_error"


class ProtocolError(EnvlinkError):
    """The server sent a frame the protocol does not allow.

    Attributes:
        reason: what was wrong, in a few words.
    """

    error_type = "protocol_error"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SessionLostError(EnvlinkError):
    """The server-side session was lost mid-episode and could not be recovered.

    Attributes:
        journal: what the episode did so far (reset kwargs, actions, observations),
            enough to rebuild it elsewhere.
    """

    error_type = "session_lost"

    def __init__(self, message: str, *, journal: CarriedJournal | None = None) -> None:
        super().__init__(message)
        self.journal = journal


class SessionGoneError(SessionLostError):
    """The session was lost and resuming it is impossible; ``reason`` says why.

    Raised under ``on_session_lost="resume"`` (``"auto"`` replays instead, where it
    can). The journal is there to rebuild the episode elsewhere.

    Attributes:
        reason: ``"server_restarted"`` (the server was unreachable, then no longer
            knew the session), ``"session_unknown"`` (the server stayed up but no
            longer knows the session: reaped by its idle timeout or closed; a stock
            OpenEnv server does not say which), ``"session_expired"`` /
            ``"session_closed"`` (the server said so), or ``"resume_unsupported"``
            (the server offers no way to resume).
    """

    error_type = "session_gone"

    def __init__(self, message: str, *, reason: str,
                 journal: CarriedJournal | None = None) -> None:
        super().__init__(message, journal=journal)
        self.reason = reason


class ReplayDivergedError(SessionLostError):
    """Replaying the journal gave an observation different from the recorded one.

    Attributes:
        index: the position of the replayed action (0-based) that diverged.
        expected: the recorded observation payload.
        actual: the observation payload the server gave on replay.
    """

    error_type = "replay_diverged"

    def __init__(self, message: str, *, index: int, expected: Any, actual: Any,
                 journal: CarriedJournal | None = None) -> None:
        super().__init__(message, journal=journal)
        self.index = index
        self.expected = expected
        self.actual = actual


class RetryBudgetExhaustedError(EnvlinkError):
    """The shared retry budget refused a retry: too many recent failures in the fleet."""

    error_type = "retry_budget_exhausted"


class FleetStoreError(EnvlinkError, ConnectionError):
    """The store of the fleet's shared limits (:class:`~envlink.FleetLimits`) could not
    be reached or used: a directory that cannot be written, a Redis server that does not
    answer, a Ray actor that is gone.

    Raised instead of waiting on a store that is not there, when ``FleetLimits``'s
    ``on_store_error`` is ``"raise"`` (the default); with ``"local"``, the process
    goes on under its own limits instead.

    Attributes:
        store: the store, its credentials removed.
    """

    error_type = "fleet_store_error"

    def __init__(self, message: str, *, store: str = "") -> None:
        super().__init__(message)
        self.store = store


class FeatureUnavailableError(EnvlinkError, RuntimeError):
    """The server lacks a feature the call needs; the message names the feature and
    the fix. Not a connection failure: asking again gets the same answer.

    Attributes:
        feature: what the server lacks, in words (e.g. ``"HTTP MCP sessions"``).
        fix: what to change, on the server or in the call.
    """

    error_type = "feature_unavailable"

    def __init__(self, message: str, *, feature: str, fix: str) -> None:
        super().__init__(f"{message}: the server lacks {feature}; {fix}")
        self.feature = feature
        self.fix = fix


class TrainingTraceUnavailableError(EnvlinkError):
    """Loop-owning training needs a training trace the server cannot give.

    Raised by :meth:`EnvlinkSessionFactory.create
    <envlink.integrations.openenv_harness.EnvlinkSessionFactory.create>` when the server
    has no ``/harness`` or its ``session_started`` does not advertise ``training_trace``:
    train with the trainer's own sampling instead (TRL: pass ``harness_adapter=``), which
    uses the server's step sessions.
    """

    error_type = "training_trace_unavailable"


class CaptureProxyError(TrainingTraceUnavailableError):
    """OpenEnv's capture proxy (``openenv.core.harness.capture``) answered an error.

    Raised by a loop-owning session whose trace comes from the proxy, when minting the
    rollout's key (``POST /sessions``), reading its capture or ending it is refused.

    Attributes:
        status: the HTTP status of the proxy's answer.
        retryable: whether trying again may succeed (a 5xx, 408 or 429).
    """

    error_type = "capture_proxy_error"

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status
        self.retryable = status >= 500 or status in (408, 429)


class ClientClosedError(EnvlinkError, RuntimeError):
    """The client (or the bridge it runs on) was closed, or its cleanup is pending.

    Also a :class:`RuntimeError`, as OpenEnv 0.10 raises for a closed client or a
    pending provider cleanup; the message names ``close()``.
    """

    error_type = "client_closed"


class ReentrantCallError(EnvlinkError, RuntimeError):
    """A blocking bridged call was made from the bridge's own event-loop thread.

    It would deadlock: the loop would wait for itself. Await the async client instead.
    """

    error_type = "reentrant_call"


class ExecutionModeError(EnvlinkError, RuntimeError):
    """A client used in blocking (plain) code was then awaited, or the other way round.

    A client claims ``"sync"`` or ``"async"`` on first use, as OpenEnv 0.10's does
    (and, like OpenEnv's error, this is a :class:`RuntimeError`). Create one client
    per style, or use ``client.sync()`` for a blocking facade beside async use.
    """

    error_type = "execution_mode"


class InvalidURLError(InvalidArgumentError):
    """A URL argument cannot be used: no or another scheme, no host, a bad port.

    Raised when the client (or pool) is created, before any connection. An
    :class:`InvalidArgumentError`, so also a builtin :class:`ValueError`.

    Attributes:
        argument: the argument that holds the URL (``"base_url"``, ``"endpoints"``).
        url: the URL as given, without credentials.
    """

    error_type = "invalid_url"

    def __init__(self, message: str, *, argument: str, url: str) -> None:
        super().__init__(message)
        self.argument = argument
        self.url = url


class InvalidActionError(InvalidArgumentError, TypeError):
    """An action (or reset or tool arguments) holds a value JSON cannot carry faithfully.

    Refused before anything is sent: NaN or an infinity, a value of no JSON form, or a
    top-level key that is not a string. (A ``set`` and ``bytes`` are sent as a list and
    a string: the encoder writes them without a hook to refuse them.) An
    :class:`InvalidArgumentError`, and also a builtin :class:`TypeError` and
    :class:`ValueError` (what the standard library's ``json`` raises for these).

    Attributes:
        path: where the value is, e.g. ``"action.tags"`` or ``"action.moves[2]"``.
        reason: what is wrong with it.
    """

    error_type = "invalid_action"

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class ActionRejectedError(ValueError):
    """Raised by a served environment for an action or reset argument it does not accept.

    Server side (:mod:`envlink.server`): the reference server answers it with a
    ``VALIDATION_ERROR`` frame (any other exception becomes ``EXECUTION_ERROR``), which
    the client raises as :class:`ServerValidationError`. A :class:`ValueError`, not an
    :class:`EnvlinkError`: an environment raises it, envlink never does.
    ``envlink.server.InvalidActionError`` is its earlier name.
    """


# ------------------------------------------------------------------
# Short tracebacks for envlink's own errors: the caller's frames and the error's origin.
#
# An error that leaves envlink has passed through the driver, the retry loop (tenacity,
# which re-raises through ``concurrent.futures``), the bridge's hand-off and the facade:
# forty frames between the caller's line and the line that raised it, none of which
# tells the caller anything. :func:`shorten` drops them from the error's traceback,
# keeping every frame of anyone else's code (a typed client's hooks) and the innermost
# frame, where the error was raised; each exception it was raised from (the root cause,
# such as the ``OSError`` of a refused connection) keeps its innermost frame. Only
# tracebacks are touched, never the exceptions' types, messages or chain.

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
