"""The shard body of envlink.ray, without Ray: mirrored journals rebuild an episode elsewhere."""

from __future__ import annotations

import asyncio
import importlib.util
import pickle
import threading
from dataclasses import replace
from typing import Any

import pytest

from envlink import ClientClosedError, GenericEnvClient, ReplayDivergedError, StepResult
from envlink._pool import DriverSlot, PoolOptions, Shard, ShardSpec, SlotRestore

pytestmark = pytest.mark.timeout(30)


def _spec(url: str, size: int, **options: Any) -> ShardSpec:
    # Under the pool's replay its sessions' journals keep every step.
    options.setdefault("on_session_lost", "replay")
    return ShardSpec(shard=0, offset=10, options=PoolOptions((url,), size, **options))


async def test_mirrors_are_deltas_and_rebuild_the_episode(det_servers: Any) -> None:
    """Answers carry journal deltas; the driver's copy replays the episode on another shard."""
    server = await det_servers()
    first, second = Shard(_spec(server.url, 2)), Shard(_spec(server.url, 2))
    kept = [DriverSlot(), DriverSlot()]
    try:
        answer = await first.reset([0, 1], [True, True], None, {"max_steps": 20})
        assert answer.mirrors[0].head is not None and answer.mirrors[0].entries == ()
        for mirror_slot, m in answer.mirrors.items():
            kept[mirror_slot].absorb(m)
        for move in (1, 2, -1):
            answer = await first.step([{"move": move}] * 2, [True, True], None)
            delta = answer.mirrors[1]
            assert delta.head is None and len(delta.entries) == 1
            for mirror_slot, m in answer.mirrors.items():
                kept[mirror_slot].absorb(m)
        journal = kept[1].journal
        assert journal is not None and journal.step_count == 3 and journal.replayable
        assert journal.reset_kwargs == {"seed": 1, "max_steps": 20}
        restored = await second.restore({i: kept[i].restore(replay=True) for i in range(2)})
        assert restored == {0: None, 1: None}
        expected = await first.step([{"move": 1}] * 2, [True, True], None)
        got = await second.step([{"move": 1}] * 2, [True, True], None)
        assert all(isinstance(r, StepResult) for r in got.items)
        assert [r.observation for r in got.items] == [r.observation for r in expected.items]
        # A new episode on the new shard is mirrored whole again.
        assert got.mirrors[0].head is not None and len(got.mirrors[0].entries) == 4
    finally:
        await first.close()
        await second.close()


async def test_restore_refuses_a_journal_the_environment_contradicts(det_servers: Any) -> None:
    """A journal whose answers differ from the environment's gives ReplayDivergedError."""
    server = await det_servers()
    first, second = Shard(_spec(server.url, 1)), Shard(_spec(server.url, 1))
    slot = DriverSlot()
    try:
        slot.absorb((await first.reset([0], [True], None, {})).mirrors[0])
        slot.absorb((await first.step([{"move": 1}], [True], None)).mirrors[0])
        assert slot.journal is not None
        slot.journal.reset_kwargs = {"seed": 99}  # another episode than the one recorded
        outcome = await second.restore({0: slot.restore(replay=True)})
        assert isinstance(outcome[0], ReplayDivergedError)
        assert outcome[0].journal is not None and outcome[0].journal.step_count == 1
        flags_only = SlotRestore(journal=None, actions=None, needs_reset=True, episodes=3,
                                 reset_kwargs={"seed": 5})
        await second.restore({0: flags_only})
        record = second.pool.slot_record(0)
        assert record.needs_reset and record.episodes == 3
    finally:
        await first.close()
        await second.close()


def test_a_step_of_unknown_outcome_makes_the_copy_unreplayable() -> None:
    """A mirrored journal with a step of unknown outcome is not replayable on the driver."""
    from envlink import EpisodeJournal
    from envlink._pool.shard import SlotMirror

    head = EpisodeJournal(reset_kwargs={"seed": 0}, reset_response_json="{}", episode_id="e")
    slot = DriverSlot()
    slot.absorb(SlotMirror(episode_id="e", head=head))
    assert slot.journal is not None and slot.journal.replayable
    slot.absorb(SlotMirror(episode_id="e", base=0, unknown_steps=('{"move": 1}',)))
    assert not slot.journal.replayable and slot.journal.unknown_steps == ['{"move": 1}']
    assert slot.restore(replay=False).journal is None


