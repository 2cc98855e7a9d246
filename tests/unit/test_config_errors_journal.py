"""Timeouts, the error tree, endpoints and the journal: pure parts."""

from __future__ import annotations

import pytest

import envlink
from envlink import (
    CallTimeoutError,
    CapacityReachedError,
    EnvlinkError,
    EpisodeJournal,
    ErrorCode,
    ReplayDivergedError,
    ServerError,
    SessionLostError,
    Timeout,
)
from envlink._transports.base import parse_endpoint

pytestmark = pytest.mark.timeout(30)


def test_timeout_default_and_overrides_follow_httpx() -> None:
    """One default for every phase, explicit phases win, None means no limit."""
    assert Timeout(5.0) == Timeout(connect=5.0, call=5.0, close=5.0)
    t = Timeout(5.0, connect=10.0, close=None)
    assert (t.connect, t.call, t.close) == (10.0, 5.0, None)
    d = Timeout()
    assert (d.connect, d.call, d.close) == (10.0, 60.0, 5.0)
    assert Timeout.coerce(None) == Timeout(None)
    assert Timeout.coerce(2) == Timeout(2.0)
    with pytest.raises(ValueError, match="positive"):
        Timeout(0)


def test_every_error_derives_from_envlink_error() -> None:
    """The whole exported tree has one root; CallTimeoutError is also a TimeoutError."""
    errors = [getattr(envlink, n) for n in envlink.__all__
              if isinstance(getattr(envlink, n), type)
              and issubclass(getattr(envlink, n), BaseException)]
    assert len(errors) >= 12
    assert all(issubclass(e, EnvlinkError) for e in errors)
    assert issubclass(CallTimeoutError, TimeoutError)
    assert issubclass(ReplayDivergedError, SessionLostError)


def test_server_error_from_frame_picks_the_specific_class() -> None:
    """CAPACITY_REACHED becomes CapacityReachedError; unknown codes are kept verbatim."""
    cap = ServerError.from_frame("full", "CAPACITY_REACHED")
    assert isinstance(cap, CapacityReachedError)
    assert cap.code is ErrorCode.CAPACITY_REACHED
    odd = ServerError.from_frame("?", "SOMETHING_NEW")
    assert type(odd) is ServerError
    assert odd.code == "SOMETHING_NEW"
    assert str(odd) == "[SOMETHING_NEW] ?"


@pytest.mark.parametrize(
    ("url", "ws_url", "port"),
    [
        ("http://127.0.0.1:8000", "ws://127.0.0.1:8000/ws", 8000),
        ("https://env.example/", "wss://env.example/ws", 443),
        ("ws://127.0.0.1:9/ws", "ws://127.0.0.1:9/ws", 9),
        ("wss://h/prefix", "wss://h/prefix/ws", 443),
        ("http://[::1]:81", "ws://[::1]:81/ws", 81),
    ],
)
def test_base_urls_map_to_the_ws_endpoint(url: str, ws_url: str, port: int) -> None:
    """http/https/ws/wss base URLs all reach the /ws endpoint with the right scheme."""
    ep = parse_endpoint(url)
    assert (ep.ws_url, ep.port) == (ws_url, port)


def test_url_credentials_become_a_header_and_leave_the_url() -> None:
    """user:pass in the URL is sent as Basic auth and never shown."""
    ep = parse_endpoint("http://alice:s3cret@127.0.0.1:1")
    assert "s3cret" not in ep.display and "alice" not in ep.display
    assert ep.auth_header == "Basic YWxpY2U6czNjcmV0"


def test_bad_scheme_is_a_value_error() -> None:
    """An ftp:// URL is refused with the reason."""
    with pytest.raises(ValueError, match="scheme"):
        parse_endpoint("ftp://x")


def test_journal_records_copies_and_bounds_itself() -> None:
    """The journal copies what it records and stops being replayable past its bound."""
    j = EpisodeJournal(max_steps=2)
    action = {"m": [1]}
    j.record_reset({"seed": 1}, {"observation": {}})
    j.record_step(action, {"observation": {"n": 1}})
    action["m"].append(2)
    assert j.entries[0].action == {"m": [1]}
    j.record_step({}, {})
    assert j.replayable and j.step_count == 2
    j.record_step({}, {})
    assert j.truncated and not j.replayable
    assert j.to_dict()["truncated"] is True


def test_journal_copies_cannot_change_what_replay_resends() -> None:
    """Mutating an action read from a journal snapshot leaves the live journal unchanged."""
    j = EpisodeJournal()
    j.record_reset({}, {"observation": {}})
    j.record_step({"move": 1}, {"observation": {"n": 1}})
    copy_ = j.snapshot()
    copy_.entries[0].action["move"] = 99
    copy_.entries[0].response["observation"]["n"] = 99
    assert j.entries[0].action == {"move": 1}
    assert j.entries[0].response == {"observation": {"n": 1}}


