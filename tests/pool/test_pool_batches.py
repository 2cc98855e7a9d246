"""EnvPool batch semantics: masks, autoreset modes, ready-first, deadlines, bad input."""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Callable
from typing import Any

import pytest

from envlink import (
    CallTimeoutError,
    ClientClosedError,
    EnvPool,
    ServerError,
    SessionLostError,
    StepResult,
)
from envlink.server import EnvServer

from .conftest import solo_run

pytestmark = pytest.mark.timeout(30)


def _obs(batch: Any) -> list[Any]:
    return [r.observation if isinstance(r, StepResult) else r for r in batch]


async def test_masked_out_slots_answer_none_and_keep_their_state(
        det_servers: Callable[..., Any]) -> None:
    """A masked-out slot answers None and is not stepped: it later continues where it was."""
    srv = await det_servers()
    async with EnvPool(srv.url, 3) as pool:
        await pool.reset(seeds=[7, 8, 9])
        batch = await pool.step([{"move": 1}, {"move": 1}, None], mask=[True, True, False])
        assert batch[2] is None and batch.ready == (0, 1)
        batch = await pool.step([{"move": 2}] * 3)
        third = batch[2]
        assert isinstance(third, StepResult)
    want = await solo_run(srv.url, {"seed": 9}, [{"move": 2}])
    assert third.observation == want[1]


async def test_reset_with_a_mask_resets_only_those_slots(det_servers: Callable[..., Any]) -> None:
    """reset(mask=...) starts a new episode in the masked slots only."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2) as pool:
        await pool.reset(seeds=[1, 2])
        await pool.step([{"move": 5}] * 2)
        batch = await pool.reset(seeds=[3, None], mask=[True, False])
        assert batch[1] is None
        first = batch[0]
        assert isinstance(first, StepResult)
        assert first.observation["step"] == 0
        after = await pool.step([{"move": 1}] * 2)
        assert _obs(after)[1]["step"] == 2  # slot 1 kept its episode


async def _episode_of_two(pool: EnvPool[Any, Any]) -> tuple[Any, Any]:
    reset = await pool.reset(seeds=[4, 5], max_steps=2)
    await pool.step([{"move": 1}] * 2)
    return reset, await pool.step([{"move": 1}] * 2)


async def test_next_step_autoreset(det_servers: Callable[..., Any]) -> None:
    """next_step: the done step shows the last observation; the next step returns the reset one."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2, autoreset="next_step") as pool:
        _, done = await _episode_of_two(pool)
        assert [r.done for r in done.results()] == [True, True]
        assert [o["step"] for o in _obs(done)] == [2, 2]
        assert done.autoreset == ()
        again = await pool.step([{"move": 9}] * 2)  # actions ignored
        assert again.autoreset == (0, 1)
        for r in again.results():
            assert (r.reward, r.done) == (0.0, False)
        # The reset used the slot's kwargs without the seed, as gymnasium does.
        want = await solo_run(srv.url, {"max_steps": 2}, [])
        assert _obs(again) == [want[0], want[0]]
        after = await pool.step([{"move": 1}] * 2)
        assert [o["step"] for o in _obs(after)] == [1, 1]


async def test_same_step_autoreset(det_servers: Callable[..., Any]) -> None:
    """same_step: the done step returns the reset observation; the terminal one is in final."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2, autoreset="same_step",
                       autoreset_kwargs=lambda slot, n: {"seed": 100 * slot + n,
                                                         "max_steps": 2}) as pool:
        _, done = await _episode_of_two(pool)
        assert done.autoreset == (0, 1)
        for i, r in enumerate(done.results()):
            terminal = done.final[i]
            assert r.done and terminal.done
            assert r.reward == terminal.reward
            assert terminal.observation["step"] == 2
            want = await solo_run(srv.url, {"seed": 100 * i + 1, "max_steps": 2}, [])
            assert r.observation == want[0]
        after = await pool.step([{"move": 1}] * 2)
        assert [o["step"] for o in _obs(after)] == [1, 1]


async def test_disabled_autoreset_passes_the_servers_answer(
        det_servers: Callable[..., Any]) -> None:
    """disabled: stepping a finished episode gives that slot the server's error."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2, autoreset="disabled") as pool:
        _, done = await _episode_of_two(pool)
        assert done.autoreset == ()
        over = await pool.step([{"move": 1}] * 2)
        assert all(isinstance(e, ServerError) for e in over)
        assert (await pool.reset(seeds=0)).ok


