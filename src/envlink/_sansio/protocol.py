"""The OpenEnv WebSocket protocol: frame models, encoding and validation.

Pure: no I/O, no asyncio. The transport moves text; this module turns requests
into text and text into validated frames, raising :class:`ProtocolError` with the
reason for anything the protocol does not allow.

Extensions (request ids, per-message trace context, session resumption) are used
only when the server advertised them in the upgrade response; see
:class:`Extensions`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Generic, Literal, NamedTuple, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    StrictBool,
    TypeAdapter,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticSerializationError, SchemaSerializer, core_schema, to_json

from envlink._errors import InvalidActionError, ProtocolError, ServerError
from envlink._sansio.limits import DEFAULT_MAX_MESSAGE_VALUES, check_json_values
from envlink._speedups import json_parser, json_scanner, new_record

__all__ = [
    "EXTENSION_HEADER",
    "EXTENSION_VERSION",
    "RESUMED_HEADER",
    "RESUME_GRACE_HEADER",
    "RESUME_TOKEN_HEADER",
    "SESSION_ID_HEADER",
    "SESSION_TOKEN_HEADER",
    "CloseRequest",
    "ErrorData",
    "ErrorFrame",
    "Extensions",
    "McpFrame",
    "McpRequest",
    "ObservationData",
    "ObservationFrame",
    "RequestFrame",
    "ResetRequest",
    "ResponseFrame",
    "StateFrame",
    "StateRequest",
    "StepResult",
    "StepRequest",
    "decode_request",
    "decode_response",
    "encode_call",
    "encode_data_request",
    "encode_request",
    "encode_response",
    "server_error",
    "validate_request",
]

#: Upgrade header carrying the envlink extension version. The client offers it on
#: the request; a server that implements the extensions echoes it on the response.
EXTENSION_HEADER = "envlink-protocol"
EXTENSION_VERSION = "1"
#: Response header: the token naming the server-side session, for ``resume``.
SESSION_TOKEN_HEADER = "envlink-session"
#: Response header: the session's public id, for telemetry (unlike the token it
#: grants nothing, so it may appear in spans and logs).
SESSION_ID_HEADER = "envlink-session-id"
#: Response header: seconds the server keeps a detached session for ``resume``.
RESUME_GRACE_HEADER = "envlink-resume-grace"
#: Request header: the token of the session the client wants to re-attach to.
RESUME_TOKEN_HEADER = "envlink-resume"
#: Response header: ``1`` if the session named by the resume token was re-attached,
#: ``0`` if it was gone and a fresh session was created instead.
RESUMED_HEADER = "envlink-resumed"


@dataclass(frozen=True)
class Extensions:
    """What the server advertised in its upgrade response.

    Attributes:
        version: the extension version, or ``None`` for a plain OpenEnv server.
        session_token: secret token for re-attaching to this session (``resume``);
            never logged.
        session_id: the session's public id, for telemetry.
        resume_grace: seconds the server keeps a detached session.
        resumed: ``True``/``False`` if this connection asked to resume, else ``None``.
    """

    version: str | None = None
    session_token: str | None = field(default=None, repr=False)
    session_id: str | None = None
    resume_grace: float | None = None
    resumed: bool | None = None

    @property
    def enabled(self) -> bool:
        """Whether envelope extensions (request ids, trace context) may be sent."""
        return self.version == EXTENSION_VERSION

    @property
    def can_resume(self) -> bool:
        """Whether the server offers session resumption for this session."""
        return self.enabled and bool(self.session_token)

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> Extensions:
        """Read the extension headers of an upgrade response (case-insensitive keys)."""
        lowered = {k.lower(): v for k, v in headers.items()}
        version = lowered.get(EXTENSION_HEADER)
        if version != EXTENSION_VERSION:
            return cls()
        grace: float | None
        try:
            grace = float(lowered[RESUME_GRACE_HEADER])
        except (KeyError, ValueError):
            grace = None
        resumed_text = lowered.get(RESUMED_HEADER)
        resumed = None if resumed_text is None else resumed_text.strip() == "1"
        return cls(
            version=version,
            session_token=lowered.get(SESSION_TOKEN_HEADER) or None,
            session_id=lowered.get(SESSION_ID_HEADER) or None,
            resume_grace=grace,
            resumed=resumed,
        )


# --------------------------------------------------------------------------- requests


#: The frame unions' adapters are built at first use too (a client never validates
#: a request frame, a server never a response frame).
_DEFERRED = ConfigDict(defer_build=True)


class _Request(BaseModel):
    # A vanilla OpenEnv server forbids extra envelope fields; these are only set
    # (and so only serialised) when the server negotiated the extension.
    # NaN and infinities are serialised as the JavaScript constants here only so that
    # encode_request can find and refuse them (pydantic's default would send null).
    # With defer_build, validators and serialisers are built at first use rather than
    # by `import envlink`; docs/performance.md weighs the first reset against that.
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants",
                              defer_build=True)

    id: str | None = None
    traceparent: str | None = None
    tracestate: str | None = None


class ResetRequest(_Request):
    """``{"type": "reset", "data": {...reset kwargs}}``."""

    type: Literal["reset"] = "reset"
    data: dict[str, Any] = Field(default_factory=dict)


class StepRequest(_Request):
    """``{"type": "step", "data": {...action fields}}``."""

    type: Literal["step"] = "step"
    data: dict[str, Any]


class StateRequest(_Request):
    """``{"type": "state"}``."""

    type: Literal["state"] = "state"


class CloseRequest(_Request):
    """``{"type": "close"}``: the server ends the session."""

    type: Literal["close"] = "close"


class McpRequest(_Request):
    """``{"type": "mcp", "data": {JSON-RPC 2.0 request}}`` (OpenEnv 0.10): ``tools/list``,
    ``tools/call`` on the session's own environment, around ``step``."""

    type: Literal["mcp"] = "mcp"
    data: dict[str, Any]


