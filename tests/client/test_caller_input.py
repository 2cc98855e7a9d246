"""Bad caller input is refused with a clear TypeError/ValueError, before anything is sent."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
from pydantic import BaseModel

from envlink import (
    Bridge,
    EnvlinkError,
    EnvPool,
    EpisodeJournal,
    GenericEnvClient,
    InvalidActionError,
    InvalidArgumentError,
    InvalidURLError,
    ReconnectPolicy,
    RetryBudget,
    Timeout,
)
from envlink._config import check_timeout
from envlink.server import EnvServer, ServerThread

pytestmark = pytest.mark.timeout(30)

NON_FINITE = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("bad", NON_FINITE)
async def test_non_finite_numbers_in_an_action_are_refused_before_sending(
        server: EnvServer, bad: float) -> None:
    """NaN/±inf anywhere in an action is a ValueError; the server never sees the step."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        for action in ({"message": "x", "v": bad}, {"message": "x", "v": [1.0, {"w": bad}]}):
            with pytest.raises(ValueError, match="JSON cannot represent"):
                await env.step(action)
        assert server.counter("request.step") == 0
        # Nothing was lost: the episode goes on.
        assert (await env.step({"message": "ok"})).observation["echoed_message"] == "ok"
        assert env.journal.steps_applied == 1


@pytest.mark.parametrize("bad", NON_FINITE)
async def test_non_finite_numbers_in_reset_arguments_are_refused_before_sending(
        server: EnvServer, bad: float) -> None:
    """NaN/±inf in reset kwargs is a ValueError; the server never sees the reset."""
    async with GenericEnvClient(server.url) as env:
        with pytest.raises(ValueError, match="JSON cannot represent"):
            await env.reset(options={"scale": bad})
        assert server.counter("request.reset") == 0


@pytest.mark.parametrize(("action", "path"), [
    ({"message": "x", "scores": [1.0, math.nan]}, "action.scores[1]"),
    ({"message": "x", "deep": {"odd key": [{"v": math.inf}]}}, "action.deep['odd key'][0].v"),
    ({"message": "x", "handle": object()}, "action.handle"),
    ({"message": "x", 3: "three"}, "action[3]"),
])
async def test_an_action_json_cannot_carry_is_refused_naming_the_field(
        server: EnvServer, action: dict[Any, Any], path: str) -> None:
    """NaN, a value of no JSON form or a non-string key is refused before sending with
    InvalidActionError (an EnvlinkError, TypeError and ValueError) naming where it is."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        with pytest.raises(InvalidActionError) as info:
            await env.step(action)
        error = info.value
        assert isinstance(error, EnvlinkError)
        assert isinstance(error, TypeError) and isinstance(error, ValueError)
        assert error.path == path and str(error).startswith(f"{path}: ")
        assert server.counter("request.step") == 0


async def test_a_refused_model_field_is_named_through_the_model(server: EnvServer) -> None:
    """A NaN inside a pydantic model inside the action is named by the model's field."""

    class Reading(BaseModel):
        value: float

    async with GenericEnvClient(server.url) as env:
        await env.reset()
        with pytest.raises(InvalidActionError) as info:
            await env.step({"message": "x", "readings": [Reading(value=1.0),
                                                         Reading(value=math.nan)]})
        assert info.value.path == "action.readings[1].value"
        with pytest.raises(InvalidActionError, match=r"^reset\.options\.scale: NaN"):
            await env.reset(options={"scale": math.nan})


async def test_strings_that_spell_nan_are_sent_as_they_are(server: EnvServer) -> None:
    """Text containing 'NaN' or 'Infinity' is data, not a number: it is sent unchanged."""
    async with GenericEnvClient(server.url) as env:
        await env.reset()
        got = await env.step({"message": "NaN and -Infinity"})
        assert got.observation["echoed_message"] == "NaN and -Infinity"


def test_base_url_of_the_wrong_type_is_a_type_error() -> None:
    """GenericEnvClient(8000) says what base_url must be, instead of an AttributeError."""
    for bad in (8000, b"http://127.0.0.1:8000"):
        with pytest.raises(TypeError, match="base_url must be a str"):
            GenericEnvClient(bad)  # type: ignore[arg-type]