async def test_a_waiting_recv_sees_steps_sent_while_it_waits(det_servers: Any) -> None:
    """A shard's step_recv, already waiting on a held step, returns a step sent after it."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2))
    waiting: asyncio.Future[Any] | None = None
    try:
        assert all(isinstance(r, StepResult)
                   for r in (await shard.reset([0, 1], [True, True], None, {})).items)
        client = shard.pool.clients()[0]
        assert client is not None
        (held,) = [h for h in server.connections if h.session_id == client.session_id]
        held.faults.stall_after = held.requests + 1  # slot 0's next step goes unanswered
        before = server.counter("request.step")
        await shard.step_send([{"move": 1}, None], [True, False], None)
        waiting = asyncio.ensure_future(shard.step_recv())
        # Slot 0's step is at the server and held there: the recv is waiting on it.
        await server.wait_for_request("step", before + 1)
        assert held.stalled and not waiting.done()
        await shard.step_send([None, {"move": 2}], [False, True], None)
        await asyncio.wait({waiting}, timeout=20)  # a bound: slot 1 answers at once
        assert waiting.done(), "the waiting recv did not see the step sent after it began"
        answer = waiting.result()
        assert answer.ready == (1,) and answer.stragglers == (0,)
        assert isinstance(answer.items[1], StepResult)
        assert answer.items[1].observation["position"] == 2
        assert set(answer.mirrors) == {1}
        held.unstall()
        rest = await shard.step_recv()
        assert rest.ready == (0,) and rest.stragglers == ()
        assert isinstance(rest.items[0], StepResult) and rest.items[0].observation["position"] == 1
        with pytest.raises(ValueError, match="no step in flight"):
            await shard.step_recv()
    finally:
        if waiting is not None and not waiting.done():
            waiting.cancel()
        await shard.close()


async def test_a_waiting_recv_answers_closed_when_the_pool_closes(det_servers: Any) -> None:
    """Closing a shard's pool under a waiting step_recv answers ClientClosedError per slot."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2))
    try:
        await shard.reset([0, 1], [True, True], None, {})
        for handle in server.connections:
            handle.faults.stall_after = handle.requests + 1  # no step answers
        before = server.counter("request.step")
        await shard.step_send([{"move": 1}] * 2, [True, True], None)
        waiting = asyncio.ensure_future(shard.step_recv())
        await server.wait_for_request("step", before + 2)
        assert not waiting.done()
        await shard.pool.close()
        answer = await waiting
        assert answer.ready == (0, 1)
        assert all(isinstance(r, ClientClosedError) for r in answer.items)
    finally:
        server.unstall_all()
        await shard.close()


