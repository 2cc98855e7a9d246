"""Negotiated envlink extensions: request ids, de-duplication, resumption."""

from __future__ import annotations

import json

import pytest
from websockets.exceptions import ConnectionClosed

from envlink._sansio.protocol import (
    EXTENSION_HEADER,
    RESUME_GRACE_HEADER,
    RESUMED_HEADER,
    SESSION_TOKEN_HEADER,
    Extensions,
)
from envlink.server import EnvServer

from ._server_support import RESET, STATE, open_ws, rpc, step, token_of

pytestmark = pytest.mark.timeout(15)

_EXT_HEADERS = (EXTENSION_HEADER, SESSION_TOKEN_HEADER, RESUME_GRACE_HEADER, RESUMED_HEADER)


async def test_headers_when_offered_and_enabled(server: EnvServer) -> None:
    """An extension-enabled server answers the offer with version, token and grace."""
    async with open_ws(server, extensions=True) as ws:
        assert ws.response is not None
        ext = Extensions.from_headers(dict(ws.response.headers.raw_items()))
    assert ext.enabled
    assert ext.can_resume
    assert ext.resume_grace == 30.0
    assert ext.resumed is None
    assert ext.session_token is not None
    assert len(ext.session_token) >= 24


async def test_no_headers_when_not_offered(server: EnvServer) -> None:
    """A client that does not offer the extension gets none of its headers."""
    async with open_ws(server) as ws:
        assert ws.response is not None
        headers = ws.response.headers
        assert all(name not in headers for name in _EXT_HEADERS)


async def test_no_headers_when_disabled() -> None:
    """A server with extensions=False ignores the offer and rejects extension fields."""
    async with EnvServer(extensions=False, ping_interval=None) as srv:
        async with open_ws(srv, extensions=True) as ws:
            assert ws.response is not None
            assert all(name not in ws.response.headers for name in _EXT_HEADERS)
            answer = await rpc(ws, {"type": "state", "id": "x"})
        assert answer["data"]["code"] == "VALIDATION_ERROR"


async def test_tokens_are_unique(server: EnvServer) -> None:
    """Each extension session gets its own random token."""
    async with open_ws(server, extensions=True) as a, open_ws(server, extensions=True) as b:
        assert token_of(a) != token_of(b)


async def test_request_id_echoed(server: EnvServer) -> None:
    """Answers echo the request id, also on error answers; requests without an id get none."""
    async with open_ws(server, extensions=True) as ws:
        assert (await rpc(ws, {**RESET, "id": "r1"}))["id"] == "r1"
        assert (await rpc(ws, {**STATE, "id": "r2"}))["id"] == "r2"
        assert (await rpc(ws, {"type": "step", "data": {"bad": 1}, "id": "r3"}))["id"] == "r3"
        assert (await rpc(ws, {"type": "what", "id": "r4"}))["id"] == "r4"
        assert "id" not in await rpc(ws, STATE)


async def test_trace_fields_accepted_in_extension_mode(server: EnvServer) -> None:
    """traceparent and tracestate envelope fields are accepted once negotiated."""
    tp = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    async with open_ws(server, extensions=True) as ws:
        answer = await rpc(ws, {**RESET, "id": "1", "traceparent": tp, "tracestate": "k=v"})
    assert answer["type"] == "observation"


async def test_non_string_id_rejected(server: EnvServer) -> None:
    """A request id must be a string."""
    async with open_ws(server, extensions=True) as ws:
        answer = await rpc(ws, {**STATE, "id": 5})
    assert answer["data"]["code"] == "VALIDATION_ERROR"


async def test_dedup_same_id_not_reapplied(server: EnvServer) -> None:
    """A request repeating the last id gets the cached answer and is not applied again."""
    async with open_ws(server, extensions=True) as ws:
        await ws.send(json.dumps(step({"message": "a"}, id="s1")))
        first = await ws.recv()
        await ws.send(json.dumps(step({"message": "a"}, id="s1")))
        again = await ws.recv()
        assert again == first  # byte-identical
        assert server.steps_applied == 1
        assert server.dedup_hits == 1
        await rpc(ws, step({"message": "a"}, id="s2"))
        assert server.steps_applied == 2
        state = await rpc(ws, {**STATE, "id": "s3"})
    assert state["data"]["step_count"] == 2


async def test_dedup_only_last_id(server: EnvServer) -> None:
    """Only the last request id is remembered: an older id is applied again."""
    async with open_ws(server, extensions=True) as ws:
        await rpc(ws, step({"message": "a"}, id="s1"))
        await rpc(ws, step({"message": "a"}, id="s2"))
        await rpc(ws, step({"message": "a"}, id="s1"))
    assert server.steps_applied == 3
    assert server.dedup_hits == 0


