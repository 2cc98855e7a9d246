"""session_store: extension sessions survive a SIGKILL of the server process."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed

from envlink._sansio.protocol import RESUMED_HEADER
from envlink.server import DeterministicEnvironment, EnvServer
from envlink.server._store import SessionStore

from ._server_support import RESET, STATE, ServeProcess, open_ws, rpc, step, token_of

pytestmark = pytest.mark.timeout(20)


async def test_resume_after_kill_9_and_restart(tmp_path: Path) -> None:
    """After kill -9 and a restart on the same port and store, the session resumes exactly-once."""
    store = str(tmp_path / "store")
    common = ["--env", "deterministic", "--session-store", store]
    reference = DeterministicEnvironment()
    reference.reset(seed=5, max_steps=10)
    with ServeProcess("--port", "0", "--drop-after", "3", "--drop-mode", "after_apply",
                      *common) as first:
        port = first.port
        async with open_ws(first, extensions=True) as ws:
            token = token_of(ws)
            await rpc(ws, {"type": "reset", "data": {"seed": 5, "max_steps": 10}, "id": "r"})
            await rpc(ws, step({"move": 1}, id="s1"))
            # The third request is applied and persisted, but its answer is never sent.
            await ws.send(json.dumps(step({"move": 2}, id="s2")))
            with pytest.raises(ConnectionClosed):
                await ws.recv()
        first.kill9()
    with ServeProcess("--port", str(port), *common) as second:
        assert second.port == port
        async with open_ws(second, extensions=True, resume=token) as ws:
            assert ws.response is not None
            assert ws.response.headers[RESUMED_HEADER] == "1"
            assert token_of(ws) == token
            cached = await rpc(ws, step({"move": 2}, id="s2"))
            state = await rpc(ws, {**STATE, "id": "st"})
            nxt = await rpc(ws, step({"move": 3}, id="s3"))
    reference.step({"move": 1})
    expected_s2 = reference.step({"move": 2}).to_wire()
    expected_s3 = reference.step({"move": 3}).to_wire()
    assert cached == {"type": "observation", "data": expected_s2, "id": "s2"}
    assert state["data"]["step_count"] == 2  # s2 was not applied twice
    assert nxt["data"] == expected_s3


async def test_store_loaded_in_process(tmp_path: Path) -> None:
    """A new EnvServer on the same store resumes sessions persisted by a stopped one."""
    async with EnvServer(env="deterministic", session_store=tmp_path, ping_interval=None) as a, \
            open_ws(a, extensions=True) as ws:
        token = token_of(ws)
        await rpc(ws, {"type": "reset", "data": {"seed": 1}})
        await rpc(ws, step({"move": 4}))
    assert _records(tmp_path)
    async with EnvServer(env="deterministic", session_store=tmp_path, ping_interval=None) as b:
        assert b.counter("session.loaded") == 1
        async with open_ws(b, extensions=True, resume=token) as ws:
            assert ws.response is not None
            assert ws.response.headers[RESUMED_HEADER] == "1"
            assert (await rpc(ws, STATE))["data"]["position"] == 4
            await ws.send(json.dumps({"type": "close"}))
        await b.wait_for("session.destroyed", 1)
    assert not _records(tmp_path)


async def test_expired_records_are_dropped(tmp_path: Path) -> None:
    """Records whose grace window ended while the server was down are not loaded."""
    async with EnvServer(session_store=tmp_path, resume_grace=0.0, ping_interval=None) as a:
        async with open_ws(a, extensions=True) as ws:
            await rpc(ws, RESET)
        await a.wait_for("session.expired", 1)
    async with EnvServer(session_store=tmp_path, ping_interval=None) as b:
        assert b.counter("session.loaded") == 0
        assert b.sessions() == []


async def test_crash_loop_does_not_renew_an_abandoned_sessions_grace(tmp_path: Path) -> None:
    """A session attached when the process died gets one persisted deadline, not one per restart."""
    # A server that is never stopped cleanly while its client is attached stands for
    # a process killed with SIGKILL: its record on disk has no deadline.
    async with EnvServer(env="deterministic", session_store=tmp_path,
                         ping_interval=None) as crashed, open_ws(crashed, extensions=True) as ws:
        token = token_of(ws)
        await rpc(ws, {"type": "reset", "data": {"seed": 3}})
        # First restart: the abandoned session gets one 5 s window...
        async with EnvServer(env="deterministic", session_store=tmp_path, resume_grace=5.0,
                             ping_interval=None) as first:
            [loaded] = first.sessions()
            assert loaded.expires_in is not None and loaded.expires_in <= 5.0
        # ...and a second restart (with a longer grace) keeps that absolute deadline.
        async with EnvServer(env="deterministic", session_store=tmp_path, resume_grace=1000.0,
                             ping_interval=None) as second:
            [again] = second.sessions()
            assert again.id == loaded.id
            assert again.expires_in is not None and again.expires_in <= 5.0
            # A client that re-attaches is live again: the next crash gives a new window.
            async with open_ws(second, extensions=True, resume=token) as resumed:
                assert resumed.response is not None
                assert resumed.response.headers[RESUMED_HEADER] == "1"
                async with EnvServer(env="deterministic", session_store=tmp_path,
                                     resume_grace=1000.0, ping_interval=None) as third:
                    [renewed] = third.sessions()
                    assert renewed.expires_in is not None and renewed.expires_in > 900.0


async def test_a_server_that_cannot_listen_lets_go_of_the_sessions_it_loaded(
        tmp_path: Path) -> None:
    """`async with EnvServer(...)` on a port in use: start() raises, and the sessions it had
    loaded from the store are let go (their grace timers cancelled, their environments
    closed); their records stay on disk for a server that does start."""
    async with EnvServer(env="deterministic", session_store=tmp_path,
                         ping_interval=None) as running, open_ws(running, extensions=True) as ws:
        await rpc(ws, {"type": "reset", "data": {"seed": 3}})
        blocked = EnvServer(env="deterministic", session_store=tmp_path, port=running.port,
                            ping_interval=None)
        with pytest.raises(OSError, match=str(running.port)):
            async with blocked:
                raise AssertionError("listened on a port in use")
        assert blocked.sessions() == []
        assert _records(tmp_path)
        async with EnvServer(env="deterministic", session_store=tmp_path,
                             ping_interval=None) as other:
            assert len(other.sessions()) == 1


async def test_plain_sessions_and_snapshotless_envs_not_persisted(tmp_path: Path) -> None:
    """Plain sessions, and environments without snapshot(), leave nothing on disk."""
    class NoSnapshot:
        def reset(self) -> object:
            from envlink.server import StepResult
            return StepResult({})

        def step(self, action: dict[str, object]) -> object:
            raise NotImplementedError

        def state(self) -> dict[str, object]:
            return {"episode_id": None, "step_count": 0}

    async with EnvServer(session_store=tmp_path, ping_interval=None) as srv, open_ws(srv) as ws:
        await rpc(ws, RESET)
        assert not _records(tmp_path)
    async with EnvServer(env=NoSnapshot, session_store=tmp_path,  # type: ignore[arg-type]
                         ping_interval=None) as srv, open_ws(srv, extensions=True) as ws:
        assert (await rpc(ws, RESET))["type"] == "observation"
        assert not _records(tmp_path)


def _records(directory: Path) -> list[str]:
    return [name for name in os.listdir(directory) if name.endswith(".json")]


def test_load_skips_and_removes_crash_leftovers(tmp_path: Path) -> None:
    """A temp file left by a crash mid-save is never loaded as a session, and is removed."""
    store = SessionStore(tmp_path)
    (tmp_path / ".tmp-abc.json").write_text('{"version": 1, "token": "t"}')
    (tmp_path / ".tmp-torn.json").write_text('{"vers')
    assert store.load() == []
    assert list(tmp_path.iterdir()) == []