async def _stall_slot(srv: EnvServer, pool: EnvPool[Any, Any], index: int) -> Any:
    sid = pool.clients()[index].session_id  # type: ignore[union-attr]
    (handle,) = [h for h in srv.connections if h.session_id == sid]
    handle.stall()
    return handle


async def test_min_ready_returns_early_and_reports_stragglers(
        det_servers: Callable[..., Any]) -> None:
    """step_recv(min_ready) returns once that many answered; a later call collects the rest."""
    srv = await det_servers()
    async with EnvPool(srv.url, 3) as pool:
        await pool.reset(seeds=0)
        handle = await _stall_slot(srv, pool, 2)
        await pool.step_send([{"move": 1}] * 3)
        first = await pool.step_recv(min_ready=2)
        assert first.ready == (0, 1) and first.stragglers == (2,)
        assert first[2] is None
        with pytest.raises(ValueError, match="in flight"):
            await pool.step([{"move": 1}] * 3)
        handle.unstall()
        rest = await pool.step_recv()
        assert rest.ready == (2,) and rest.stragglers == ()
        assert _obs(rest)[2]["step"] == 1


async def test_a_callers_bug_in_step_recv_leaves_no_stale_autoreset(
        det_servers: Callable[..., Any]) -> None:
    """A step_recv that raises a caller's bug still settles the slots it collected: a
    slot's pending autoreset is not reported again by its next step."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2) as pool:
        await pool.reset(seeds=0, max_steps=1)
        assert all(r.done for r in (await pool.step([{"move": 1}] * 2)).results())
        await pool.reset(seeds=0, mask=[False, True])
        await pool.step_send([{"move": 1}, 3])  # slot 0 autoresets; 3 is no action
        with pytest.raises(TypeError, match="action must be"):
            await pool.step_recv()
        await pool.step_send([{"move": 1}, None], mask=[True, False])
        batch = await pool.step_recv()
        assert batch.ready == (0,) and batch.autoreset == ()
        first: dict[int, Exception] = {}
        await pool.step_send([None, 3], mask=[False, True])
        answer = await pool.step_recv_first(bugs=first)
        assert answer.ready == (1,) and answer[1] is None
        assert set(first) == {1} and isinstance(first[1], TypeError)
        assert (await pool.step([{"move": 1}] * 2)).ok


async def test_recv_timeout_returns_what_is_ready(det_servers: Callable[..., Any]) -> None:
    """A step_recv timeout returns the answers so far; the straggler stays in flight."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2) as pool:
        await pool.reset(seeds=0)
        handle = await _stall_slot(srv, pool, 1)
        await pool.step_send([{"move": 1}] * 2)
        batch = await pool.step_recv(timeout=0.2)
        assert batch.ready == (0,) and batch.stragglers == (1,)
        handle.unstall()
        assert (await pool.step_recv()).ready == (1,)


async def test_the_batch_deadline_fails_only_the_late_slot(
        det_servers: Callable[..., Any]) -> None:
    """A slot not done by the batch deadline answers CallTimeoutError; the others succeed."""
    srv = await det_servers()
    async with EnvPool(srv.url, 3) as pool:
        await pool.reset(seeds=0)
        await _stall_slot(srv, pool, 1)
        batch = await pool.step([{"move": 1}] * 3, timeout=0.3)
        assert isinstance(batch[1], CallTimeoutError)
        assert sorted(batch.errors) == [1]
        with pytest.raises(CallTimeoutError):
            batch.results()


