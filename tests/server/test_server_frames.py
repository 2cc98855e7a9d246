"""The server's pure dispatch, driven without a socket: OpenEnv's /ws conformance frame by frame."""

from __future__ import annotations

import json
from typing import Any

import pytest

from envlink.server import DeterministicEnvironment, EchoEnvironment, Faults
from envlink.server._faults import FaultChain
from envlink.server._frames import Outcome, Reply, classify, dispatch
from envlink.server._store import Session

pytestmark = pytest.mark.timeout(10)


def session(*, extensions: bool = False, env: Any = None) -> Session:
    return Session(id="s1", env=env if env is not None else EchoEnvironment(),
                   extensions=extensions, token="t" if extensions else None)


def answer_of(reply: Reply) -> dict[str, Any]:
    assert isinstance(reply.answer, str)
    decoded: dict[str, Any] = json.loads(reply.answer)
    return decoded


def test_step_is_applied_and_answered_with_an_observation() -> None:
    """A step frame steps the environment; the answer is OpenEnv's observation frame."""
    s = session()
    counted: list[str] = []
    reply = dispatch(s, json.dumps({"type": "step", "data": {"message": "hi"}}),
                     count=counted.append)
    answer = answer_of(reply)
    assert answer["type"] == "observation"
    assert answer["data"]["observation"]["echoed_message"] == "hi"
    assert reply.outcome is Outcome.CONTINUE
    assert reply.failure is None
    assert s.step_count == 1
    assert counted == ["applied.step"]


def test_state_and_reset() -> None:
    """state answers a state frame; reset an observation frame."""
    s = session()
    assert answer_of(dispatch(s, '{"type": "reset", "data": {}}'))["type"] == "observation"
    assert answer_of(dispatch(s, '{"type": "state"}'))["type"] == "state"


def test_close_ends_the_session_without_an_answer() -> None:
    """close: no answer, the session is to be destroyed."""
    reply = dispatch(session(), '{"type": "close"}')
    assert reply == Reply(None, Outcome.CLOSE)


@pytest.mark.parametrize(("raw", "code", "outcome"), [
    ("{not json", "INVALID_JSON", Outcome.CONTINUE),
    ('{"type": "teleport"}', "UNKNOWN_TYPE", Outcome.CONTINUE),
    ('{"type": "step"}', "VALIDATION_ERROR", Outcome.CONTINUE),
    ("[1, 2]", "SESSION_ERROR", Outcome.END),
    ('"text"', "SESSION_ERROR", Outcome.END),
    (b"\x00binary", "SESSION_ERROR", Outcome.END),
    ("[" * 100_000 + "]" * 100_000, "INVALID_JSON", Outcome.CONTINUE),
])
def test_bad_frames_get_openenvs_error_codes(raw: str | bytes, code: str,
                                              outcome: Outcome) -> None:
    """Bad frames are answered with OpenEnv's error code; only a non-object JSON value or
    a binary frame ends the session (JSON too deep to parse is invalid JSON, not a crash)."""
    s = session()
    reply = dispatch(s, raw)
    answer = answer_of(reply)
    assert answer["type"] == "error"
    assert answer["data"]["code"] == code
    assert reply.outcome is outcome
    assert reply.failure is not None and reply.failure[0] == code
    assert s.step_count == 0


def test_extension_fields_are_refused_on_the_plain_protocol() -> None:
    """Without the extensions, an envelope field such as id is a VALIDATION_ERROR naming it."""
    answer = answer_of(dispatch(session(), '{"type": "state", "id": "r1"}'))
    assert answer["data"]["code"] == "VALIDATION_ERROR"
    assert answer["data"]["errors"][0]["loc"] == ["id"]
    assert "id" not in answer


def test_a_resent_request_id_is_answered_from_the_cache_not_applied_twice() -> None:
    """With the extensions, the same request id gets the cached answer; the step is not
    applied again, and the session's state is marked changed (to persist) only when applied."""
    s = session(extensions=True)
    frame = json.dumps({"type": "step", "id": "r1", "data": {"message": "once"}})
    first = dispatch(s, frame)
    again = dispatch(s, frame)
    assert answer_of(first)["id"] == "r1"
    assert again.answer == first.answer
    assert (first.dedup, again.dedup) == (False, True)
    assert (first.changed, again.changed) == (True, False)
    assert s.step_count == 1


def test_environment_errors_are_answered_not_raised() -> None:
    """An environment that raises gets EXECUTION_ERROR with its message; the session goes on."""
    s = session(env=DeterministicEnvironment())
    reply = dispatch(s, '{"type": "step", "data": {"move": 1}}')
    assert answer_of(reply)["data"] == {"message": "call reset before step",
                                        "code": "EXECUTION_ERROR"}
    assert reply.outcome is Outcome.CONTINUE
    assert reply.failure == ("EXECUTION_ERROR", "call reset before step")
    assert answer_of(dispatch(s, '{"type": "reset", "data": {}}'))["type"] == "observation"


def test_injected_error_and_corrupt_frames_replace_the_answer_connection_first() -> None:
    """Fault decisions: the connection's faults fire before the server's; each is consumed
    once; the request is then not applied."""
    conn, srv = Faults(error_frames=1, error_code="CAPACITY_REACHED"), Faults(corrupt_frames=1)
    faults = FaultChain(conn, srv)
    s = session()
    frame = '{"type": "step", "data": {"message": "x"}}'
    first = dispatch(s, frame, faults=faults)
    assert answer_of(first)["data"]["code"] == "CAPACITY_REACHED"
    second = dispatch(s, frame, faults=faults)
    assert second.answer == '{"type": "observation", "data": {'
    assert second.failure == ("fault_injected", "corrupt frame: invalid_json")
    third = dispatch(s, frame, faults=faults)
    assert answer_of(third)["type"] == "observation"
    assert s.step_count == 1
    assert (conn.error_frames, srv.corrupt_frames) == (0, 0)


def test_close_never_consumes_an_injected_fault() -> None:
    """A valid close is honoured even with error frames pending, which stay pending."""
    faults = Faults(error_frames=1)
    assert dispatch(session(), '{"type": "close"}', faults=FaultChain(faults)).outcome \
        is Outcome.CLOSE
    assert faults.error_frames == 1


def test_classify_names_the_frame_kind_and_request_id() -> None:
    """classify: the kind for counters and span names; the request id only with extensions."""
    raw = '{"type": "state", "id": "r7"}'
    assert classify(raw, extensions=True).request_id == "r7"
    assert classify('{"type": "state"}', extensions=False).kind == "state"
    assert classify("nope", extensions=False).kind == "invalid"
