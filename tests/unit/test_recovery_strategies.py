"""Recovery strategies driven through a scripted Transport: resume, replay, raise, no socket."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

import pytest

from envlink import (
    ConnectionLostError,
    ConnectionOptions,
    GenericEnvClient,
    ReconnectPolicy,
    ReplayDivergedError,
    RetryBudget,
    RetryBudgetExhaustedError,
    SessionGoneError,
    SessionLostError,
)
from envlink._sansio.protocol import Extensions
from envlink._transports.base import Endpoint

pytestmark = pytest.mark.timeout(30)


class Server:
    """A scripted server: sessions by token, steps counted, drops on demand."""

    def __init__(self, *, extensions: bool = True, keep_sessions: bool = True) -> None:
        self.extensions = extensions
        self.keep_sessions = keep_sessions
        self.sessions: dict[str, int] = {}
        self.handshakes: list[dict[str, str]] = []
        self.requests: list[dict[str, Any]] = []
        self.drop_next_step = 0
        self.answers: dict[str, dict[str, Any]] = {}  # de-duplication by request id
        self.diverge = False

    async def connect(self, endpoint: Endpoint, options: ConnectionOptions, *,
                      headers: Mapping[str, str], timeout: float | None,
                      offer_extensions: bool = True) -> Conn:
        self.handshakes.append(dict(headers))
        wanted = headers.get("envlink-resume")
        resumed: bool | None = None
        if wanted is not None:
            resumed = self.keep_sessions and wanted in self.sessions
        token = wanted if resumed and wanted is not None else f"tok-{len(self.handshakes)}"
        self.sessions.setdefault(token, 0)
        ext = Extensions()
        if self.extensions:
            raw = {"envlink-protocol": "1", "envlink-session": token,
                   "envlink-session-id": f"s-{token}"}
            if resumed is not None:
                raw["envlink-resumed"] = "1" if resumed else "0"
            ext = Extensions.from_headers(raw)
        return Conn(self, token, ext)


class Conn:
    def __init__(self, server: Server, token: str, extensions: Extensions) -> None:
        self.server, self.token, self.extensions = server, token, extensions
        self.inbox: asyncio.Queue[str | None] = asyncio.Queue()
        self.open = True

    @property
    def is_open(self) -> bool:
        return self.open

    async def send(self, text: str) -> None:
        srv, req = self.server, json.loads(text)
        srv.requests.append(req)
        rid = req.get("id")
        if req["type"] == "close":
            return
        if rid in srv.answers:
            self.inbox.put_nowait(json.dumps(srv.answers[rid]))  # de-duplicated
            return
        if req["type"] == "reset":
            srv.sessions[self.token] = 0
            answer: dict[str, Any] = {"type": "observation",
                                      "data": {"observation": {"n": 0}}}
        elif req["type"] == "state":
            answer = {"type": "state", "data": {"step_count": srv.sessions[self.token]}}
        else:
            srv.sessions[self.token] += 1  # applied
            n = srv.sessions[self.token] + (100 if srv.diverge else 0)
            answer = {"type": "observation", "data": {"observation": {"n": n}}}
            if srv.drop_next_step:
                srv.drop_next_step -= 1
                if rid is not None:
                    srv.answers[rid] = {**answer, "id": rid}
                self.open = False
                self.inbox.put_nowait(None)  # dropped after applying, before answering
                return
        if rid is not None:
            answer["id"] = rid
            srv.answers[rid] = answer
        self.inbox.put_nowait(json.dumps(answer))

    async def recv(self) -> str:
        item = await self.inbox.get()
        if item is None:
            raise ConnectionLostError("connection lost: dropped")
        return item

    async def probe(self, timeout: float) -> bool:
        return self.open

    async def take_buffered(self) -> None:
        return None

    async def close(self, timeout: float | None) -> None:
        self.abort()

    def abort(self) -> None:
        if self.open:
            self.open = False
            self.inbox.put_nowait(None)


def steps_applied(server: Server) -> int:
    return sum(server.sessions.values())


async def test_resume_resends_with_the_same_request_id_and_never_applies_twice() -> None:
    """A step applied before the drop is answered from the server's cache on resume."""
    srv = Server()
    env = GenericEnvClient("http://env.test", transport=srv, on_session_lost="resume")
    await env.reset()
    srv.drop_next_step = 1
    result = await env.step({"a": 1})
    assert result.observation == {"n": 1}
    steps = [r for r in srv.requests if r["type"] == "step"]
    assert len(steps) == 2 and steps[0]["id"] == steps[1]["id"]
    assert srv.handshakes[-1]["envlink-resume"] == "tok-1"
    assert steps_applied(srv) == 1
    assert env.journal.step_count == 1
    await env.close()