async def test_a_slot_can_be_reset_on_its_own(det_servers: Callable[..., Any]) -> None:
    """reset_at resets one slot and returns its result; a slot never reset answers an error."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2) as pool:
        first = await pool.step([{"move": 1}] * 2)
        assert all(isinstance(e, SessionLostError) for e in first)
        result = await pool.reset_at(1, seed=3)
        assert result.observation == (await solo_run(srv.url, {"seed": 3}, []))[0]
        batch = await pool.step([{"move": 1}] * 2)
        assert isinstance(batch[0], SessionLostError)
        assert isinstance(batch[1], StepResult)
        with pytest.raises(IndexError):
            await pool.reset_at(2)


async def test_bad_input_is_a_clear_error(det_servers: Callable[..., Any]) -> None:
    """Wrong sizes, masks, seeds and options raise ValueError/TypeError; closed pools refuse."""
    srv = await det_servers()
    for bad, message in (({"size": 0}, "size"), ({"size": True}, "size"),
                         ({"autoreset": "always"}, "autoreset"),
                         ({"on_session_lost": "retry"}, "on_session_lost"),
                         ({"batch_timeout": 0}, "batch_timeout"),
                         ({"client_options": {"on_session_lost": "replay"}}, "EnvPool")):
        kwargs = {"size": 1, **bad}
        with pytest.raises(ValueError, match=message):
            EnvPool(srv.url, **kwargs)
    for endpoints, message in (([], "at least one"), (["ftp://x"], "http"),
                               ([srv.url, srv.url], "twice")):
        with pytest.raises(ValueError, match=message):
            EnvPool(endpoints, 1)
    with pytest.raises(TypeError):
        EnvPool(srv.url, 1, client=dict)  # type: ignore[arg-type]
    pool: EnvPool[Any, Any] = EnvPool(srv.url, 2)
    with pytest.raises(ValueError, match="actions"):
        await pool.step([{"move": 1}])
    with pytest.raises(ValueError, match="mask"):
        await pool.step([{"move": 1}] * 2, mask=[True])
    with pytest.raises(ValueError, match="seeds"):
        await pool.reset(seeds=[1])
    with pytest.raises(ValueError, match="no step in flight"):
        await pool.step_recv(min_ready=1)
    nothing = await pool.step_recv()
    assert list(nothing) == [None, None] and nothing.ready == ()
    with pytest.raises(ValueError, match="timeout"):
        await pool.step([{"move": 1}] * 2, timeout=-1)
    await pool.close()
    with pytest.raises(ClientClosedError):
        await pool.reset()


async def test_close_cancels_steps_in_flight(det_servers: Callable[..., Any]) -> None:
    """close() cancels a stalled step and closes every session on the server."""
    srv = await det_servers()
    pool: EnvPool[Any, Any] = EnvPool(srv.url, 2)
    await pool.reset(seeds=0)
    handle = await _stall_slot(srv, pool, 0)
    await pool.step_send([{"move": 1}] * 2)
    clients = pool.clients()
    await asyncio.wait_for(pool.close(), 10)
    assert pool.closed
    assert all(c is not None and c.closed for c in clients)
    assert pool.view().slots == ("empty", "empty")
    # The stalled server handler notices the closed connection once it runs again.
    handle.unstall()
    await asyncio.wait_for(srv.wait_for_disconnect(2), 10)


@pytest.mark.parametrize("max_inflight", [None, 1])
async def test_close_right_after_a_send_leaves_no_call_never_awaited(
        det_servers: Callable[..., Any], max_inflight: int | None) -> None:
    """Steps sent and the pool closed before any of them ran (with or without an
    in-flight window): no coroutine is left never awaited (no RuntimeWarning)."""
    srv = await det_servers()
    pool: EnvPool[Any, Any] = EnvPool(srv.url, 3, max_inflight=max_inflight)
    await pool.reset(seeds=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        await pool.step_send([{"move": 1}] * 3)
        await pool.close()  # at once: no loop iteration lets the steps start first
        gc.collect()
    assert pool.closed
    never = [str(w.message) for w in seen if "never awaited" in str(w.message)]
    assert never == []


async def test_max_inflight_bounds_the_calls_running_at_once(
        det_servers: Callable[..., Any]) -> None:
    """With a window of one, a stalled call holds back the next, which is never sent."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2, max_inflight=1) as pool:
        assert (await pool.reset(seeds=0)).ok
        await _stall_slot(srv, pool, 0)
        applied = srv.steps_applied
        batch = await pool.step([{"move": 1}] * 2, timeout=0.3)
        assert all(isinstance(e, CallTimeoutError) for e in batch)
        assert srv.steps_applied == applied
    with pytest.raises(ValueError, match="max_inflight"):
        EnvPool(srv.url, 1, max_inflight=0)


