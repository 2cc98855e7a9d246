"""The reference server's OpenEnv 0.10 detached sessions (``detached_sessions=True``):
``POST /mcp`` on the WebSocket port, attaching with ``/ws?session_id=``, and envlink's
client resuming on them exactly as on a stock server."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from websockets.asyncio.client import connect

import envlink
from envlink import GenericEnvClient, set_testing
from envlink.server import EnvServer, StepResult

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Any:
    with set_testing():
        yield


async def _post(server: EnvServer, body: bytes | dict[str, Any]) -> tuple[int, Any]:
    """POST raw bytes (or a JSON object) to /mcp over a plain socket; status and JSON body."""
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(b"POST /mcp HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload))
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length")))
    answer = json.loads(await reader.readexactly(length))
    writer.close()
    return int(head.split(b" ")[1]), answer


def _rpc(method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}


async def test_create_attach_drop_and_attach_again_keeps_the_session() -> None:
    """A created session survives its socket; attaching again finds its state."""
    async with EnvServer(env="deterministic", detached_sessions=True) as srv:
        status, created = await _post(srv, _rpc("openenv/session/create"))
        assert status == 200 and created["id"] == 7
        session_id = created["result"]["session_id"]
        url = f"{srv.ws_url}?session_id={session_id}"
        async with connect(url, compression=None) as ws:
            await ws.send(json.dumps({"type": "reset", "data": {"seed": 1}}))
            await ws.recv()
            await ws.send(json.dumps({"type": "step", "data": {"move": 2}}))
            await ws.recv()
        async with connect(url, compression=None) as ws:
            await ws.send(json.dumps({"type": "state"}))
            state = json.loads(await ws.recv())
        assert state["data"]["step_count"] == 1 and state["data"]["position"] == 2
        assert srv.counter("session.created") == 1


async def test_attach_errors_are_openenv_session_errors() -> None:
    """Unknown or already attached: accepted, one SESSION_ERROR frame, then closed."""
    async with EnvServer(detached_sessions=True) as srv:
        async with connect(f"{srv.ws_url}?session_id=nope") as ws:
            frame = json.loads(await ws.recv())
        assert frame["data"] == {"message": "Unknown session_id: nope", "code": "SESSION_ERROR"}
        _, created = await _post(srv, _rpc("openenv/session/create"))
        url = f"{srv.ws_url}?session_id={created['result']['session_id']}"
        async with connect(url) as first, connect(url) as second:
            refused = json.loads(await second.recv())
            assert "already has an attached WebSocket" in refused["data"]["message"]
            await first.send(json.dumps({"type": "state"}))
            assert json.loads(await first.recv())["type"] == "state"


async def test_close_while_attached_is_pending_then_destroys() -> None:
    """openenv/session/close on an attached session answers closing; it goes with its socket."""
    async with EnvServer(detached_sessions=True) as srv:
        _, created = await _post(srv, _rpc("openenv/session/create"))
        session_id = created["result"]["session_id"]
        async with connect(f"{srv.ws_url}?session_id={session_id}") as ws:
            _, closing = await _post(srv, _rpc("openenv/session/close", session_id=session_id))
            assert closing["result"] == {"session_id": session_id, "closed": False,
                                         "closing": True}
            await ws.send(json.dumps({"type": "state"}))
            await ws.recv()  # still served until the socket goes
        await srv.wait_for("session.destroyed")
        _, unknown = await _post(srv, _rpc("openenv/session/close", session_id=session_id))
        assert unknown["error"]["code"] == -32602


async def test_rpc_errors_and_capacity() -> None:
    """Bad JSON, bad requests, unknown methods, missing params, and a full server."""
    async with EnvServer(detached_sessions=True, max_sessions=1) as srv:
        assert (await _post(srv, b"{oops"))[1]["error"]["code"] == -32700
        assert (await _post(srv, {"id": 1}))[1]["error"]["code"] == -32600
        assert (await _post(srv, _rpc("nope")))[1]["error"]["code"] == -32601
        assert (await _post(srv, _rpc("openenv/session/close")))[1]["error"]["code"] == -32602
        assert "result" in (await _post(srv, _rpc("openenv/session/create")))[1]
        full = (await _post(srv, _rpc("openenv/session/create")))[1]["error"]
        assert (full["code"], full["data"]) == (-32000, {"active_sessions": 1,
                                                          "max_sessions": 1})


async def test_without_the_option_there_is_no_mcp() -> None:
    """Off by default: POST /mcp is not served and the client uses plain sessions."""
    async with EnvServer(env="deterministic", extensions=False) as srv:
        client = GenericEnvClient(srv.url, on_session_lost="auto", timeout=5.0)
        await client.reset(seed=1)
        assert client.recovery == "replay"
        await client.close()


@pytest.mark.parametrize(("mode", "applied"), [("before_apply", False), ("after_apply", True)])
async def test_client_resumes_on_detached_sessions_and_settles_the_step(
        mode: str, applied: bool) -> None:
    """openenv-resume on the reference server: a dropped step is resent or reported applied."""
    async with EnvServer(env="deterministic", detached_sessions=True,
                         extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume", timeout=5.0)
        env.record_steps = True  # to see how the step is settled in the journal's entries
        try:
            await env.reset(seed=5)
            await env.step({"move": 1})
            assert env.recovery == "openenv-resume"
            srv.faults.drop_mode = mode  # type: ignore[assignment]
            # Requests on the connection so far: reset, step (the attach's state read
            # is not counted).
            srv.faults.drop_after = 3
            if applied:
                with pytest.raises(envlink.OutcomeUnknownError) as unknown:
                    await env.step({"move": 2})
                assert unknown.value.applied is True
            else:
                result = await env.step({"move": 2})
                assert result.observation["position"] == 3
            state = await env.state()
            journal = env.journal
        finally:
            await env.close()
        assert (state["step_count"], state["position"]) == (2, 3)
        assert [e.action for e in journal.entries] == [{"move": 1}, {"move": 2}]
        assert (journal.entries[-1].response is None) == applied
        assert journal.steps_applied == 2
        assert srv.counter("session.created") == 1
        await srv.wait_for("session.destroyed")


class _Uncounted:
    """An environment whose state has no step_count: a lost step cannot be settled."""

    def __init__(self) -> None:
        self.applied = 0

    def reset(self, **_: Any) -> StepResult:
        self.applied = 0
        return StepResult(observation={"n": 0})

    def step(self, action: dict[str, Any]) -> StepResult:
        self.applied += 1
        return StepResult(observation={"n": self.applied})

    def state(self) -> dict[str, Any]:
        return {"episode_id": "e"}


async def test_a_step_without_a_count_to_settle_it_is_never_resent() -> None:
    """No step_count in the state: the lost step is OutcomeUnknownError(applied=None)."""
    async with EnvServer(env=_Uncounted, detached_sessions=True, extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost="resume", timeout=5.0)
        try:
            await env.reset()
            srv.faults.drop_mode = "after_apply"
            srv.faults.drop_after = 2  # reset, then this step (the attach's state: uncounted)
            with pytest.raises(envlink.OutcomeUnknownError) as unknown:
                await env.step({"x": 1})
            assert unknown.value.applied is None
            assert [json.loads(a) for a in env.journal.unknown_steps] == [{"x": 1}]
            # The session itself is back: the next step runs on it (applied once each).
            assert (await env.step({"x": 2})).observation["n"] == 2
        finally:
            await env.close()


@pytest.mark.parametrize("policy", ["resume", "auto"])
async def test_a_session_closed_behind_the_clients_back(policy: str) -> None:
    """Closed while detached: resume says session_unknown with the journal; auto replays."""
    async with EnvServer(env="deterministic", detached_sessions=True,
                         extensions=False) as srv:
        env = GenericEnvClient(srv.url, on_session_lost=policy, timeout=5.0)  # type: ignore[arg-type]
        try:
            await env.reset(seed=9)
            await env.step({"move": 1})
            (session,) = srv.sessions()
            for handle in srv.connections:
                handle.abort()
            await srv.wait_for("session.detached")
            _, closed = await _post(srv, _rpc("openenv/session/close", session_id=session.id))
            assert closed["result"]["closed"] is True
            if policy == "resume":
                with pytest.raises(envlink.SessionGoneError) as gone:
                    await env.step({"move": 1})
                assert gone.value.reason == "session_unknown"
                assert gone.value.journal is not None
                assert gone.value.journal.steps_applied == 1  # counted (resume keeps none)
                with pytest.raises(envlink.SessionLostError):
                    await env.step({"move": 1})
            else:
                result = await env.step({"move": 1})
                assert (result.observation["position"], result.observation["step"]) == (2, 2)
                assert env.recovery == "openenv-resume"  # the rebuilt session is detached too
        finally:
            await env.close()
