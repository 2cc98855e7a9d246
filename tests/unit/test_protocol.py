"""Frame validation: every malformed server frame is a ProtocolError naming the fault."""

from __future__ import annotations

import json
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from envlink import ProtocolError
from envlink._sansio.protocol import (
    _RESPONSE_ADAPTER,
    EXTENSION_HEADER,
    ErrorFrame,
    Extensions,
    McpRequest,
    ObservationFrame,
    ResetRequest,
    StateFrame,
    StateRequest,
    StepRequest,
    _describe,
    _loads,
    _ObservationModel,
    decode_request,
    decode_response,
    encode_call,
    encode_data_request,
    encode_request,
    encode_response,
)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json at all", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        ("[1, 2, 3]", "JSON array"),
        ('"hello"', "JSON string"),
        ("null", "JSON null"),
        ('{"type": "observation", "data": "oops"}', "invalid 'observation' frame"),
        ('{"type": "teapot", "data": {}}', "unknown frame type 'teapot'"),
        ('{"data": {}}', "no 'type' field"),
        ('{"type": "observation", "data": {"reward": 1}}', "observation: Field required"),
        ('{"type": "observation"}', "data: Field required"),
        ('{"type": "observation", "data": {"observation": [], "done": false}}',
         "observation: Input should be an instance of dict"),
        ('{"type": "observation", "data": {"observation": {}, "done": "yes"}}', "done"),
        ('{"type": "state", "data": 3}', "invalid 'state' frame"),
        ('{"type": "error", "data": {"code": "X"}}', "message: Field required"),
    ],
)
def test_malformed_frames_raise_protocol_error(raw: str | bytes, reason: str) -> None:
    """Each malformed frame raises ProtocolError whose reason names what was wrong."""
    with pytest.raises(ProtocolError) as info:
        decode_response(raw)
    assert reason in info.value.reason


def test_oversize_frame_is_rejected_before_parsing() -> None:
    """A frame longer than max_size is refused with its size in the reason."""
    raw = json.dumps({"type": "state", "data": {"x": "y" * 100}})
    with pytest.raises(ProtocolError, match="exceeds the limit of 50 bytes"):
        decode_response(raw, max_size=50)


def test_valid_frames_decode_to_their_models() -> None:
    """Observation, state and error frames decode with their fields and raw data."""
    data = {"observation": {"a": 1}, "reward": 0.5, "done": True, "metadata": {"m": 1},
            "extra": "kept"}
    obs = decode_response(json.dumps({"type": "observation", "data": data, "id": "r1"}))
    assert isinstance(obs, ObservationFrame)
    assert obs.data.observation == {"a": 1}
    assert obs.data.reward == 0.5
    assert obs.data.done is True
    assert obs.id == "r1"
    assert obs.raw_data == data
    state = decode_response('{"type":"state","data":{"episode_id":"e","step_count":2}}')
    assert isinstance(state, StateFrame)
    assert state.data["step_count"] == 2
    err = decode_response('{"type":"error","data":{"message":"bad","code":"VALIDATION_ERROR"}}')
    assert isinstance(err, ErrorFrame)
    assert (err.data.code, err.data.message) == ("VALIDATION_ERROR", "bad")


def test_requests_omit_unset_extension_fields() -> None:
    """Plain requests carry only type and data, as a vanilla OpenEnv server demands."""
    assert json.loads(encode_request(StepRequest(data={"m": 1}))) == {
        "type": "step", "data": {"m": 1}}
    assert json.loads(encode_request(StateRequest())) == {"type": "state"}
    with_id = json.loads(encode_request(ResetRequest(data={}, id="7", traceparent="00-x")))
    assert with_id == {"type": "reset", "data": {}, "id": "7", "traceparent": "00-x"}


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("{", "INVALID_JSON"),
        ("[]", "VALIDATION_ERROR"),
        ('{"type": "dance"}', "UNKNOWN_TYPE"),
        ('{"type": "step"}', "VALIDATION_ERROR"),
        ('{"type": "state", "bogus": 1}', "VALIDATION_ERROR"),
    ],
)
def test_decode_request_reasons_start_with_openenv_codes(raw: str, code: str) -> None:
    """Server-side decoding names the OpenEnv error code a server should answer."""
    with pytest.raises(ProtocolError) as info:
        decode_request(raw)
    assert info.value.reason.startswith(code)


def test_encode_response_round_trips() -> None:
    """What the reference server encodes, the client decodes, id included."""
    text = encode_response("observation", {"observation": {"k": "v"}, "done": False},
                           request_id="abc")
    frame = decode_response(text)
    assert isinstance(frame, ObservationFrame)
    assert frame.id == "abc"