async def test_a_callers_bug_in_a_recv_is_answered_for_its_slot(det_servers: Any) -> None:
    """A shard's step_recv answers a step's caller's bug in ``bugs`` for that slot (mirrored,
    out of flight) instead of raising it; the held slot stays in flight and answers later."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2))
    try:
        await shard.reset([0, 1], [True, True], None, {})
        client = shard.pool.clients()[0]
        assert client is not None
        (held,) = [h for h in server.connections if h.session_id == client.session_id]
        held.faults.stall_after = held.requests + 1  # slot 0's next step goes unanswered
        await shard.step_send([{"move": 1}, 3], [True, True], None)  # 3 is no action
        answer = await shard.step_recv()
        assert answer.ready == (1,) and answer.stragglers == (0,)
        assert answer.items[1] is None and set(answer.mirrors) == {1}
        assert set(answer.bugs) == {1} and isinstance(answer.bugs[1], TypeError)
        again = await shard.step([None, {"move": 2}], [False, True], None)
        assert isinstance(again.items[1], StepResult) and again.bugs == {}
        held.unstall()
        rest = await shard.step_recv()
        assert rest.ready == (0,) and rest.bugs == {}
        assert isinstance(rest.items[0], StepResult) and rest.items[0].observation["position"] == 1
    finally:
        server.unstall_all()
        await shard.close()


async def test_a_callers_bug_in_a_whole_batch_call_is_answered_with_every_mirror(
        det_servers: Any) -> None:
    """A shard's step or reset that raises a caller's bug answers it in ``raised``, with
    the mirror of every slot of the call (the other slot's step was applied and kept)."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2))
    kept = [DriverSlot(), DriverSlot()]
    try:
        for i, m in (await shard.reset([0, 1], [True, True], None, {})).mirrors.items():
            kept[i].absorb(m)
        answer = await shard.step([3, {"move": 1}], [True, True], None)  # 3 is no action
        assert isinstance(answer.raised, TypeError) and "action must be" in str(answer.raised)
        assert answer.ready == () and set(answer.mirrors) == {0, 1}
        assert len(answer.mirrors[1].entries) == 1 and answer.mirrors[0].entries == ()
        for i, m in answer.mirrors.items():
            kept[i].absorb(m)
        assert kept[1].journal is not None and kept[1].journal.step_count == 1
        assert kept[0].journal is not None and kept[0].journal.step_count == 0
        again = await shard.step([None, {"move": 2}], [False, True], None)
        assert again.raised is None and isinstance(again.items[1], StepResult)
        assert again.items[1].observation["position"] == 3
        refused = await shard.reset([0, 1], [True, True], -1.0, {})  # no such deadline
        assert isinstance(refused.raised, ValueError) and set(refused.mirrors) == {0, 1}
    finally:
        await shard.close()


class _TwoArgBug(Exception):
    """An exception that pickles but cannot be unpickled (its __init__ takes two args)."""

    def __init__(self, what: str, why: str) -> None:
        super().__init__(f"{what}: {why}")


class _BuggyPayload(GenericEnvClient):
    def _step_payload(self, action: Any) -> dict[str, Any]:
        if action == "bug":
            raise _TwoArgBug("payload", "a bug of the caller's client")
        return super()._step_payload(action)


async def test_a_bug_that_cannot_cross_to_the_driver_is_sent_as_its_text(
        det_servers: Any) -> None:
    """A caller's bug that would not unpickle on the driver is answered as a RuntimeError
    with its type and text, so that it never passes for a dead shard."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 1, client=_BuggyPayload))
    try:
        await shard.reset([0], [True], None, {})
        await shard.step_send(["bug"], [True], None)
        answer = await shard.step_recv()
        bug = answer.bugs[0]
        assert type(bug) is RuntimeError
        assert "_TwoArgBug: payload: a bug of the caller's client" in str(bug)
        assert pickle.loads(pickle.dumps(bug)).args == bug.args
        raised = (await shard.step(["bug"], [True], None)).raised  # a whole-batch step
        assert type(raised) is RuntimeError and "_TwoArgBug: payload" in str(raised)
        assert isinstance((await shard.step([{"move": 1}], [True], None)).items[0], StepResult)
    finally:
        await shard.close()


class _LockedObservation(GenericEnvClient):
    async def step(self, action: Any, **kwargs: Any) -> Any:
        result = await super().step(action, **kwargs)
        if action == {"move": 2}:
            return StepResult(observation={"lock": threading.Lock()}, reward=result.reward,
                              done=result.done)
        return result


async def test_a_result_that_cannot_cross_to_the_driver_is_answered_for_its_slot(
        det_servers: Any) -> None:
    """A collected step whose result would not pickle to the driver is answered in ``bugs``
    for that slot, naming the driver's slot number, with its mirror kept; the rest of the
    receive's answer crosses as it is."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2, client=_LockedObservation))
    try:
        await shard.reset([0, 1], [True, True], None, {})
        await shard.step_send([{"move": 1}, {"move": 2}], [True, True], None)
        answer = await shard.step_recv()
        while len(answer.ready) < 2:  # each receive returns once a step answered
            more = await shard.step_recv()
            answer = replace(more, ready=answer.ready + more.ready,
                             items=[a if a is not None else b
                                    for a, b in zip(answer.items, more.items, strict=True)],
                             mirrors={**answer.mirrors, **more.mirrors},
                             bugs={**answer.bugs, **more.bugs})
        assert set(answer.bugs) == {1} and type(answer.bugs[1]) is RuntimeError
        assert str(answer.bugs[1]).startswith("slot 11: its answer could not be sent")
        assert "_thread.lock" in str(answer.bugs[1])
        assert answer.items[1] is None and set(answer.mirrors) == {0, 1}
        assert answer.mirrors[1].steps_applied == 1  # the step was applied and mirrored
        assert isinstance(answer.items[0], StepResult)
        pickle.loads(pickle.dumps(answer))
    finally:
        await shard.close()


async def test_a_whole_batch_result_that_cannot_cross_is_raised_with_every_mirror(
        det_servers: Any) -> None:
    """A whole-batch step whose result would not pickle to the driver is raised by the call
    as a RuntimeError naming the driver's slot, every slot's mirror kept, the others'
    results answered; the shard goes on."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2, client=_LockedObservation))
    try:
        await shard.reset([0, 1], [True, True], None, {})
        answer = await shard.step([{"move": 1}, {"move": 2}], [True, True], None)
        assert type(answer.raised) is RuntimeError
        assert str(answer.raised).startswith("slot 11: its answer could not be sent")
        assert answer.items[1] is None and isinstance(answer.items[0], StepResult)
        assert set(answer.mirrors) == {0, 1} and answer.mirrors[1].steps_applied == 1
        arrived = pickle.loads(pickle.dumps(answer))
        assert str(arrived.raised) == str(answer.raised) and arrived.items[1] is None
        assert arrived.items[0] == answer.items[0]
        again = await shard.step([{"move": 1}, {"move": 1}], [True, True], None)
        assert again.raised is None
        assert [r.observation["position"] for r in again.items] == [2, 3]
    finally:
        await shard.close()


class _Unloadable:
    """Pickles, but its unpickling raises (as a class missing on the driver would)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _refuse, ()


def _refuse() -> None:
    raise ModuleNotFoundError("No module named 'only_on_the_actor'")


class _UnloadableObservation(GenericEnvClient):
    async def step(self, action: Any, **kwargs: Any) -> Any:
        result = await super().step(action, **kwargs)
        if action == {"move": 2}:
            return StepResult(observation={"odd": _Unloadable()}, reward=result.reward,
                              done=result.done)
        return result


async def test_a_result_that_cannot_be_unpickled_on_the_driver_fails_its_answers_slots(
        det_servers: Any) -> None:
    """Results that fail to unpickle where the answer arrives are answered for the slots of
    that answer (ready-first) or raised by its whole-batch call, naming the driver's
    slots, every mirror kept: never taken for a dead shard."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2, client=_UnloadableObservation))
    try:
        await shard.reset([0, 1], [True, True], None, {})
        await shard.step_send([None, {"move": 2}], [False, True], None)
        sent = await shard.step_recv()
        assert sent.bugs == {} and sent.ready == (1,)
        arrived = pickle.loads(pickle.dumps(sent))
        assert set(arrived.bugs) == {1} and type(arrived.bugs[1]) is RuntimeError
        assert str(arrived.bugs[1]).startswith("slot 11: its answer could not be unpickled")
        assert "only_on_the_actor" in str(arrived.bugs[1])
        assert arrived.items[1] is None and set(arrived.mirrors) == {1}
        assert arrived.mirrors[1].steps_applied == 1
        whole = pickle.loads(pickle.dumps(
            await shard.step([{"move": 1}, {"move": 2}], [True, True], None)))
        assert type(whole.raised) is RuntimeError and set(whole.mirrors) == {0, 1}
        assert str(whole.raised).startswith("slot 10: its answer could not be unpickled")
        assert whole.items == [None, None] and whole.mirrors[0].steps_applied == 1
        fine = pickle.loads(pickle.dumps(
            await shard.step([{"move": 1}, None], [True, False], None)))
        assert fine.raised is None and fine.items[0].observation["position"] == 2
    finally:
        await shard.close()


class _Frame:
    """A buffer-backed result (as an array is): protocol 5 hands its bytes out of band."""

    def __init__(self, data: bytearray) -> None:
        self.data = data

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        if protocol >= 5:
            return _frame, (pickle.PickleBuffer(self.data),)
        return _frame, (bytes(self.data),)


def _frame(buffer: Any) -> _Frame:
    return _Frame(bytearray(buffer))


_BIG = 1 << 20


class _FramedObservation(GenericEnvClient):
    async def step(self, action: Any, **kwargs: Any) -> Any:
        result = await super().step(action, **kwargs)
        big = bytearray(b"x" * _BIG)
        big[: len(str(action))] = str(action).encode()
        # A move of 3: with a local function, which only Ray's pickler pickles.
        frame: Any = _Frame(big) if action != {"move": 3} else (_Frame(big), lambda: action)
        return StepResult(observation={"frame": frame, "position": result.observation},
                          reward=result.reward, done=result.done)


def _as_ray_does(answer: Any) -> tuple[bytes, list[pickle.PickleBuffer]]:
    """``answer`` pickled as Ray's serializer does: protocol 5 with a buffer callback."""
    buffers: list[pickle.PickleBuffer] = []
    return pickle.dumps(answer, 5, buffer_callback=buffers.append), buffers


async def test_a_large_buffer_in_a_result_crosses_out_of_band(det_servers: Any) -> None:
    """A result's 1 MiB buffer leaves the shard beside its small pickled answer (out of
    band under protocol 5 with a buffer callback, as Ray pickles), and every pickling of
    the answer (in band, protocol 4, a copy) arrives equal."""
    server = await det_servers()
    shard = Shard(_spec(server.url, 2, client=_FramedObservation))
    try:
        await shard.reset([0, 1], [True, True], None, {})
        answer = await shard.step([{"move": 1}, {"move": 2}], [True, True], None)
        assert answer.raised is None
        outer, buffers = _as_ray_does(answer)
        assert [b.raw().nbytes for b in buffers] == [_BIG, _BIG]
        assert len(outer) < 64 * 1024
        crossings = [pickle.loads(outer, buffers=buffers),
                     pickle.loads(pickle.dumps(answer, 5)), pickle.loads(pickle.dumps(answer, 4))]
        for arrived in crossings:
            frames = [r.observation["frame"].data for r in arrived.items]
            assert frames == [r.observation["frame"].data for r in answer.items]
            assert frames[1][:12] == b"{'move': 2}x"
            assert arrived.mirrors[1].steps_applied == 1
    finally:
        await shard.close()


async def test_a_large_buffer_crosses_out_of_band_with_rays_pickler_too(
        det_servers: Any) -> None:
    """A result only Ray's pickler can pickle (a local function) keeps its buffer out of
    band too, and arrives equal."""
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    server = await det_servers()
    shard = Shard(_spec(server.url, 1, client=_FramedObservation), cloudpickle.dumps)
    try:
        await shard.reset([0], [True], None, {})
        answer = await shard.step([{"move": 3}], [True], None)
        assert answer.raised is None
        outer, buffers = _as_ray_does(answer)
        assert [b.raw().nbytes for b in buffers] == [_BIG] and len(outer) < 64 * 1024
        frame, call = pickle.loads(outer, buffers=buffers).items[0].observation["frame"]
        assert frame.data == answer.items[0].observation["frame"][0].data
        assert call() == {"move": 3}
    finally:
        await shard.close()


def _numpy() -> Any:
    """numpy; the dev extra installs it (with Ray), so it is missing only in a run
    without that extra (the dependency floors' run), where the test is skipped."""
    try:
        import numpy
    except ImportError:
        if importlib.util.find_spec("ray") is not None:
            pytest.fail("numpy is missing where the dev extra (Ray, numpy) is installed")
        pytest.skip("numpy is not installed (the dev extra installs it)")
    return numpy


async def test_a_large_array_in_a_result_crosses_out_of_band(det_servers: Any) -> None:
    """A result's 1 MiB numpy array leaves the shard out of band (its buffer, not a copy in
    the pickled answer) and arrives equal; pickled in band it arrives equal too."""
    np = _numpy()

    class _Arrays(GenericEnvClient):
        async def step(self, action: Any, **kwargs: Any) -> Any:
            result = await super().step(action, **kwargs)
            return StepResult(observation=np.arange(_BIG // 8, dtype=np.float64),
                              reward=result.reward, done=result.done)

    server = await det_servers()
    shard = Shard(_spec(server.url, 1, client=_Arrays))
    try:
        await shard.reset([0], [True], None, {})
        answer = await shard.step([{"move": 1}], [True], None)
        outer, buffers = _as_ray_does(answer)
        assert [b.raw().nbytes for b in buffers] == [_BIG] and len(outer) < 64 * 1024
        for arrived in (pickle.loads(outer, buffers=buffers),
                        pickle.loads(pickle.dumps(answer))):
            assert np.array_equal(arrived.items[0].observation, answer.items[0].observation)
    finally:
        await shard.close()