def test_a_client_without_a_server_is_a_value_error() -> None:
    """GenericEnvClient() or GenericEnvClient(None), with no provider either, raises an
    InvalidArgumentError, a ValueError with OpenEnv's message, saying what base_url must be."""
    for make in (lambda: GenericEnvClient(), lambda: GenericEnvClient(None)):
        with pytest.raises(InvalidArgumentError, match=r"^EnvClient requires either base_url "
                           r"or provider\..*base_url: a str") as caught:
            make()
        assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(("url", "reason"), [
    ("htp://host", "the scheme must be http, https, ws or wss, not 'htp'"),
    ("127.0.0.1:8000", "no scheme (did you mean 'http://127.0.0.1:8000'?)"),
    ("localhost", "no scheme"),
    ("", "is empty"),
    ("   ", "is empty"),
    ("http://", "no host"),
    ("http://127.0.0.1:99999", "port must be a number from 1 to 65535"),
    ("http://127.0.0.1:0", "port must be"),
    ("http://127.0.0.1:http", "port must be"),
    ("ws://[::1", "Invalid IPv6 URL"),
])
def test_a_bad_base_url_is_an_envlink_error_naming_the_argument(url: str, reason: str) -> None:
    """A malformed base_url raises InvalidURLError, an EnvlinkError and a ValueError, whose
    message names base_url and says what is wrong; no other error is chained."""
    with pytest.raises(InvalidURLError) as info:
        GenericEnvClient(url)
    error = info.value
    assert isinstance(error, InvalidArgumentError) and isinstance(error, EnvlinkError)
    assert isinstance(error, ValueError)
    assert str(error).startswith("base_url ") and reason in str(error)
    assert error.argument == "base_url"
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__


def test_a_bad_base_url_never_shows_its_credentials() -> None:
    """The error of a malformed URL with a password shows the URL without it."""
    with pytest.raises(InvalidURLError) as info:
        GenericEnvClient("htp://alice:hunter2pw@host")
    assert "hunter2pw" not in str(info.value) and "hunter2pw" not in info.value.url


def test_a_bad_pool_endpoint_is_an_envlink_error_naming_the_argument() -> None:
    """EnvPool's endpoints are checked the same way, the error naming endpoints."""
    for url in ("htp://host", "http://127.0.0.1:99999", "ws://[::1"):
        with pytest.raises(InvalidURLError, match="endpoint") as info:
            EnvPool([url], 1)
        assert info.value.argument == "endpoints"