RequestFrame = Annotated[
    ResetRequest | StepRequest | StateRequest | CloseRequest, Field(discriminator="type")
]
_REQUEST_ADAPTER: TypeAdapter[ResetRequest | StepRequest | StateRequest | CloseRequest] = (
    TypeAdapter(RequestFrame, config=_DEFERRED)
)
_REQUEST_TYPES = frozenset({"reset", "step", "state", "close"})
_DATA_REQUESTS: dict[str, type[ResetRequest | StepRequest | McpRequest]] = {
    "reset": ResetRequest, "step": StepRequest, "mcp": McpRequest}


def encode_request(
    frame: ResetRequest | StepRequest | StateRequest | CloseRequest | McpRequest,
) -> bytes:
    """Serialise a request frame to JSON text (UTF-8 bytes), omitting unset extension fields.

    Raises:
        InvalidActionError: (a ``TypeError`` and ``ValueError``) the frame's data holds
            a value of no JSON form, or NaN or an infinity (refused as
            ``json.dumps(..., allow_nan=False)`` does, rather than sent as ``null``);
            it names where (``action.scores[2]``).
    """
    # Dumped to plain values first: a pydantic model nested in the data would
    # otherwise serialise its NaN by its own config (as null), out of our reach.
    return _dump(frame.type, None, None, None, None, frame)


#: Plain values of a ``dict[str, Any]`` as pydantic's ``model_dump`` gives them (a
#: pydantic model nested anywhere becomes a dict), without building a request model.
_DATA_SERIALIZER = SchemaSerializer(
    core_schema.dict_schema(core_schema.str_schema(), core_schema.any_schema()))
_is_str = str.__instancecheck__


def encode_data_request(kind: str, data: dict[str, Any],
                        request_id: str | None = None, traceparent: str | None = None,
                        tracestate: str | None = None) -> bytes:
    """The text (UTF-8 bytes) of a ``reset``, ``step`` or ``mcp`` request carrying ``data``.

    Exactly what :func:`encode_request` gives for the same frame, without building
    and dumping the request model on the common path.

    A plain ``dict`` with string keys is serialised directly; anything else goes
    through the request model, with its checks and errors.

    Raises:
        TypeError, ValueError: as :func:`encode_request`;
        pydantic.ValidationError: ``data`` is not a JSON object with string keys.
    """
    if type(data) is not dict or not all(map(_is_str, data)):
        ext = {"id": request_id, "traceparent": traceparent, "tracestate": tracestate}
        model = _DATA_REQUESTS[kind]
        return encode_request(model(data=data, **{k: v for k, v in ext.items()
                                                 if v is not None}))
    return _dump(kind, data, request_id, traceparent, tracestate)