async def test_resume_when_the_server_forgot_the_session_raises_with_the_journal() -> None:
    """Grace window over: SessionGoneError (session_unknown: the server stayed reachable)
    says so; the episode is lost until reset()."""
    srv = Server(keep_sessions=False)
    env = GenericEnvClient("http://env.test", transport=srv, on_session_lost="resume")
    await env.reset()
    await env.step({"a": 1})
    srv.drop_next_step = 1
    with pytest.raises(SessionGoneError, match="no longer knows the session") as info:
        await env.step({"a": 2})
    assert info.value.reason == "session_unknown"
    assert info.value.journal is not None and info.value.journal.step_count == 1
    with pytest.raises(SessionLostError, match="call reset"):
        await env.state()
    await env.reset()
    await env.close()


async def test_replay_rebuilds_then_finishes_the_call() -> None:
    """replay: a new session, reset and recorded steps resent and verified, then the step."""
    srv = Server(extensions=False)
    env = GenericEnvClient("http://env.test", transport=srv, on_session_lost="replay")
    await env.reset()
    await env.step({"a": 1})
    srv.drop_next_step = 1
    result = await env.step({"a": 2})
    assert result.observation == {"n": 2}
    assert [r["type"] for r in srv.requests] == ["reset", "step", "step", "reset", "step",
                                                  "step"]
    await env.close()


async def test_replay_that_diverges_raises_and_keeps_the_journal() -> None:
    """A replayed answer that differs: ReplayDivergedError with the journal; episode lost."""
    srv = Server(extensions=False)
    env = GenericEnvClient("http://env.test", transport=srv, on_session_lost="replay")
    await env.reset()
    await env.step({"a": 1})
    srv.drop_next_step = 1
    srv.diverge = True
    with pytest.raises(ReplayDivergedError) as info:
        await env.step({"a": 2})
    assert info.value.index == 0 and info.value.journal is not None
    with pytest.raises(SessionLostError):
        await env.step({"a": 3})
    await env.close()


async def test_replay_rounds_spend_the_retry_budget() -> None:
    """Each replay round after the first is a retry: the shared budget is charged."""
    srv = Server(extensions=False)
    budget = RetryBudget(max_tokens=2, token_ratio=0.1)  # allows one retry
    env = GenericEnvClient("http://env.test", transport=srv, on_session_lost="replay",
                           reconnect=ReconnectPolicy(max_attempts=5, budget=budget))
    await env.reset()
    srv.drop_next_step = 10  # every replayed or resent step is dropped
    with pytest.raises(SessionLostError) as info:
        await env.step({"a": 1})
    assert isinstance(info.value.__cause__, RetryBudgetExhaustedError)
    await env.close()


async def test_raise_policy_ends_the_abandoned_server_session() -> None:
    """on_session_lost='raise' with a resumable session: the server is told to end it."""
    srv = Server()
    env = GenericEnvClient("http://env.test", transport=srv)
    await env.reset()
    srv.drop_next_step = 1
    with pytest.raises(SessionLostError, match="on_session_lost='raise'"):
        await env.step({"a": 1})
    await env.close()  # waits for the background release
    release = [h for h in srv.handshakes if h.get("envlink-resume") == "tok-1"]
    assert release, "the abandoned session was not released"
    assert srv.requests[-1]["type"] == "close"
