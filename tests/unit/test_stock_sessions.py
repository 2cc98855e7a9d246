"""The pure parts of OpenEnv 0.10 session support: typed error frames, the journal's
step-count settlement, endpoints for /mcp and attaching, the core's recovery plan,
and the small HTTP client that posts JSON-RPC to /mcp (against a loopback server)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

import envlink
from envlink import (
    ConnectError,
    ConnectionLostError,
    EpisodeJournal,
    ProtocolError,
    ReconnectPolicy,
)
from envlink._sansio.protocol import ErrorFrame, McpFrame, decode_response, server_error
from envlink._sansio.session import Episode, SessionCore
from envlink._transports.base import parse_endpoint
from envlink._transports.http import NoAnswerError, post_json

pytestmark = pytest.mark.timeout(20)


def _error(data: dict[str, object]) -> envlink.ServerError:
    frame = decode_response(json.dumps({"type": "error", "data": data}))
    assert isinstance(frame, ErrorFrame)
    return server_error(frame)


# ------------------------------------------------------------------ error frames


def test_capacity_frame_keeps_the_counts_and_every_field() -> None:
    """CAPACITY_REACHED: counts as attributes, every other field in details."""
    error = _error({"message": "full", "code": "CAPACITY_REACHED", "active_sessions": 2,
                    "max_sessions": 2, "region": "eu"})
    assert isinstance(error, envlink.CapacityReachedError)
    assert (error.active_sessions, error.max_sessions) == (2, 2)
    assert error.details == {"active_sessions": 2, "max_sessions": 2, "region": "eu"}


def test_validation_frame_keeps_the_field_errors() -> None:
    """VALIDATION_ERROR: a ServerValidationError whose errors are the server's list."""
    errors = [{"type": "less_than_equal", "loc": ["delta"], "msg": "too big", "input": 1000}]
    error = _error({"message": "Invalid message", "code": "VALIDATION_ERROR",
                    "errors": errors})
    assert isinstance(error, envlink.ServerValidationError)
    assert error.errors == errors
    assert error.code is envlink.ErrorCode.VALIDATION_ERROR
    assert str(error) == "[VALIDATION_ERROR] Invalid message: delta: too big"
    assert error.message == "Invalid message"
    # The text is bounded: many field errors end with how many more there were.
    many = [{"loc": ["field", n], "msg": "x" * 30, "input": "secret"} for n in range(100)]
    long = _error({"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": many})
    assert len(str(long)) < 500
    assert str(long).endswith("more)")
    assert "secret" not in str(long)
    # Without a list the attribute is empty, never a crash.
    assert _error({"message": "x", "code": "VALIDATION_ERROR", "errors": "junk"}).errors == []


def test_factory_and_session_frames_have_their_classes() -> None:
    """FACTORY_ERROR keeps factory_name; SESSION_ERROR is a SessionError; others stay plain."""
    factory = _error({"message": "boom", "code": "FACTORY_ERROR", "factory_name": "Env"})
    assert isinstance(factory, envlink.FactoryError)
    assert factory.factory_name == "Env"
    session = _error({"message": "Unknown session_id: x", "code": "SESSION_ERROR"})
    assert isinstance(session, envlink.SessionError)
    plain = _error({"message": "m", "code": "SOMETHING_NEW", "hint": 1})
    assert type(plain) is envlink.ServerError
    assert (plain.code, plain.details) == ("SOMETHING_NEW", {"hint": 1})


def test_mcp_frames_decode_and_mcp_errors_carry_the_rpc_code() -> None:
    """An "mcp" answer decodes; McpError keeps the JSON-RPC code and data."""
    frame = decode_response('{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"result":{}}}')
    assert isinstance(frame, McpFrame)
    error = envlink.McpError("Method not found: x", -32601, data={"why": 1})
    assert isinstance(error, envlink.ServerError)
    assert (error.rpc_code, error.data) == (-32601, {"why": 1})


# ------------------------------------------------------------- journal settlement


def _journal(steps: int) -> EpisodeJournal:
    journal = EpisodeJournal()
    journal.record_reset({"seed": 1}, {"observation": {}})
    for index in range(steps):
        journal.record_step({"i": index}, {"observation": {"i": index}})
    return journal


def test_settle_applied_records_an_applied_step_without_its_answer() -> None:
    """Count one higher: the unknown step was applied; its answer is recorded as lost."""
    journal = _journal(2)
    journal.record_unknown({"i": 2}, None)
    assert journal.settle_applied(3) == 1
    assert journal.unknown_steps == []
    assert [e.action for e in journal.entries] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert journal.entries[-1].response is None
    assert journal.steps_applied == 3
    assert journal.replayable
    assert journal.to_dict()["steps"][-1] == {"action": {"i": 2}, "response": None}