def test_negative_journal_bound_is_a_value_error() -> None:
    """max_journal_steps=-1 (or a bool, or a float) is refused at construction."""
    with pytest.raises(ValueError, match="max_journal_steps must be >= 0, got -1"):
        GenericEnvClient("http://127.0.0.1:1", max_journal_steps=-1)
    for bad in (True, 1.5, "10"):
        with pytest.raises(TypeError, match="max_journal_steps must be an int"):
            GenericEnvClient("http://127.0.0.1:1", max_journal_steps=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_steps"):
        EpisodeJournal(max_steps=-1)
    assert GenericEnvClient("http://127.0.0.1:1", max_journal_steps=0).journal.max_steps == 0


@pytest.mark.parametrize(("kwargs", "error", "pattern"), [
    ({"max_elapsed": -1}, ValueError, "max_elapsed must be a positive .* got -1"),
    ({"max_elapsed": 0}, ValueError, "max_elapsed"),
    ({"max_elapsed": math.nan}, ValueError, "max_elapsed"),
    ({"max_elapsed": "30"}, TypeError, "max_elapsed must be a number"),
    ({"stable_after": math.nan}, ValueError, "stable_after"),
    ({"stable_after": -1}, ValueError, "stable_after"),
    ({"initial_delay": math.nan}, ValueError, "initial_delay"),
    ({"max_delay": -0.1}, ValueError, "max_delay"),
    ({"multiplier": math.nan}, ValueError, "multiplier"),
    ({"max_attempts": 0}, ValueError, "max_attempts"),
    ({"max_attempts": 2.5}, TypeError, "max_attempts"),
    ({"max_attempts": True}, TypeError, "max_attempts"),
    ({"jitter": "half"}, ValueError, "jitter"),
])
def test_reconnect_policy_refuses_nonsense(kwargs: dict[str, Any], error: type[Exception],
                                           pattern: str) -> None:
    """Negative, NaN or mistyped policy values are refused at construction, named."""
    with pytest.raises(error, match=pattern):
        ReconnectPolicy(**kwargs)


def test_retry_budget_refuses_nonsense() -> None:
    """A NaN, infinite or mistyped budget is refused."""
    for bad in (math.nan, math.inf, -1, 0):
        with pytest.raises(ValueError, match="max_tokens must be a positive finite"):
            RetryBudget(max_tokens=bad)
    with pytest.raises(TypeError):
        RetryBudget(token_ratio="0.1")  # type: ignore[arg-type]


BAD_TIMEOUTS: list[tuple[Any, type[Exception], str]] = [
    (-1, ValueError, "got -1"),
    (0, ValueError, "got 0"),
    (math.nan, ValueError, "got nan"),
    ("5", TypeError, "timeout must be a number of seconds or None, got str '5'"),
    (True, TypeError, "got bool True"),
]


@pytest.mark.parametrize(("bad", "error", "pattern"), BAD_TIMEOUTS)
async def test_every_async_timeout_is_validated_alike(server: EnvServer, bad: Any,
                                                      error: type[Exception], pattern: str) -> None:
    """reset/step/state/connect/disconnect/close and the constructor refuse the same values."""
    env = GenericEnvClient(server.url)
    try:
        for call in (lambda: env.connect(timeout=bad), lambda: env.reset(timeout=bad),
                     lambda: env.step({"message": "x"}, timeout=bad),
                     lambda: env.state(timeout=bad), lambda: env.disconnect(timeout=bad),
                     lambda: env.close(timeout=bad)):
            with pytest.raises(error, match=re.escape(pattern)):
                await call()
        for kwargs in ({"timeout": bad}, {"ping_interval": bad}, {"ping_timeout": bad},
                       {"message_timeout_s": bad}, {"connect_timeout_s": bad}):
            with pytest.raises(error):
                GenericEnvClient(server.url, **kwargs)
        for phase in ("connect", "call", "close"):
            with pytest.raises(error):
                Timeout(**{phase: bad})
    finally:
        await env.close()
    assert server.counter("request") == 0


@pytest.mark.parametrize(("bad", "error", "pattern"), BAD_TIMEOUTS)
def test_every_sync_timeout_is_validated_alike(bad: Any, error: type[Exception],
                                               pattern: str) -> None:
    """The sync facade gives the async client's error, naming the caller's own value
    (not the value plus the bridge's margin)."""
    with ServerThread(env="echo") as st, GenericEnvClient(st.url).sync() as env:
        for call in (lambda: env.reset(timeout=bad), lambda: env.step({"m": 1}, timeout=bad),
                     lambda: env.state(timeout=bad), lambda: env.connect(timeout=bad)):
            with pytest.raises(error, match=re.escape(pattern)):
                call()
        env.reset()  # the facade is still usable


def test_bridge_timeouts_are_validated_alike() -> None:
    """Bridge.call/close and the bridge's own durations share the one validation."""
    async def noop() -> None:
        return None

    with pytest.raises(TypeError, match="cancel_grace must be a number"):
        Bridge(cancel_grace="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="join_timeout"):
        Bridge(join_timeout=math.nan)
    bridge = Bridge()
    try:
        for bad, error in ((True, TypeError), ("1", TypeError), (-1, ValueError),
                           (math.nan, ValueError)):
            with pytest.raises(error):
                bridge.call(noop, timeout=bad)
        bridge.call(noop, timeout=0.5)
        with pytest.raises(TypeError):
            bridge.close(timeout="1")  # type: ignore[arg-type]
    finally:
        bridge.close()


def test_check_timeout_accepts_numbers_and_none() -> None:
    """Positive ints and floats become floats, None means no limit, inf is a valid bound."""
    assert check_timeout(5) == 5.0 and isinstance(check_timeout(5), float)
    assert check_timeout(0.25) == 0.25
    assert check_timeout(None) is None
    assert check_timeout(math.inf) == math.inf
    assert check_timeout(0, allow_zero=True) == 0.0