def test_extensions_only_when_the_server_advertises_them() -> None:
    """Headers of a plain server give no extensions; envlink's give token and grace."""
    assert not Extensions.from_headers({"Server": "uvicorn"}).enabled
    assert not Extensions.from_headers({EXTENSION_HEADER: "99"}).enabled
    ext = Extensions.from_headers({"Envlink-Protocol": "1", "envlink-session": "tok",
                                   "envlink-resume-grace": "30", "envlink-resumed": "1"})
    assert ext.enabled and ext.can_resume
    assert (ext.session_token, ext.resume_grace, ext.resumed) == ("tok", 30.0, True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    json_values.map(json.dumps),
    st.dictionaries(st.sampled_from(["type", "data", "id", "observation"]), json_values)
    .map(json.dumps),
    st.fixed_dictionaries({"type": st.sampled_from(["observation", "state", "error"]),
                           "data": json_values}).map(json.dumps),
))
def test_arbitrary_input_never_raises_anything_but_protocol_error(raw: str | bytes) -> None:
    """Whatever bytes arrive, decoding returns a frame or raises ProtocolError only."""
    try:
        decode_response(raw)
    except ProtocolError as exc:
        assert exc.reason


def test_absurdly_nested_frame_is_a_protocol_error() -> None:
    """A frame nested deeper than the decoder can follow is a ProtocolError, not RecursionError."""
    raw = '{"type":"state","data":{"x":' + "[" * 100_000 + "]" * 100_000 + "}}"
    with pytest.raises(ProtocolError, match="nested too deeply"):
        decode_response(raw)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_number_inside_a_nested_model_is_refused(bad: float) -> None:
    """NaN/±inf in a pydantic model nested in a dict action is refused, not sent as null."""

    class Inner(BaseModel):
        x: float

    frame = StepRequest(data={"m": Inner(x=bad), "ok": [Inner(x=1.5)]})
    with pytest.raises(ValueError, match="JSON cannot represent"):
        encode_request(frame)
    fine = StepRequest(data={"m": Inner(x=2.0)})
    assert json.loads(encode_request(fine)) == {"type": "step", "data": {"m": {"x": 2.0}}}


_REQUEST_MODELS = {"reset": ResetRequest, "step": StepRequest, "mcp": McpRequest}


@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["reset", "step", "mcp"]),
       data=st.dictionaries(st.text(), json_values | st.floats(), max_size=6),
       request_id=st.none() | st.text(max_size=8),
       traceparent=st.none() | st.just("00-" + "a" * 32 + "-" + "b" * 16 + "-01"),
       tracestate=st.none() | st.just("k=v"))
def test_direct_request_encoding_is_the_models_encoding(
        kind: str, data: dict[str, object], request_id: str | None,
        traceparent: str | None, tracestate: str | None) -> None:
    """encode_data_request gives the request model's text byte for byte, or its error."""
    ext = {k: v for k, v in (("id", request_id), ("traceparent", traceparent),
                             ("tracestate", tracestate)) if v is not None}
    try:
        expected: str | type[Exception] = encode_request(
            _REQUEST_MODELS[kind](data=data, **ext))  # type: ignore[arg-type]
    except ValueError:
        expected = ValueError
    try:
        got: str | type[Exception] = encode_data_request(kind, data, request_id,
                                                          traceparent, tracestate)
    except ValueError:
        got = ValueError
    assert got == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_direct_request_encoding_refuses_what_the_model_refuses(bad: float) -> None:
    """A nested model's NaN is refused, other keys and mappings take the model's path."""

    class Inner(BaseModel):
        x: float

    with pytest.raises(ValueError, match="JSON cannot represent"):
        encode_data_request("step", {"m": [Inner(x=bad)]})
    assert json.loads(encode_data_request("step", {"m": Inner(x=2.0)})) == {
        "type": "step", "data": {"m": {"x": 2.0}}}
    with pytest.raises(ValidationError):
        encode_data_request("step", {1: "x"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="not JSON-serialisable"):
        encode_data_request("step", {"f": object()})

    class Ordered(dict):  # type: ignore[type-arg]
        pass

    assert encode_data_request("mcp", Ordered(a=1), "7") == encode_request(
        McpRequest(data={"a": 1}, id="7"))


@settings(max_examples=300, deadline=None)
@given(obj=st.dictionaries(st.text(), json_values | st.floats(), max_size=5),
       cut=st.integers(min_value=0, max_value=200), pad=st.sampled_from(["", " ", "\n", "x"]))
def test_frame_parsing_is_json_loads(obj: dict[str, object], cut: int, pad: str) -> None:
    """Frames parse exactly as json.loads parses them: whole, cut short, or padded."""
    for text in (json.dumps(obj), json.dumps(obj)[:cut], json.dumps(obj) + pad):
        try:
            expected = json.dumps(json.loads(text))
        except ValueError:
            with pytest.raises(ProtocolError, match="not valid JSON"):
                _loads(text, code="")
        else:
            assert json.dumps(_loads(text, code="")) == expected


_field_values = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3) \
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2) | st.lists(st.integers())


@settings(max_examples=300, deadline=None)
@given(kind=st.sampled_from(["observation", "state", "error", "mcp"]),
       data=st.dictionaries(st.sampled_from(["observation", "reward", "done", "metadata",
                                             "message", "code", "active_sessions", "x"]),
                            _field_values, max_size=5) | _field_values,
       request_id=st.none() | st.text(max_size=4) | st.integers(),
       with_id=st.booleans())