@pytest.mark.parametrize("value", ["soon", "Wed, 99 Foo 2026 25:61:61 GMT", "", "-3"])
def test_unreadable_retry_after_is_ignored(value: str) -> None:
    """A Retry-After that is neither seconds nor an HTTP date is ignored, never raised."""
    from websockets.datastructures import Headers

    from envlink._transports.websocket import _retry_after

    got = _retry_after(Headers({"Retry-After": value}))
    assert got is None or got == 0.0


def test_retry_after_accepts_seconds_and_dates() -> None:
    """Retry-After in seconds or as an HTTP date in the past gives a delay >= 0."""
    from websockets.datastructures import Headers

    from envlink._transports.websocket import _retry_after

    assert _retry_after(Headers({"Retry-After": "2.5"})) == 2.5
    assert _retry_after(Headers({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0


def test_errors_pickle_with_their_attributes() -> None:
    """Every error crosses a process boundary (pickle) with its message, type and fields."""
    import pickle

    from envlink import (
        CallTimeoutError,
        CapacityReachedError,
        EpisodeJournal,
        HandshakeRejectedError,
        ReplayDivergedError,
        ServerError,
        SessionLostError,
        ToolCallError,
    )

    journal = EpisodeJournal()
    journal.record_reset({"seed": 1}, {"observation": {}})
    cases = [
        (ServerError("bad", "EXECUTION_ERROR"), {"code", "message"}),
        (CapacityReachedError("full", active_sessions=3, max_sessions=3),
         {"active_sessions", "max_sessions"}),
        (ToolCallError("nope", "tool_not_found", tool_name="x"), {"tool_name"}),
        (HandshakeRejectedError(503, retry_after=2.0), {"status", "retry_after", "retryable"}),
        (CallTimeoutError("late", method="step", timeout=1.5), {"method", "timeout"}),
        (SessionLostError("gone", journal=journal), set()),
        (ReplayDivergedError("differs", index=2, expected={"a": 1}, actual={"a": 2},
                             journal=journal), {"index", "expected", "actual"}),
    ]
    for error, fields in cases:
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        for name in fields:
            assert getattr(copy, name) == getattr(error, name), (type(error), name)
        if isinstance(error, SessionLostError):
            assert copy.journal is not None and copy.journal.reset_kwargs == {"seed": 1}


def test_builtin_bases_keep_mro_and_pickling() -> None:
    """The builtin bases (RuntimeError, ConnectionError, TimeoutError, ValueError) leave
    each error's own fields, str() and pickling intact, and a ProviderError made for a
    provider's exception is also of that exception's class, across pickle too."""
    import pickle
    import subprocess

    from envlink import HandshakeRejectedError, InvalidArgumentError, NotReadyError, ProviderError
    from envlink._launch.provider_errors import provider_error, provider_error_class

    refused = HandshakeRejectedError(403)
    assert isinstance(refused, ConnectionError) and refused.errno is None
    assert str(refused) == "server rejected the WebSocket upgrade with HTTP 403"
    full = CapacityReachedError("full", max_sessions=1)
    assert isinstance(full, RuntimeError) and str(full) == "[CAPACITY_REACHED] full"
    late = NotReadyError("not ready", url="http://h/health", attempts=3)
    assert isinstance(late, TimeoutError) and isinstance(late, ConnectionError)
    for error in (refused, full, late, InvalidArgumentError("no server")):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert copy.__dict__ == error.__dict__

    failed = subprocess.CalledProcessError(2, ["docker", "run"])
    wrapped = provider_error("docker run failed", failed)
    assert isinstance(wrapped, ProviderError) and isinstance(wrapped, subprocess.CalledProcessError)
    assert wrapped.returncode == 2 and str(wrapped) == "docker run failed"
    assert type(wrapped) is provider_error_class(subprocess.CalledProcessError)  # cached
    copy = pickle.loads(pickle.dumps(wrapped))
    assert type(copy) is type(wrapped) and copy.returncode == 2
    assert isinstance(provider_error("x", late), TimeoutError)
    # A class no error can also derive from (its C layout conflicts): a plain ProviderError.
    assert type(provider_error("x", ImportError("no module"))) is ProviderError

    class Local(Exception):
        pass

    local = pickle.loads(pickle.dumps(provider_error("x", Local())))
    assert type(local) is ProviderError  # the class cannot be imported on the other side