def _dump(kind: str, data: Any, request_id: str | None, traceparent: str | None,
          tracestate: str | None, model: _Request | None = None) -> bytes:
    """The JSON text of a request, as UTF-8 bytes; every request frame is written here.

    Either ``model`` (a request model, dumped as it is) or the envelope built from
    the other arguments, in the key order of the models' dump: extensions, type,
    then ``data`` (a plain dict; ``None``: a frame without data).

    Raises:
        InvalidActionError: a value of no JSON form, or NaN or an infinity, in the data.
    """
    try:
        if model is not None:
            frame = model.model_dump(exclude_none=True)
        else:
            frame = {}
            if request_id is not None:
                frame["id"] = request_id
            if traceparent is not None:
                frame["traceparent"] = traceparent
            if tracestate is not None:
                frame["tracestate"] = tracestate
            frame["type"] = kind
            if data is not None:
                frame["data"] = _DATA_SERIALIZER.to_python(data)
        # UTF-8 bytes, sent as they are: the frame is serialised once.
        text = to_json(frame, inf_nan_mode="constants")
    except PydanticSerializationError as exc:
        payload = data if model is None else getattr(model, "data", None)
        raise _refusal(kind, payload, f"not JSON-serialisable: {exc}", _no_json_form) from None
    if b"NaN" in text or b"Infinity" in text:
        # Usually inside a string; parsing tells a real constant from text.
        try:
            json.loads(text, parse_constant=_refuse_constant)
        except _Refused as exc:
            payload = data if model is None else getattr(model, "data", None)
            raise _refusal(kind, payload, exc.reason, _not_finite) from None
    return text


# ------------------------------------------------ naming what a refused request holds
# Only on the failure path: the hot path never walks the data.

#: Where the data of each request lives, as a refusal names it.
_ROOT = {"step": "action", "reset": "reset", "mcp": "mcp"}
#: A value of no JSON type as pydantic's ``model_dump`` gives it (a model or a
#: dataclass becomes a dict, NaN stays NaN).
_PLAIN = SchemaSerializer(core_schema.any_schema())
_JSON_TYPES = (dict, list, tuple, str, int, float, bool, type(None))


