"""A server dies mid-run: replay rebuilds its sessions elsewhere, raise reports them per slot."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from structlog.testing import capture_logs

from envlink import (
    ConnectionLostError,
    EnvPool,
    GenericEnvClient,
    ReplayDivergedError,
    ServerError,
    SessionLostError,
    StepResult,
)
from envlink import server as envlink_server

from .._processes import ServerProcess
from .conftest import solo_run

pytestmark = pytest.mark.timeout(60)

SIZE = 4
MOVES = [2, -1, 4, 3, 1]


def _actions(step: int) -> list[dict[str, int]]:
    return [{"move": MOVES[step] + i} for i in range(SIZE)]


async def _fault_free(url: str) -> list[list[dict[str, Any]]]:
    return [await solo_run(url, {"seed": 30 + i, "max_steps": 50},
                           [_actions(k)[i] for k in range(len(MOVES))]) for i in range(SIZE)]


class MoveClient(GenericEnvClient):
    """A typed client: actions are ints, turned into payloads by its own hook."""

    def _step_payload(self, action: Any) -> dict[str, Any]:
        return {"move": int(action)}


@pytest.mark.parametrize("typed", [False, True])
async def test_replay_rebuilds_a_stopped_servers_sessions_elsewhere(
        det_servers: Callable[..., Any], typed: bool) -> None:
    """Sessions of a stopped server are replayed on the other, observations as fault-free."""
    a = await det_servers()
    b = await det_servers()
    got: list[list[dict[str, Any]]] = [[] for _ in range(SIZE)]
    client: Any = MoveClient if typed else GenericEnvClient
    async with EnvPool([a.url, b.url], SIZE, on_session_lost="replay", client=client,
                       breaker_threshold=1, breaker_reset_timeout=60) as pool:
        for i, r in enumerate((await pool.reset(seeds=30, max_steps=50)).results()):
            got[i].append(r.observation)
        on_a = [i for i, url in enumerate(pool.view().slot_endpoints) if url == a.url]
        assert len(on_a) == SIZE // 2
        for k in range(len(MOVES)):
            if k == 2:
                await a.stop()
            actions = [act["move"] for act in _actions(k)] if typed else _actions(k)
            for i, r in enumerate((await pool.step(actions)).results()):
                got[i].append(r.observation)
        view = pool.view()
        assert set(view.slot_endpoints) == {b.url}
        assert view.endpoints[0].breaker == "open"
        assert view.endpoints[1].sessions == SIZE
    assert got == await _fault_free(b.url)


async def test_a_stopped_servers_sessions_log_what_became_of_them(
        det_servers: Callable[..., Any]) -> None:
    """Replayed elsewhere: one info line per session naming the mechanism and the cause,
    and no session_lost warning. Under raise: one warning per lost session with its
    real policy and cause, and the error's __cause__ is the connection's error."""
    a = await det_servers()
    b = await det_servers()
    async with EnvPool([a.url, b.url], SIZE, on_session_lost="replay", breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        await pool.reset(seeds=30, max_steps=50)
        await pool.step(_actions(0))
        on_a = [i for i, url in enumerate(pool.view().slot_endpoints) if url == a.url]
        await a.stop()
        with capture_logs() as logs:
            assert (await pool.step(_actions(1))).ok
    warnings = [e for e in logs if e["log_level"] == "warning"
                and e["event"] == "envlink.session_lost"]
    assert warnings == [], warnings
    moved = [e for e in logs if e["event"] == "envlink.pool.session_moved"]
    assert sorted(e["slot"] for e in moved) == on_a
    assert all(e["log_level"] == "info" and e["recovery"] == "replay"
               and "1001" in e["error"] for e in moved), moved

    c = await det_servers()
    d = await det_servers()
    async with EnvPool([c.url, d.url], SIZE, breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        await pool.reset(seeds=30, max_steps=50)
        on_c = {i for i, url in enumerate(pool.view().slot_endpoints) if url == c.url}
        await c.stop()
        with capture_logs() as logs:
            batch = await pool.step(_actions(0))
    assert set(batch.errors) == on_c
    for error in batch.errors.values():
        assert isinstance(error.__cause__, ConnectionLostError), error.__cause__
    lost = [e for e in logs if e["event"] == "envlink.session_lost"]
    assert len(lost) == len(on_c)
    assert all(e["log_level"] == "warning" and e["policy"] == "raise"
               and e["error"] and "1001" in e["error"] for e in lost), lost


async def test_raise_gives_per_slot_session_lost(det_servers: Callable[..., Any]) -> None:
    """Under raise, only the dead server's slots answer SessionLostError (with the journal:
    the reset and the steps counted, none kept); reset moves them."""
    a = await det_servers()
    b = await det_servers()
    async with EnvPool([a.url, b.url], SIZE, breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        await pool.reset(seeds=30, max_steps=50)
        on_a = {i for i, url in enumerate(pool.view().slot_endpoints) if url == a.url}
        await a.stop()
        batch = await pool.step(_actions(0))
        assert set(batch.errors) == on_a
        for error in batch.errors.values():
            assert isinstance(error, SessionLostError)
            assert error.journal is not None
            assert error.journal.reset_kwargs["max_steps"] == 50
            assert (error.journal.entries, error.journal.replayable) == ([], False)
        view = pool.view()
        assert [view.slots[i] for i in sorted(on_a)] == ["lost"] * len(on_a)
        assert view.endpoints[0].states == {"lost": len(on_a)}
        again = await pool.reset(seeds=30, max_steps=50, mask=[i in on_a for i in range(SIZE)])
        assert sorted(again.ready) == sorted(on_a) and again.ok
        assert set(pool.view().slot_endpoints) == {b.url}


async def test_replay_that_diverges_is_reported(det_servers: Callable[..., Any]) -> None:
    """A replayed answer that differs from the recorded one gives ReplayDivergedError."""
    a = await det_servers()
    b = await det_servers()
    async with EnvPool([a.url, b.url], 2, on_session_lost="replay",
                       replay_verify=lambda recorded, actual: False) as pool:
        await pool.reset(seeds=0)
        await a.stop()
        batch = await pool.step([{"move": 1}] * 2)
        (error,) = batch.errors.values()
        assert isinstance(error, ReplayDivergedError)
        assert pool.view().slots.count("lost") == 1


async def test_replay_refused_by_the_new_endpoint_is_session_lost_not_divergence(
        det_servers: Callable[..., Any]) -> None:
    """A replayed step the new endpoint answers with an error frame is SessionLostError
    caused by the ServerError (as in the client's own replay), not ReplayDivergedError."""
    refuse = False

    class Refusing:
        def __init__(self) -> None:
            self.n = 0

        def reset(self, **kwargs: Any) -> envlink_server.StepResult:
            self.n = 0
            return envlink_server.StepResult(observation={"n": 0})

        def step(self, action: dict[str, Any]) -> envlink_server.StepResult:
            if refuse:
                raise RuntimeError("this environment cannot take the step again")
            self.n += 1
            return envlink_server.StepResult(observation={"n": self.n})

        def state(self) -> dict[str, Any]:
            return {"step_count": self.n}

    servers = [await det_servers(env=Refusing), await det_servers(env=Refusing)]
    async with EnvPool([s.url for s in servers], 1, on_session_lost="replay",
                       breaker_threshold=1, breaker_reset_timeout=60) as pool:
        await pool.reset(seeds=0)
        await pool.step([{}])
        (holder,) = [s for s in servers if s.url == pool.view().slot_endpoints[0]]
        refuse = True
        await holder.stop()
        batch = await pool.step([{}])
        (error,) = batch.errors.values()
        assert isinstance(error, SessionLostError), error
        assert not isinstance(error, ReplayDivergedError), error
        assert isinstance(error.__cause__, ServerError), repr(error.__cause__)
        assert "replay of step 0 failed on the server" in str(error)
        assert error.journal is not None and error.journal.step_count == 1
        assert pool.view().slots == ("lost",)


async def test_kill_9_mid_step_replays_on_the_others(
        processes: Callable[..., ServerProcess]) -> None:
    """kill -9 of a server process while a step is on the wire: replay gives fault-free results."""
    # On the victim, the 4th request of a connection (its 3rd step) stalls, and the
    # server announces it: the kill lands while that step is in flight.
    victim = processes("--stall-after", "4", "--max-sessions", "2")
    others = [processes("--max-sessions", "4"), processes("--max-sessions", "4")]
    urls = [victim.url] + [p.url for p in others]
    got: list[list[dict[str, Any]]] = [[] for _ in range(SIZE)]
    async with EnvPool(urls, SIZE, on_session_lost="replay", breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        for i, r in enumerate((await pool.reset(seeds=30, max_steps=50)).results()):
            got[i].append(r.observation)
        assert victim.url in pool.view().slot_endpoints
        for k in range(len(MOVES)):
            await pool.step_send(_actions(k))
            if k == 2:
                await asyncio.wait_for(asyncio.to_thread(victim.wait_event, "stall"), 20)
                victim.kill()
            for i, r in enumerate((await pool.step_recv()).results()):
                assert isinstance(r, StepResult)
                got[i].append(r.observation)
        view = pool.view()
        assert victim.url not in view.slot_endpoints
        assert view.endpoints[0].breaker == "open"
    assert got == await _fault_free(others[0].url)


async def test_kill_9_under_raise_gives_per_slot_errors(
        processes: Callable[..., ServerProcess]) -> None:
    """kill -9 mid-step under raise: the victim's slots answer SessionLostError, others go on."""
    victim = processes("--stall-after", "3", "--max-sessions", "2")
    other = processes("--max-sessions", "8")
    async with EnvPool([victim.url, other.url], SIZE, breaker_threshold=1,
                       breaker_reset_timeout=60) as pool:
        await pool.reset(seeds=30, max_steps=50)
        on_victim = {i for i, u in enumerate(pool.view().slot_endpoints) if u == victim.url}
        assert on_victim
        await pool.step(_actions(0))
        await pool.step_send(_actions(1))
        await asyncio.wait_for(asyncio.to_thread(victim.wait_event, "stall"), 20)
        victim.kill()
        batch = await pool.step_recv()
        # The stalled step is lost; the victim's other step may have been answered first.
        assert batch.errors and set(batch.errors) <= on_victim
        assert all(isinstance(e, SessionLostError) for e in batch.errors.values())
        for i in set(range(SIZE)) - on_victim:
            r = batch[i]
            assert isinstance(r, StepResult)
            want = await solo_run(other.url, {"seed": 30 + i, "max_steps": 50},
                                  [_actions(0)[i], _actions(1)[i]])
            assert r.observation == want[2]
        # Every session of the dead server is lost by the next step; the rest go on.
        after = await pool.step(_actions(2))
        assert set(after.errors) == on_victim
        assert set(pool.view().slots) == {"active", "lost"}


async def test_resume_keeps_the_session_on_its_server(det_servers: Callable[..., Any]) -> None:
    """Under resume, a dropped connection re-attaches to the same server-side session."""
    srv = await det_servers()
    async with EnvPool(srv.url, SIZE, on_session_lost="resume") as pool:
        await pool.reset(seeds=30, max_steps=50)
        sid = pool.clients()[0].session_id  # type: ignore[union-attr]
        (handle,) = [h for h in srv.connections if h.session_id == sid]
        handle.faults.drop_after = handle.requests + 1
        batch = await pool.step(_actions(0))
        assert batch.ok
        assert srv.resumes == 1
        assert pool.clients()[0].session_id == sid  # type: ignore[union-attr]
    for i, r in enumerate(batch.results()):
        want = await solo_run(srv.url, {"seed": 30 + i, "max_steps": 50}, [_actions(0)[i]])
        assert r.observation == want[1]