def test_settle_applied_drops_a_step_never_applied() -> None:
    """Count unchanged: the unknown step never reached the environment."""
    journal = _journal(2)
    journal.record_unknown({"i": 2}, None)
    assert journal.settle_applied(2) == 0
    assert journal.unknown_steps == []
    assert journal.step_count == 2


def test_settle_applied_takes_a_prefix_of_several_unknown_steps() -> None:
    """The server applies in order: a count of one more settles the first of two."""
    journal = _journal(1)
    journal.record_unknown({"i": 1}, None)
    journal.record_unknown({"i": 2}, None)
    assert journal.settle_applied(2) == 1
    assert [e.action for e in journal.entries] == [{"i": 0}, {"i": 1}]


@pytest.mark.parametrize("count", [0, 4, -1])
def test_settle_applied_refuses_a_count_that_does_not_fit(count: int) -> None:
    """A count below the known steps or beyond the unknown ones changes nothing."""
    journal = _journal(1)
    journal.record_unknown({"i": 1}, None)
    assert journal.settle_applied(count) is None
    assert len(journal.unknown_steps) == 1


def test_steps_applied_counts_past_the_bound() -> None:
    """steps_applied keeps counting when the journal is truncated (settlement still works)."""
    journal = EpisodeJournal(max_steps=2)
    journal.record_reset({}, {"observation": {}})
    for index in range(4):
        journal.record_step({"i": index}, {"observation": {}})
    assert journal.truncated and journal.steps_applied == 4
    journal.record_unknown({"i": 4}, None)
    assert journal.settle_applied(5) == 1
    assert journal.steps_applied == 5
    assert journal.snapshot().steps_applied == 5


# ------------------------------------------------------------------- endpoints


def test_endpoint_urls_for_mcp_attach_and_base_url() -> None:
    """/mcp is derived as OpenEnv does; the session id goes in the URL but never in display."""
    endpoint = parse_endpoint("https://user:pw@env.example:8443/prefix/")
    assert endpoint.mcp_url == "https://env.example:8443/prefix/mcp"
    assert endpoint.base_url == "https://env.example:8443/prefix"
    attached = endpoint.attached("abc 1")
    assert attached.connect_url == "wss://env.example:8443/prefix/ws?session_id=abc+1"
    assert "abc" not in attached.display
    assert parse_endpoint("ws://h:1/ws?x=1").attached("s").connect_url == (
        "ws://h:1/ws?x=1&session_id=s")
    assert parse_endpoint("ws://h:1").mcp_url == "http://h:1/mcp"
    assert endpoint.attached(None).connect_url == endpoint.ws_url


# ---------------------------------------------------------------- recovery plan


def _core(policy: str) -> SessionCore:
    core = SessionCore(policy=ReconnectPolicy(), on_session_lost=policy)  # type: ignore[arg-type]
    core.journal.record_reset({}, {"observation": {}})
    return core


def test_recovery_plan_for_each_policy() -> None:
    """resume: token, else detached session; auto: the same, then replay; nothing: raise."""
    assert _core("raise").recovery_plan() == []
    assert _core("replay").recovery_plan() == ["replay"]
    resume = _core("resume")
    assert resume.recovery_plan() == [] and resume.mechanism == "raise"
    resume.detached_id = "s"
    assert resume.recovery_plan() == ["openenv-resume"]
    assert resume.mechanism == "openenv-resume"
    resume.resume_token = "t"
    assert resume.recovery_plan() == ["envlink-resume"] and resume.mechanism == "envlink-resume"
    auto = _core("auto")
    assert auto.recovery_plan() == ["replay"]
    auto.detached_id = "s"
    assert auto.recovery_plan() == ["openenv-resume", "replay"]
    auto.journal.record_unknown({"i": 0}, None)
    assert auto.recovery_plan() == ["openenv-resume"]  # not replayable with unknown steps


