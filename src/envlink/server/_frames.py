"""What one frame means to a session and what the server answers: pure, no sockets.

The protocol logic of OpenEnv's ``/ws`` endpoint, as envlink's reference server
implements it: a received frame is classified once (:func:`classify`, parsing its
JSON once), then answered (:func:`respond`): applied to the session's environment,
answered from the de-duplication cache, refused with OpenEnv's error codes, or
replaced by an injected error or corrupt frame. No asyncio, no websockets, no
telemetry: the server (:mod:`envlink.server._server`) moves the bytes, applies the
I/O faults (stalls, drops, latency) and reports what :class:`Reply` says.
Conformance tests drive :func:`dispatch` directly, without a socket.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from envlink._errors import ErrorCode, ProtocolError
from envlink._sansio.limits import SERVER_MAX_MESSAGE_VALUES, check_json_values
from envlink._sansio.protocol import (
    CloseRequest,
    ResetRequest,
    StateRequest,
    StepRequest,
    encode_response,
    validate_request,
)
from envlink.server._environments.environment import (
    ActionRejectedError,
    Transition,
    accepted_kwargs,
)
from envlink.server._faults import FaultChain, corrupt_frame
from envlink.server._store import Session

__all__ = ["METHODS", "Frame", "Outcome", "Reply", "classify", "dispatch", "respond"]

#: The request types of the protocol.
METHODS = frozenset({"reset", "step", "state", "close"})
_EXTENSION_FIELDS = ("id", "traceparent", "tracestate")
_Request = ResetRequest | StepRequest | StateRequest | CloseRequest


class Outcome(enum.Enum):
    """What happens to the session after a frame."""

    CONTINUE = "continue"
    CLOSE = "close"  # the client asked to close: destroy the session
    END = "end"  # the server ends the session (SESSION_ERROR)
    LOST = "lost"  # the connection is gone (dropped, aborted, closed by peer)


@dataclass(frozen=True)
class Frame:
    """A received frame, classified."""

    kind: str  # "reset" | "step" | "state" | "close" | "invalid"
    request: _Request | None = None
    request_id: str | None = None
    error: dict[str, Any] | None = None
    fatal: bool = False


@dataclass(frozen=True)
class Reply:
    """The server's answer to one frame.

    Attributes:
        answer: the frame to send (text, or bytes for a binary frame); ``None``: none.
        outcome: what happens to the session next.
        failure: ``(error.type, description)`` when the request failed (for telemetry).
        dedup: answered from the de-duplication cache, not applied again.
        changed: the session's persistent state changed (persist it).
    """

    answer: str | bytes | None
    outcome: Outcome = Outcome.CONTINUE
    failure: tuple[str, str] | None = None
    dedup: bool = False
    changed: bool = False


def _ignore(_name: str) -> None:
    return None


def classify(raw: str | bytes, *, extensions: bool,
             max_values: int | None = SERVER_MAX_MESSAGE_VALUES) -> Frame:
    """Sort a received frame the way OpenEnv's ``/ws`` endpoint does (JSON parsed once).

    A frame that may hold more than ``max_values`` JSON values is refused unparsed:
    its parsed form could cost many times its length in memory.
    """
    if isinstance(raw, bytes):
        # OpenEnv reads text only; a binary frame fails the session.
        return Frame("invalid", fatal=True, error={
            "message": "binary frames are not supported; send JSON text frames",
            "code": ErrorCode.SESSION_ERROR.value,
        })
    try:
        check_json_values(raw, max_values)
    except ProtocolError as exc:
        return Frame("invalid", error={"message": exc.reason,
                                       "code": ErrorCode.INVALID_JSON.value})
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        return Frame("invalid", error={"message": f"Invalid JSON: {exc}",
                                       "code": ErrorCode.INVALID_JSON.value})
    if not isinstance(obj, dict):
        # OpenEnv fails the whole session on a JSON value that is not an object.
        return Frame("invalid", fatal=True, error={
            "message": f"'{type(obj).__name__}' object has no attribute 'get'",
            "code": ErrorCode.SESSION_ERROR.value,
        })
    rid = obj.get("id") if extensions and isinstance(obj.get("id"), str) else None
    kind = obj.get("type", "")
    if not isinstance(kind, str) or kind not in METHODS:
        return Frame("invalid", request_id=rid, error={
            "message": f"Unknown message type: {kind}", "code": ErrorCode.UNKNOWN_TYPE.value,
        })
    if not extensions:
        extra = [name for name in _EXTENSION_FIELDS if name in obj]
        if extra:
            return Frame(kind, error={
                "message": "Invalid message",
                "code": ErrorCode.VALIDATION_ERROR.value,
                "errors": [{"type": "extra_forbidden", "loc": [name],
                            "msg": "Extra inputs are not permitted", "input": obj[name]}
                           for name in extra],
            })
    try:
        request = validate_request(obj)
    except ProtocolError as exc:
        cause = exc.__cause__
        if isinstance(cause, ValidationError):
            error = validation_error(cause, tag=kind)
        else:
            error = {"message": "Invalid message", "code": ErrorCode.VALIDATION_ERROR.value}
        return Frame(kind, request_id=rid, error=error)
    return Frame(kind, request=request, request_id=request.id if extensions else None)


def respond(session: Session, frame: Frame, *, faults: FaultChain | None = None,
            count: Callable[[str], object] = _ignore) -> Reply:
    """Answer ``frame`` for ``session``: apply it, or refuse it, or inject a fault.

    Args:
        session: the session the frame arrived on (its environment is stepped).
        frame: the classified frame.
        faults: error and corrupt-frame faults to consume (the I/O ones are the
            server's business).
        count: called with the name of each server counter to increment
            (``applied.<method>``, ``dedup``).
    """
    if frame.kind == "close" and frame.error is None:
        count("applied.close")
        return Reply(None, Outcome.CLOSE)
    rid = frame.request_id
    if faults is not None:
        if (code := faults.take_error()) is not None:
            answer = encode_response(
                "error", {"message": "injected by fault injection", "code": code},
                request_id=rid)
            return Reply(answer, failure=(code, "injected error frame"))
        if (corrupt := faults.take_corrupt()) is not None:
            kind, oversize_bytes = corrupt
            return Reply(corrupt_frame(kind, request_type=frame.kind, request_id=rid,
                                       oversize_bytes=oversize_bytes),
                         failure=("fault_injected", f"corrupt frame: {kind}"))
    if frame.error is not None:
        return Reply(encode_response("error", frame.error, request_id=rid),
                     Outcome.END if frame.fatal else Outcome.CONTINUE,
                     failure=(str(frame.error["code"]), str(frame.error["message"])))
    if rid is not None and rid == session.last_request_id and session.last_answer is not None:
        count("dedup")
        return Reply(session.last_answer, dedup=True)
    kind_out, data = _apply(session, frame, count)
    answer = encode_response(kind_out, data, request_id=rid)
    failure = (str(data["code"]), str(data["message"])) if kind_out == "error" else None
    if session.extensions and rid is not None:
        session.last_request_id = rid
        session.last_answer = answer
    return Reply(answer, failure=failure, changed=session.extensions)


def dispatch(session: Session, raw: str | bytes, *, faults: FaultChain | None = None,
             count: Callable[[str], object] = _ignore) -> Reply:
    """:func:`classify` then :func:`respond`: one received frame, the server's answer."""
    return respond(session, classify(raw, extensions=session.extensions), faults=faults,
                   count=count)


def _apply(session: Session, frame: Frame, count: Callable[[str], object]
           ) -> tuple[Literal["observation", "state", "error"], dict[str, Any]]:
    request = frame.request
    env = session.env
    try:
        if isinstance(request, ResetRequest):
            result = env.reset(**accepted_kwargs(env.reset, request.data))
            data = _result_data(result)
        elif isinstance(request, StepRequest):
            result = env.step(dict(request.data))
            data = _result_data(result)
            session.step_count += 1
        elif isinstance(request, StateRequest):
            data = dict(env.state())
            json.dumps(data)
            count("applied.state")
            return "state", data
        else:  # pragma: no cover - close is answered by respond()
            raise AssertionError(f"unexpected request {request!r}")
    except ValidationError as exc:
        return "error", validation_error(exc)
    except ActionRejectedError as exc:
        return "error", {"message": str(exc), "code": ErrorCode.VALIDATION_ERROR.value}
    except Exception as exc:
        return "error", {"message": str(exc) or type(exc).__name__,
                         "code": ErrorCode.EXECUTION_ERROR.value}
    count(f"applied.{frame.kind}")
    return "observation", data


def validation_error(exc: ValidationError, *, tag: str | None = None) -> dict[str, Any]:
    """The ``data`` of OpenEnv's ``VALIDATION_ERROR`` frame for a pydantic error."""
    errors = json.loads(exc.json(include_url=False, include_context=False))
    if tag is not None:  # drop the union's tag, so locations read like OpenEnv's
        for error in errors:
            loc = error.get("loc")
            if isinstance(loc, list) and loc[:1] == [tag]:
                error["loc"] = loc[1:]
    return {"message": "Invalid message", "code": ErrorCode.VALIDATION_ERROR.value,
            "errors": errors}


def _result_data(result: Transition) -> dict[str, Any]:
    if not isinstance(result, Transition):
        raise TypeError(f"environment returned {type(result).__name__}, expected Transition")
    data = result.to_wire()
    json.dumps(data)  # fail here (EXECUTION_ERROR) rather than while sending
    return data