async def test_resume_within_grace(server: EnvServer) -> None:
    """A dropped extension session is detached and re-attached by token with its state."""
    async with open_ws(server, extensions=True) as ws:
        token = token_of(ws)
        await rpc(ws, {**RESET, "data": {"episode_id": "ep"}})
        await rpc(ws, step({"message": "a"}, id="s1"))
    await server.wait_for("session.detached", 1)
    (info,) = server.sessions()
    assert not info.attached
    assert info.expires_in is not None
    async with open_ws(server, extensions=True, resume=token) as ws2:
        assert ws2.response is not None
        assert ws2.response.headers[RESUMED_HEADER] == "1"
        assert token_of(ws2) == token
        state = await rpc(ws2, STATE)
        again = await rpc(ws2, step({"message": "a"}, id="s1"))
    assert state["data"] == {"episode_id": "ep", "step_count": 1}
    assert again["id"] == "s1"
    assert server.steps_applied == 1
    assert server.resumes == 1
    assert server.dedup_hits == 1


async def test_resume_unknown_token_gives_fresh_session(server: EnvServer) -> None:
    """An unknown token gives a fresh session, envlink-resumed: 0 and a new token."""
    async with open_ws(server, extensions=True, resume="not-a-token") as ws:
        assert ws.response is not None
        assert ws.response.headers[RESUMED_HEADER] == "0"
        assert token_of(ws) != "not-a-token"
        assert (await rpc(ws, STATE))["data"]["step_count"] == 0
    assert server.resumes == 0


async def test_resume_after_expiry() -> None:
    """After the grace window the session is gone and resuming gives a fresh one."""
    async with EnvServer(resume_grace=0.05, ping_interval=None) as srv:
        async with open_ws(srv, extensions=True) as ws:
            token = token_of(ws)
            await rpc(ws, step({"message": "a"}))
        await srv.wait_for("session.expired", 1)
        assert srv.sessions() == []
        async with open_ws(srv, extensions=True, resume=token) as ws2:
            assert ws2.response is not None
            assert ws2.response.headers[RESUMED_HEADER] == "0"
            assert (await rpc(ws2, STATE))["data"]["step_count"] == 0


async def test_close_request_destroys_extension_session(server: EnvServer) -> None:
    """{"type":"close"} destroys an extension session: it cannot be resumed."""
    async with open_ws(server, extensions=True) as ws:
        token = token_of(ws)
        await ws.send(json.dumps({"type": "close", "id": "c"}))
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    await server.wait_for_disconnect(1)
    assert server.sessions() == []
    async with open_ws(server, extensions=True, resume=token) as ws2:
        assert ws2.response is not None
        assert ws2.response.headers[RESUMED_HEADER] == "0"


async def test_resume_takes_over_attached_session(server: EnvServer) -> None:
    """Resuming a session still attached to a (stalled) connection aborts that connection."""
    async with open_ws(server, extensions=True) as ws:
        token = token_of(ws)
        await rpc(ws, step({"message": "a"}))
        handle = await server.wait_for_connection(1)
        handle.stall()
        async with open_ws(server, extensions=True, resume=token) as ws2:
            assert ws2.response is not None
            assert ws2.response.headers[RESUMED_HEADER] == "1"
            await handle.wait_closed()
            assert (await rpc(ws2, STATE))["data"]["step_count"] == 1
            assert len(server.sessions()) == 1


async def test_detached_session_counts_toward_capacity() -> None:
    """A detached session holds its slot until it expires or is resumed."""
    async with EnvServer(max_sessions=1, ping_interval=None) as srv:
        async with open_ws(srv, extensions=True) as ws:
            token = token_of(ws)
        await srv.wait_for("session.detached", 1)
        async with open_ws(srv, extensions=True) as other:
            assert json.loads(await other.recv())["data"]["code"] == "CAPACITY_REACHED"
        async with open_ws(srv, extensions=True, resume=token) as again:
            assert (await rpc(again, STATE))["type"] == "state"


async def test_resume_header_ignored_without_offer(server: EnvServer) -> None:
    """A resume token without the extension offer is ignored: plain session, no headers."""
    async with open_ws(server, extensions=True) as ws:
        token = token_of(ws)
    await server.wait_for("session.detached", 1)
    async with open_ws(server, resume=token) as plain:
        assert plain.response is not None
        assert RESUMED_HEADER not in plain.response.headers
    assert server.resumes == 0


async def test_restart_keeps_detached_sessions(server: EnvServer) -> None:
    """restart() aborts connections but extension sessions stay resumable on the same port."""
    port = server.port
    async with open_ws(server, extensions=True) as ws:
        token = token_of(ws)
        await rpc(ws, step({"message": "a"}))
        await server.restart()
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    assert server.port == port
    async with open_ws(server, extensions=True, resume=token) as ws2:
        assert ws2.response is not None
        assert ws2.response.headers[RESUMED_HEADER] == "1"
        assert (await rpc(ws2, STATE))["data"]["step_count"] == 1


async def test_restart_destroys_plain_sessions(server: EnvServer) -> None:
    """restart() kills plain sessions with their connections."""
    async with open_ws(server) as ws:
        await rpc(ws, RESET)
        await server.restart()
        with pytest.raises(ConnectionClosed):
            await ws.recv()
    await server.wait_for_disconnect(1)
    assert server.sessions() == []