@pytest.mark.parametrize("policy", ["auto", "resume"])
def test_a_lost_answer_is_replayed_under_auto_only_and_a_failed_replay_undone(
        policy: str) -> None:
    """A step applied, its answer lost: auto may replay it (the step taken out of the
    journal, the detached session let go); a failed replay puts both back as they were."""
    core = _core(policy)
    core.episode = Episode.ACTIVE
    core.detached_id = "old"
    core.journal.record_step({"i": 0}, {"observation": {}})
    core.journal.record_unknown({"i": 1}, None)
    assert core.journal.settle_applied(2) == 1
    assert core.lost_answer_replayable is (policy == "auto")
    if policy != "auto":
        return
    before = core.journal.snapshot()
    core.replay_lost_answer()
    assert core.detached_id is None
    assert ([e.action for e in core.journal.entries], core.journal.steps_applied) == (
        [{"i": 0}], 1)
    core.detached_id = "new"  # the replay's session
    core.lose_episode()  # a fresh session in mid-episode, until the replay rebuilt it
    assert core.episode is Episode.LOST
    assert core.lost_answer_kept() == "new"
    assert (core.detached_id, core.journal, core.episode.value) == ("old", before, "active")
    core.replay_lost_answer()
    assert core.lost_answer_replayed() == "old"
    assert core.lost_answer_replayed() is None
    core.journal.record_step({"i": 1}, None)
    core.journal.truncated = True
    assert not core.lost_answer_replayable


def test_resume_without_any_way_is_session_gone_unsupported() -> None:
    """resume on a server offering nothing: SessionGoneError(resume_unsupported), journal in."""
    error = _core("resume").cannot_recover("step", None)
    assert isinstance(error, envlink.SessionGoneError)
    assert error.reason == "resume_unsupported"
    assert error.journal is not None


def test_only_tools_list_is_resent_after_a_lost_connection() -> None:
    """mcp tools/list reads only (resent); tools/call may have run (outcome unknown)."""
    core = _core("raise")
    core.lose_episode()
    lost = ConnectionLostError("x")
    listed = core.after_failure("mcp", lost, written=True, data={"method": "tools/list"})
    called = core.after_failure("mcp", lost, written=True, data={"method": "tools/call"})
    assert listed.action.value == "resend"
    assert called.action.value == "fail"
    assert isinstance(called.error, envlink.OutcomeUnknownError)


def test_detached_sessions_are_wanted_only_to_resume() -> None:
    """Only resume and auto hold an OpenEnv detached session, and not once refused."""
    assert not _core("raise").wants_detached and not _core("replay").wants_detached
    auto = _core("auto")
    assert auto.wants_detached
    auto.detached_offered = False
    assert not auto.wants_detached


# ----------------------------------------------------------- POST /mcp over HTTP


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture
async def http_server() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Loopback TCP servers answering with a scripted handler; closed afterwards."""
    servers: list[asyncio.base_events.Server] = []

    async def start(handler: Handler) -> str:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/mcp"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[str, object]]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    return head, json.loads(await reader.readexactly(length))


async def test_post_json_sends_headers_and_reads_a_content_length_answer(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """The request carries JSON, the caller's headers and Connection: close."""
    seen: list[tuple[bytes, dict[str, object]]] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await _read_request(reader))
        body = b'{"jsonrpc":"2.0","id":1,"result":{"session_id":"s"}}'
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        writer.close()

    url = await http_server(handler)
    answer = await post_json(url, {"jsonrpc": "2.0", "id": 1, "method": "m"},
                             headers=[("Authorization", "Bearer t")], proxy=None)
    assert (answer.status, answer.body) == (200, {"jsonrpc": "2.0", "id": 1,
                                                  "result": {"session_id": "s"}})
    head, body = seen[0]
    assert head.startswith(b"POST /mcp HTTP/1.1\r\n")
    assert b"Authorization: Bearer t\r\n" in head and b"Connection: close\r\n" in head
    assert body == {"jsonrpc": "2.0", "id": 1, "method": "m"}


async def test_post_json_reads_a_chunked_answer(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """A chunked answer is reassembled."""

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"5\r\n{\"a\":\r\n2\r\n1}\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    answer = await post_json(await http_server(handler), {}, proxy=None)
    assert answer.body == {"a": 1}


async def test_post_json_errors_are_typed(
        http_server: Callable[[Handler], Awaitable[str]]) -> None:
    """Closed without a byte, not JSON, too big, or refused: each has its typed error."""

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.close()

    async def not_json(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")
        await writer.drain()
        writer.close()

    async def huge(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 999999\r\n\r\n")
        await writer.drain()
        writer.close()

    with pytest.raises(NoAnswerError):
        await post_json(await http_server(silent), {}, proxy=None)
    with pytest.raises(ProtocolError, match="not JSON"):
        await post_json(await http_server(not_json), {}, proxy=None)
    with pytest.raises(ProtocolError, match="exceeds"):
        await post_json(await http_server(huge), {}, proxy=None, max_size=1000)
    with pytest.raises(ConnectError):  # nothing listens on the discard port
        await post_json("http://127.0.0.1:9/mcp", {}, proxy=None)