class _Refused(Exception):
    """A JSON constant found in a request's text (the reason says which)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _refuse_constant(name: str) -> None:
    raise _Refused(f"{name}, which JSON cannot represent; replace it before sending (it "
                   "would arrive as null)")


def _not_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _no_json_form(value: Any) -> bool:
    if isinstance(value, _JSON_TYPES):
        return False
    try:
        to_json(value)
    except PydanticSerializationError:
        return True
    return False


def _refusal(kind: str, data: Any, reason: str,
             judge: Callable[[Any], bool]) -> InvalidActionError:
    """The error naming where in ``data`` the first value ``judge`` refuses is."""
    root = _ROOT.get(kind, f"{kind} data")
    return InvalidActionError(_locate(data, root, judge, 0) or root, reason)


def _locate(node: Any, path: str, judge: Callable[[Any], bool], depth: int) -> str | None:
    """The path of the first value in ``node`` that ``judge`` refuses, if any; a model or
    a dataclass is walked as its fields."""
    if depth > 256:
        return None
    if judge(node):
        return path
    if not isinstance(node, _JSON_TYPES):
        try:
            node = _PLAIN.to_python(node)
        except PydanticSerializationError:
            return None
    if isinstance(node, dict):
        for key, value in node.items():
            step = (f"{path}.{key}" if isinstance(key, str) and key.isidentifier() else
                    f"{path}[{key!r}]")
            found = _locate(value, step, judge, depth + 1)
            if found is not None:
                return found
    elif isinstance(node, (list, tuple)):
        for index, value in enumerate(node):
            found = _locate(value, f"{path}[{index}]", judge, depth + 1)
            if found is not None:
                return found
    return None


def encode_call(method: str, data: dict[str, Any] | None, request_id: str | None,
                trace: Mapping[str, str] | None = None) -> bytes:
    """The text frame of a client's request (``reset``, ``step``, ``mcp``, ``state``,
    ``close``), as UTF-8 bytes, which the transports send as a text frame as they are;
    trace context is set only with a request id. The client's one way to write a
    request.

    Raises:
        InvalidActionError: (a ``TypeError`` and ``ValueError``) a key of ``data`` is not
            a string, or it holds a value of no JSON form, NaN or an infinity.
        TypeError: ``data`` is not a JSON object.
    """
    traceparent = tracestate = None
    if request_id is not None and trace:
        traceparent, tracestate = trace.get("traceparent"), trace.get("tracestate")
    if method == "reset" or method == "step" or method == "mcp":
        if type(data) is dict and all(map(_is_str, data)):  # encode_data_request's test
            return _dump(method, data, request_id, traceparent, tracestate)
        try:
            return encode_data_request(method, data or {}, request_id, traceparent,
                                       tracestate)
        except ValidationError as exc:
            key = next((k for k in data if not isinstance(k, str)), None) \
                if isinstance(data, dict) else None
            if key is not None:
                raise InvalidActionError(
                    f"{_ROOT[method]}[{key!r}]", "the key is not a string (data must be a "
                    "JSON object with string keys)") from None
            raise TypeError(f"{method} data must be a JSON object with string keys: "
                            f"{exc.errors(include_url=False)[0]['msg']}") from exc
    if method != "state" and method != "close":
        raise ValueError(f"no request frame for {method!r}")
    return _dump(method, None, request_id, traceparent, tracestate)


def decode_request(raw: str | bytes) -> ResetRequest | StepRequest | StateRequest | CloseRequest:
    """Validate a frame received by a server.

    Raises:
        ProtocolError: with ``reason`` starting with the OpenEnv error code that a
            server should answer (``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR``).
    """
    return validate_request(_loads(raw, code="INVALID_JSON: "))


def validate_request(obj: Any) -> ResetRequest | StepRequest | StateRequest | CloseRequest:
    """Validate a request frame already decoded from JSON (so a server parses it once).

    Raises:
        ProtocolError: as :func:`decode_request`, ``VALIDATION_ERROR`` with the
            pydantic ``ValidationError`` as ``__cause__`` when a field is wrong.
    """
    if not isinstance(obj, dict):
        raise ProtocolError(f"VALIDATION_ERROR: frame is a JSON {_json_kind(obj)}, not an object")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in _REQUEST_TYPES:
        raise ProtocolError(f"UNKNOWN_TYPE: unknown message type {kind!r}")
    try:
        return _REQUEST_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        raise ProtocolError(f"VALIDATION_ERROR: {_describe(exc)}") from exc


# -------------------------------------------------------------------------- responses


class _Lenient(BaseModel):
    # Servers may add fields (OpenEnv adds "metadata" beside the observation);
    # unknown fields are ignored, missing or mistyped ones are errors.
    model_config = ConfigDict(extra="ignore", frozen=True, defer_build=True)  # as _Request


class ObservationData(_Lenient):
    """The ``data`` of an observation frame.

    ``observation`` and ``metadata`` are checked to be JSON objects, not copied: a
    frame's values come from the JSON decoder, whose objects have string keys.
    """

    observation: InstanceOf[dict[str, Any]]
    # Finite only: NaN compares unequal to everything and poisons every sum it enters
    # (the client refuses to send one, too).
    reward: Annotated[float, Field(allow_inf_nan=False)] | None = None
    done: StrictBool = False
    metadata: InstanceOf[dict[str, Any]] | None = None


class ErrorData(_Lenient):
    """The ``data`` of an error frame.

    ``active_sessions`` and ``max_sessions`` come with ``CAPACITY_REACHED`` from
    OpenEnv's servers; a value that is not a non-negative integer is ignored.
    """

    message: str
    code: str = "EXECUTION_ERROR"
    active_sessions: int | None = None
    max_sessions: int | None = None

    @field_validator("active_sessions", "max_sessions", mode="before")
    @classmethod
    def _count_or_none(cls, value: Any) -> int | None:
        # Advisory numbers: a server that sends junk here must not make the error
        # frame itself unreadable.
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        return None


class _ObservationModel(_Lenient):
    """The schema of an observation frame: what :func:`decode_response` checks, and the
    model that words what is wrong with one (built only when a frame needs it)."""

    type: Literal["observation"]
    data: ObservationData
    id: str | None = None


class _ObservationFields(NamedTuple):
    id: str | None
    raw_data: dict[str, Any]


class ObservationFrame(_ObservationFields):
    """``{"type": "observation", "data": {"observation": ..., "reward": r, "done": b}}``.

    Attributes:
        id: the request id the frame answers, if the server sent one.
        raw_data: the ``data`` object exactly as received, for ``_parse_result`` hooks.
    """

    __slots__ = ()
    # A record rather than a model: a step builds it in a fraction of a model's
    # instructions, once the frame has passed every check of ``_ObservationModel``.
    type: ClassVar[Literal["observation"]] = "observation"

    @property
    def data(self) -> ObservationData:
        """``raw_data`` as the validated model (built on each read; nothing hot reads it)."""
        return ObservationData.model_validate(self.raw_data)


class StateFrame(_Lenient):
    """``{"type": "state", "data": {"episode_id": ..., "step_count": n, ...}}``."""

    type: Literal["state"]
    data: dict[str, Any]
    id: str | None = None


class ErrorFrame(_Lenient):
    """``{"type": "error", "data": {"message": ..., "code": ...}}``."""

    type: Literal["error"]
    data: ErrorData
    id: str | None = None
    #: The ``data`` object exactly as received: every field the server sent.
    raw_data: dict[str, Any] = Field(default_factory=dict, exclude=True)


class McpFrame(_Lenient):
    """``{"type": "mcp", "data": {JSON-RPC 2.0 response}}``: the answer to an ``mcp`` request."""

    type: Literal["mcp"]
    data: dict[str, Any]
    id: str | None = None


ResponseFrame = Annotated[
    _ObservationModel | StateFrame | ErrorFrame | McpFrame, Field(discriminator="type")
]
_RESPONSE_ADAPTER: TypeAdapter[_ObservationModel | StateFrame | ErrorFrame | McpFrame] = (
    TypeAdapter(ResponseFrame, config=_DEFERRED)
)
_RESPONSE_MODELS: dict[str, type[_ObservationModel | StateFrame | ErrorFrame | McpFrame]] = {
    "observation": _ObservationModel, "state": StateFrame, "error": ErrorFrame,
    "mcp": McpFrame}
_RESPONSE_TYPES = frozenset(_RESPONSE_MODELS)


def server_error(frame: ErrorFrame) -> ServerError:
    """The typed error for an error frame, keeping every field the server sent."""
    details = {k: v for k, v in frame.raw_data.items() if k not in ("message", "code")}
    return ServerError.from_frame(frame.data.message, frame.data.code,
                                  active_sessions=frame.data.active_sessions,
                                  max_sessions=frame.data.max_sessions, details=details)


def decode_response(
    raw: str | bytes, *, max_size: int | None = None,
    max_values: int | None = DEFAULT_MAX_MESSAGE_VALUES,
) -> ObservationFrame | StateFrame | ErrorFrame | McpFrame:
    """Validate a frame received from the server.

    Args:
        raw: the frame's text (binary frames are accepted if they are UTF-8 JSON).
        max_size: reject frames longer than this many bytes.
        max_values: reject, unparsed, frames that may hold more JSON values than this
            (what bounds the parsed frame's memory; see :mod:`envlink._sansio.limits`).

    Raises:
        ProtocolError: naming what was wrong (invalid JSON, not an object, unknown
            type, missing or mistyped field, oversize frame).
    """
    if max_size is not None and len(raw) > max_size:
        raise ProtocolError(f"frame of {len(raw)} bytes exceeds the limit of {max_size} bytes")
    if max_values is not None and len(raw) > max_values:  # the check's own first test
        check_json_values(raw, max_values, "frame")
    if _parse is not None and (type(raw) is bytes or type(raw) is str):  # _loads' first try
        try:
            # A frame's bytes go to the parser as they are (it checks their UTF-8).
            obj = _parse(raw, cache_strings="keys")  # values are not kept (json_parser)
        except Exception:  # _loads says what is wrong, or json.loads reads it
            obj = _loads(raw, code="", parsed=False)
    else:
        obj = _loads(raw, code="")
    if not isinstance(obj, dict):
        raise ProtocolError(f"frame is a JSON {_json_kind(obj)}, expected an object")
    kind = obj.get("type")
    if kind == "observation":  # the common answer
        return _observation_frame(obj)
    if "type" not in obj:
        raise ProtocolError("frame has no 'type' field")
    if not isinstance(kind, str) or kind not in _RESPONSE_TYPES:
        raise ProtocolError(f"unknown frame type {kind!r}")
    frame: StateFrame | ErrorFrame | McpFrame = _validated(kind, obj)  # not an observation
    if type(frame) is ErrorFrame:
        # The frame was just built and nobody else holds it: set the exact ``data``
        # object on it in place rather than copy the whole (frozen) model for one field.
        object.__setattr__(frame, "raw_data", obj["data"])
    return frame


def _observation_frame(obj: dict[str, Any]) -> ObservationFrame:
    """The one check of an observation frame: ``_ObservationModel``'s rules, field by
    field, as a server's values meet them.

    A value they do not take goes to the model, which decides: it also accepts a few
    lax values (a reward given as a numeric string, or as a boolean) and words the
    error of what it refuses. The model is built only then.
    """
    data = obj.get("data")
    if type(data) is dict:
        request_id = obj.get("id")
        reward = data.get("reward")
        done = data.get("done", False)
        metadata = data.get("metadata")
        if (type(data.get("observation")) is dict
                and (reward is None or ((type(reward) is float or type(reward) is int)
                                        and -_FLOAT_MAX < reward < _FLOAT_MAX))
                and (done is False or done is True)
                and (metadata is None or type(metadata) is dict)
                and (request_id is None or type(request_id) is str)):
            return new_record(ObservationFrame, (request_id, data))
    frame = _validated("observation", obj)
    return new_record(ObservationFrame, (frame.id, obj["data"]))


def _validated(kind: str, obj: dict[str, Any]) -> Any:
    """``obj`` validated by the model of its frame type ``kind``, as the tagged union
    would pick it, without the union; the union's error (whose locations name the frame
    type) as a :class:`ProtocolError`."""
    try:
        return _RESPONSE_MODELS[kind].__pydantic_validator__.validate_python(obj)
    except ValidationError:
        try:
            _RESPONSE_ADAPTER.validate_python(obj)
        except ValidationError as exc:
            raise ProtocolError(f"invalid {kind!r} frame: {_describe(exc)}") from exc
        raise  # pragma: no cover - the union accepts nothing its member refuses


def encode_response(
    kind: Literal["observation", "state", "error"],
    data: Mapping[str, Any],
    *,
    request_id: str | None = None,
) -> str:
    """Serialise a response frame (used by the reference server)."""
    obj: dict[str, Any] = {"type": kind, "data": dict(data)}
    if request_id is not None:
        obj["id"] = request_id
    return json.dumps(obj, separators=(",", ":"))


#: pydantic-core's parser, called with ``cache_strings="keys"`` (see json_parser).
_parse: Callable[..., Any] | None = json_parser()
_FLOAT_MAX = sys.float_info.max
_scan: Callable[[str, int], tuple[Any, int]] | None = json_scanner()


def _loads(raw: str | bytes, *, code: str, parsed: bool = True) -> Any:
    """``json.loads(raw)``, faster where it can be; a ``ProtocolError`` for invalid JSON.

    ``parsed=False``: the fast parser was tried already (and refused the text).
    """
    if parsed and _parse is not None and (type(raw) is str or type(raw) is bytes):
        # A text the fast parser refuses may still be JSON to json.loads (a lone
        # surrogate escape, deep nesting): json.loads has the last word.
        try:
            return _parse(raw, cache_strings="keys")
        except Exception:  # json.loads below says what is wrong
            pass
    elif _scan is not None and type(raw) is str and raw[:1] == "{":
        # A frame as servers send it; anything else (bytes, whitespace around it, a
        # fault) is left to json.loads, whose result and errors are the reference.
        try:
            obj, end = _scan(raw, 0)
        except Exception:  # json.loads below says what is wrong
            pass
        else:
            if end == len(raw):
                return obj
    try:
        return json.loads(raw)
    except RecursionError as exc:
        raise ProtocolError(f"{code}frame is nested too deeply to decode") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        preview = raw[:40] if isinstance(raw, str) else raw[:40].decode("utf-8", "replace")
        raise ProtocolError(f"{code}frame is not valid JSON ({exc.__class__.__name__}: "
                            f"{exc}); starts with {preview!r}") from exc


def _json_kind(obj: Any) -> str:
    if isinstance(obj, list):
        return "array"
    if isinstance(obj, str):
        return "string"
    if isinstance(obj, bool):
        return "boolean"
    if isinstance(obj, (int, float)):
        return "number"
    return "null" if obj is None else type(obj).__name__


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False)[:3]:
        loc = ".".join(str(p) for p in err["loc"]) or "<frame>"
        parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


ObsT = TypeVar("ObsT")


@dataclass
class StepResult(Generic[ObsT]):
    """The result of a reset or a step, as in OpenEnv.

    Attributes:
        observation: the environment's observation.
        reward: the reward, if the environment gives one.
        done: whether the episode is over.
        metadata: extra data the server sent beside the observation.
    """

    observation: ObsT
    reward: float | None = None
    done: bool = False
    metadata: dict[str, Any] | None = None