async def test_a_step_cut_by_the_batch_deadline_says_whether_it_was_sent(
        det_servers: Callable[..., Any]) -> None:
    """Sent then cut: outcome_unknown=True, kept in unknown_steps; never sent: False."""
    srv = await det_servers()
    async with EnvPool(srv.url, 2, max_inflight=1) as pool:
        assert (await pool.reset(seeds=0)).ok
        clients = pool.clients()
        # Slot 0 answers; slot 1's step is written to a connection the server no
        # longer reads: sent, its outcome unknown.
        await _stall_slot(srv, pool, 1)
        first = await pool.step([{"move": 1}] * 2, timeout=1.0)
        assert isinstance(first[0], StepResult)
        cut = first[1]
        assert isinstance(cut, CallTimeoutError)
        assert cut.outcome_unknown is True and cut.method == "step"
        assert "was sent" in str(cut)
        assert clients[1].journal.unknown_steps == ['{"move":1}']  # type: ignore[union-attr]
        # Slot 0's step is sent and held (a long deadline: it keeps the window of one);
        # slot 1's, sent behind it with a short deadline, never gets out: False,
        # although its journal still holds the earlier step of unknown outcome.
        held = await _stall_slot(srv, pool, 0)
        applied = srv.steps_applied
        await pool.step_send([{"move": 1}, None], mask=[True, False], timeout=20)
        await pool.step_send([None, {"move": 1}], mask=[False, True], timeout=0.3)
        second = await pool.step_recv(min_ready=1)
        assert second.ready == (1,) and second.stragglers == (0,)
        unsent = second[1]
        assert isinstance(unsent, CallTimeoutError) and unsent.outcome_unknown is False
        assert "was sent" not in str(unsent)
        assert clients[1].journal.unknown_steps == ['{"move":1}']  # type: ignore[union-attr]
        assert srv.steps_applied == applied
        held.unstall()
        assert isinstance((await pool.step_recv())[0], StepResult)


async def test_a_window_gives_the_same_results(det_servers: Callable[..., Any]) -> None:
    """A window smaller than the batch changes nothing in the answers."""
    srv = await det_servers()
    async with EnvPool(srv.url, 5, max_inflight=2) as pool:
        await pool.reset(seeds=20)
        batch = await pool.step([{"move": i} for i in range(5)])
    for i, r in enumerate(batch.results()):
        assert r.observation == (await solo_run(srv.url, {"seed": 20 + i}, [{"move": i}]))[1]


async def test_one_batch_call_at_a_time_per_slot(det_servers: Callable[..., Any]) -> None:
    """A second batch on slots still running is refused; closing ends the first cleanly."""
    srv = await det_servers()
    pool: EnvPool[Any, Any] = EnvPool(srv.url, 2)
    await pool.reset(seeds=0)
    sid = pool.clients()[1].session_id  # type: ignore[union-attr]
    (handle,) = [h for h in srv.connections if h.session_id == sid]
    handle.faults.stall_after = handle.requests + 1  # its next request stalls on arrival
    running = asyncio.ensure_future(pool.step([{"move": 1}] * 2))
    await srv.wait_for("stall")
    with pytest.raises(ValueError, match="in flight"):
        await pool.step([{"move": 1}] * 2)
    await pool.close()
    batch = await asyncio.wait_for(running, 10)
    assert isinstance(batch[1], ClientClosedError)
    assert isinstance(batch[0], (StepResult, ClientClosedError))  # it may have answered
    handle.unstall()