def test_each_frame_is_validated_as_the_tagged_union_validates_it(
        kind: str, data: object, request_id: object, with_id: bool) -> None:
    """decode_response validates with the frame type's own model: the same frame (fields,
    set fields) as the union's, or the union's error, for any field values."""
    obj: dict[str, object] = {"type": kind, "data": data}
    if with_id:
        obj["id"] = request_id
    try:
        expected = _RESPONSE_ADAPTER.validate_python(obj)
    except ValidationError as exc:
        with pytest.raises(ProtocolError) as caught:
            decode_response(json.dumps(obj))
        assert str(caught.value) == f"invalid {kind!r} frame: {_describe(exc)}"
        return
    got = decode_response(json.dumps(obj))
    _assert_same_frame(got, expected, obj)


def _assert_same_frame(got: object, expected: BaseModel, obj: dict[str, object]) -> None:
    if isinstance(got, ObservationFrame):  # a record of the model's id and the raw data
        assert type(expected) is _ObservationModel
        assert got.id == expected.id
        assert got.raw_data == obj["data"]
        got, expected = got.data, expected.data
    assert type(got) is type(expected)
    assert isinstance(got, BaseModel)
    # Compared as text: a NaN field is equal only to itself, never to the other NaN.
    assert repr(got.model_dump()) == repr(expected.model_dump())
    assert got.model_fields_set == expected.model_fields_set


@pytest.mark.parametrize("field", [
    ("reward", 10 ** 400), ("reward", -(10 ** 400)), ("reward", sys.float_info.max),
    ("reward", -sys.float_info.max), ("reward", 2 ** 53 + 1), ("reward", 3), ("reward", True),
    ("reward", "0.5"), ("reward", math.nan), ("reward", math.inf), ("reward", None),
    ("done", 0), ("done", 1), ("done", "true"), ("done", None), ("metadata", []),
    ("metadata", None), ("metadata", {"k": 1}), ("observation", None), ("observation", []),
    ("id", 5), ("id", None), ("id", ""), ("data", []), ("data", None), ("type", "Observation"),
])
def test_observation_checks_accept_and_refuse_what_the_model_does(
        field: tuple[str, object]) -> None:
    """The observation frame's own checks give, at each edge of each field, the model's
    frame or the union's error."""
    key, value = field
    obj: dict[str, object] = {"type": "observation", "data": {
        "observation": {"a": 1}, "reward": 0.5, "done": False, "metadata": {}, "extra": 1}}
    if key in ("id", "data", "type"):
        obj[key] = value
    else:
        obj["data"][key] = value  # type: ignore[index]
    raw = json.dumps(obj)
    try:
        expected = _RESPONSE_ADAPTER.validate_python(json.loads(raw))
    except ValidationError as exc:
        with pytest.raises(ProtocolError) as caught:
            decode_response(raw)
        if key != "type":
            assert str(caught.value) == f"invalid 'observation' frame: {_describe(exc)}"
        return
    got = decode_response(raw)
    _assert_same_frame(got, expected, json.loads(raw))


def test_a_request_is_serialised_once_to_bytes() -> None:
    """encode_call gives the frame's UTF-8 bytes (what the transports send as a text
    frame, as they are), equal to the JSON of the request."""
    frame = encode_call("step", {"message": "h\u00e9llo"}, "7", {"traceparent": "00-x"})
    assert type(frame) is bytes
    assert json.loads(frame.decode("utf-8")) == {
        "id": "7", "traceparent": "00-x", "type": "step", "data": {"message": "h\u00e9llo"}}


@given(st.dictionaries(st.text(max_size=5), st.one_of(st.text(max_size=8), st.integers(),
                                                      st.floats(allow_nan=False,
                                                                allow_infinity=False)),
                       max_size=4))
@settings(max_examples=50, deadline=None)
def test_a_frames_bytes_decode_as_its_text_does(observation: dict[str, object]) -> None:
    """A frame's bytes (a text frame as picows hands it over) and its text decode to the
    same frame: the bytes go to pydantic-core's parser without a str in between."""
    text = json.dumps({"type": "observation", "data": {"observation": observation,
                                                       "reward": 1.0, "done": False}})
    assert decode_response(text.encode("utf-8")) == decode_response(text)


def test_bytes_that_are_not_utf8_are_a_protocol_error() -> None:
    """A text frame's bytes that are not UTF-8: ProtocolError, as for invalid JSON."""
    with pytest.raises(ProtocolError, match="not valid JSON"):
        decode_response(b'{"type":"observation","data":"\xff\xfe"}')


def test_a_frames_bytes_go_to_the_fast_parser_as_they_are(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """decode_response hands bytes to pydantic-core's parser itself: no str is made."""
    from envlink._sansio import protocol

    if protocol._parse is None:
        pytest.skip("the fast parser is off (ENVLINK_NO_SPEEDUPS)")
    real, given = protocol._parse, []

    def spy(raw: object, **kwargs: object) -> object:
        given.append(type(raw))
        return real(raw, **kwargs)

    monkeypatch.setattr(protocol, "_parse", spy)
    decode_response(b'{"type":"observation","data":{"observation":{},"reward":1.0}}')
    assert given == [bytes]
