"""Running a pool's batch: one task per slot, the batch deadline, ready-first collection.

Each slot's call runs as its own task under the batch deadline; an envlink error
becomes that slot's answer, anything else (a caller's bug) propagates. Tasks are
created inside the batch span, so each session's client spans are its children.

The ready-first state (the steps sent and not yet collected, each a future by slot)
is the same for a step that runs here (a task) and one that runs elsewhere (a Ray
shard's, answered by :meth:`BatchRunner.answer`): both pools collect with
:meth:`BatchRunner.recv`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from envlink._bridge import abandon, was_abandoned
from envlink._client.client import StepResult
from envlink._config import check_number
from envlink._deadlines import bounded_at
from envlink._errors import CallTimeoutError, ClientClosedError, EnvlinkError
from envlink._events.pool_events import BatchReport, BatchStarted, PoolHook
from envlink._pool.results import Batch, SlotResult

#: The batch helpers both pools use (EnvPool here, RayEnvPool in envlink.ray).
__all__ = ["BatchRunner", "recv_want", "seed_list", "single_result", "slot_mask"]

ObsT = TypeVar("ObsT")
Calls = dict[int, Coroutine[Any, Any, StepResult[Any]]]


class BatchRunner(Generic[ObsT]):
    """Runs batch calls for a pool of ``size`` slots and keeps the ready-first state.

    Args:
        size: the pool's number of slots.
        hook: what the batches are reported to.
        max_inflight: most slot calls running at once (``None``: no limit).
        cut_after_send: whether slot ``i``'s call, cut by the batch deadline, had
            sent its step.
        shards: a ``RayEnvPool``'s number of shard actors, for its batch reports.
    """

    def __init__(self, size: int, hook: PoolHook, max_inflight: int | None = None,
                 cut_after_send: Callable[[int], bool] | None = None,
                 shards: int | None = None) -> None:
        self.size = size
        self.hook = hook
        self._shards = shards
        # Whether slot i's call, cut by the batch deadline, had sent its step.
        self._cut_after_send = cut_after_send
        # Created on first use, on the loop that runs the pool.
        self._max_inflight = max_inflight
        self._gate: asyncio.Semaphore | None = None
        # The sent steps not yet collected: tasks here, futures for steps run elsewhere.
        self.inflight: dict[int, asyncio.Future[SlotResult[ObsT]]] = {}
        # Autoresets and terminal steps of steps sent but not yet received (same-step
        # autoresets are added by the slots' tasks as they finish).
        self.sent_autoreset: set[int] = set()
        self.sent_final: dict[int, StepResult[ObsT]] = {}
        # Slots of whole-batch calls (reset, step) still running, and their tasks.
        self.running: dict[int, asyncio.Task[SlotResult[ObsT]]] = {}
        # Waits of wait_first(): each send wakes them, so they wait for the new steps too.
        self._send_waiters: set[asyncio.Event] = set()

    def _start(self, coro: Coroutine[Any, Any, StepResult[Any]],
               seconds: float | None, until: float | None, index: int,
               method: str) -> asyncio.Task[SlotResult[ObsT]]:
        """Slot ``index``'s call as a task, behind the in-flight window and the deadline."""
        if self._max_inflight is not None and self._gate is None:
            self._gate = asyncio.Semaphore(self._max_inflight)
        gated = _gated(coro, self._gate)
        task: asyncio.Task[SlotResult[ObsT]] = asyncio.ensure_future(_bounded(
            gated, seconds, until, method,
            lambda: self._cut_after_send is not None and self._cut_after_send(index)))
        # A task cancelled before its first step (the pool closed right after a send)
        # never runs its coroutine, so the slot's call and its gate would never be
        # awaited: close them when the task ends (after they ran, a no-op).
        task.add_done_callback(lambda _task: (gated.close(), coro.close()))
        return task

    def busy(self, chosen: list[int]) -> list[int]:
        """The slots among ``chosen`` that still have a call in flight."""
        return [i for i in chosen if i in self.inflight or i in self.running]

    async def run(self, method: str, calls: Calls, seconds: float | None,
                  autoreset: set[int], final: dict[int, StepResult[ObsT]]) -> Batch[ObsT]:
        """Run every slot's call and wait for all of them (or the deadline)."""
        with BatchReport(self.hook, BatchStarted(method, self.size, len(calls))) as report:
            until = _until(seconds)
            tasks = {i: self._start(c, seconds, until, i, method) for i, c in calls.items()}
            self.running.update(tasks)
            try:
                if tasks:
                    await asyncio.wait(tasks.values())
            except BaseException as exc:
                # Abandoned (its blocking caller was interrupted): so is each slot's
                # call, whose late answer the slot's next call would otherwise queue
                # behind, as a client's own abandoned call does not.
                given_up = isinstance(exc, asyncio.CancelledError) and was_abandoned(exc)
                for task in tasks.values():
                    if given_up:
                        abandon(task)
                    else:
                        task.cancel()
                raise
            finally:
                for i in tasks:
                    self.running.pop(i, None)
            bugs: dict[int, Exception] = {}
            batch = self._collect(tasks, set(tasks.values()), autoreset, final, bugs)
            _raise_first(bugs)
            report.batch = batch
        return batch

    def send(self, calls: Calls, seconds: float | None) -> None:
        """Start every slot's step; :meth:`recv` collects them."""
        with BatchReport(self.hook, BatchStarted("step_send", self.size, len(calls))):
            until = _until(seconds)
            for i, coro in calls.items():
                self.inflight[i] = self._start(coro, seconds, until, i, "step")
        self._sent()

    def expect(self, slots: Iterable[int]) -> None:
        """Count ``slots``' steps as sent, each run elsewhere and given by :meth:`answer`."""
        loop = asyncio.get_running_loop()
        for i in slots:
            self.inflight[i] = loop.create_future()
        self._sent()

    def answer(self, index: int, result: SlotResult[ObsT]) -> None:
        """Slot ``index``'s answer to a step counted by :meth:`expect` (once; later ignored)."""
        future = self.inflight.get(index)
        if future is not None and not future.done():
            future.set_result(result)

    def fail(self, slots: Iterable[int], error: BaseException) -> None:
        """A caller's bug instead of ``slots``' answers: the :meth:`recv` that collects
        them raises it."""
        for i in slots:
            future = self.inflight.get(i)
            if future is not None and not future.done():
                future.set_exception(error)
                # Retrieved here: the collecting recv raises it once, with no
                # "exception never retrieved" log for the other slots.
                future.exception()

    def pending(self) -> list[int]:
        """The slots whose sent step has not answered yet."""
        return [i for i, future in self.inflight.items() if not future.done()]

    def _sent(self) -> None:
        for event in self._send_waiters:
            event.set()

    async def recv(self, min_ready: int | None, timeout: float | None,
                   bugs: dict[int, Exception] | None = None) -> Batch[ObsT]:
        """Wait until ``min_ready`` sent steps answered (or ``timeout``); collect them.

        A caller's bug raised by a collected step is raised (the first collected), or
        put in ``bugs`` by slot when it is given (its slot answers ``None``); either
        way every collected slot leaves the in-flight set.
        """
        pending = dict(self.inflight)
        if not pending and min_ready is None:
            return Batch([None] * self.size)  # nothing left to collect
        if not pending:
            raise ValueError("no step in flight: call step_send() first")
        want = recv_want(len(pending), min_ready, timeout)
        with BatchReport(self.hook, BatchStarted("recv", self.size, len(pending),
                                                 min_ready=want, shards=self._shards)
                         ) as report:
            deadline = None if timeout is None else time.monotonic() + timeout
            done = {t for t in pending.values() if t.done()}
            while len(done) < want:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                more, _ = await asyncio.wait(set(pending.values()) - done, timeout=left,
                                             return_when=asyncio.FIRST_COMPLETED)
                done |= more
            found: dict[int, Exception] = {} if bugs is None else bugs
            batch = self._collect(pending, done, self.sent_autoreset, self.sent_final, found)
            self.sent_autoreset -= set(batch.ready)
            for i in batch.ready:
                self.sent_final.pop(i, None)
            if bugs is None:
                _raise_first(found)
            report.batch = batch
        return batch

    async def cancel_all(self) -> None:
        """Cancel every call in flight (sent or in a running batch) and wait for them."""
        tasks = list(self.inflight.values()) + list(self.running.values())
        self.inflight.clear()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _collect(self, tasks: Mapping[int, asyncio.Future[Any]], done: set[asyncio.Future[Any]],
                 autoreset: set[int], final: dict[int, StepResult[ObsT]],
                 bugs: dict[int, Exception]) -> Batch[ObsT]:
        """The batch of the ``done`` tasks; a caller's bug (TypeError...) goes to ``bugs``."""
        items: list[SlotResult[ObsT]] = [None] * self.size
        ready, stragglers = [], []
        for i, task in tasks.items():
            if task not in done:
                stragglers.append(i)
                continue
            ready.append(i)
            self.inflight.pop(i, None)
        for i in ready:
            task = tasks[i]
            if task.cancelled():
                items[i] = ClientClosedError("the pool was closed during the call")
            else:
                try:
                    items[i] = task.result()
                except Exception as exc:  # an envlink error is an answer, not raised
                    bugs[i] = exc
        ok = {i for i in ready if not isinstance(items[i], EnvlinkError)}
        if bugs:
            ok.difference_update(bugs)
        return Batch(items, ready=ready, stragglers=stragglers,
                     autoreset=[i for i in autoreset if i in ok],
                     final={i: r for i, r in final.items() if i in ready and i not in bugs})

    async def wait_first(self) -> dict[int, asyncio.Future[SlotResult[ObsT]]]:
        """Return once a sent step has answered, or none is in flight.

        Steps sent while it waits count too. Returns the sent steps' tasks by slot as
        last seen, so that steps cancelled meanwhile by :meth:`cancel_all` can still
        be answered (see :meth:`closed_batch`).
        """
        sent = asyncio.Event()
        self._send_waiters.add(sent)
        tasks: dict[int, asyncio.Future[SlotResult[ObsT]]] = {}
        try:
            while True:
                if not self.inflight:
                    return tasks
                tasks = dict(self.inflight)
                if any(t.done() for t in tasks.values()):
                    return tasks
                sent.clear()
                woken: asyncio.Future[Any] = asyncio.ensure_future(sent.wait())
                try:
                    await asyncio.wait({*tasks.values(), woken},
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    woken.cancel()
        finally:
            self._send_waiters.discard(sent)

    def closed_batch(self, tasks: Mapping[int, asyncio.Future[SlotResult[ObsT]]],
                     bugs: dict[int, Exception] | None = None) -> Batch[ObsT]:
        """The answers of sent steps that :meth:`cancel_all` took away (the pool closed).

        A step that had ended with a caller's bug is raised, or put in ``bugs`` when it
        is given, as :meth:`recv` does.
        """
        items: list[SlotResult[ObsT]] = [None] * self.size
        found: dict[int, Exception] = {} if bugs is None else bugs
        for i, task in tasks.items():
            if not task.done() or task.cancelled():
                items[i] = ClientClosedError("the pool was closed during the call")
                continue
            try:
                items[i] = task.result()
            except Exception as exc:  # an envlink error is an answer, not raised
                found[i] = exc
        if bugs is None:
            _raise_first(found)
        return Batch(items, ready=sorted(tasks))


def _raise_first(bugs: Mapping[int, Exception]) -> None:
    """Raise the first caller's bug of a batch as is (a pool call raises it)."""
    for exc in bugs.values():
        raise exc


async def _gated(coro: Coroutine[Any, Any, StepResult[Any]],
                 gate: asyncio.Semaphore | None) -> StepResult[Any]:
    """Run ``coro`` once the pool's in-flight window lets it (no window: at once).

    Cancelled while queued, ``coro`` never ran: the task's end closes it
    (:meth:`BatchRunner._start`)."""
    if gate is None:
        return await coro
    async with gate:
        return await coro


def _until(seconds: float | None) -> float | None:
    """The batch deadline as the loop's time: one for every slot of the batch, so that
    a slot waiting for the in-flight window expires with the call that holds it and
    is never sent after the deadline."""
    return None if seconds is None else asyncio.get_running_loop().time() + seconds


async def _bounded(coro: Coroutine[Any, Any, StepResult[Any]], seconds: float | None,
                   until: float | None, method: str,
                   cut_after_send: Callable[[], bool]) -> SlotResult[Any]:
    """One slot's call under the batch deadline (``seconds``, ending at ``until``); an
    envlink error becomes its answer.

    A step cut by the deadline after it may have reached the server answers a
    :class:`~envlink.CallTimeoutError` with ``outcome_unknown=True`` (as the client's
    own deadline does): the step stays in the session journal's ``unknown_steps``.
    """
    expiry = None
    try:
        async with bounded_at(until) as expiry:
            return await coro
    except EnvlinkError as exc:
        return exc
    except TimeoutError:
        if expiry is None or not expiry.expired():
            raise
        if cut_after_send():
            return CallTimeoutError(
                f"the batch deadline of {seconds:g} s expired; the step was sent, so the "
                "server may or may not have applied it (see journal.unknown_steps)",
                method=method, timeout=seconds, outcome_unknown=True)
        return CallTimeoutError(f"the batch deadline of {seconds:g} s expired",
                                method=method, timeout=seconds)


def recv_want(pending: int, min_ready: int | None, timeout: float | None) -> int:
    """Check ``step_recv``'s arguments against ``pending`` slots in flight; return ``want``."""
    want = pending if min_ready is None else min_ready
    check_number(want, "min_ready", integer=True, minimum=1, maximum=pending,
                 mistyped=ValueError, expected=f"in 1..{pending} (the slots in flight)")
    check_number(timeout, "timeout", minimum=0, optional=True)
    return want


def single_result(batch: Batch[ObsT], index: int) -> StepResult[ObsT]:
    """Slot ``index``'s answer of a one-slot batch; its error is raised."""
    result = batch[index]
    if isinstance(result, EnvlinkError):
        raise result
    assert result is not None
    return result


def slot_mask(index: int, size: int) -> list[bool]:
    """A mask choosing slot ``index`` alone; IndexError if there is no such slot."""
    if not 0 <= index < size:
        raise IndexError(f"slot {index} out of range for a pool of {size}")
    return [i == index for i in range(size)]


def seed_list(seeds: int | Sequence[int | None] | None, size: int) -> list[int | None]:
    """One seed per slot from ``seeds``: ``None``, a first seed, or one per slot."""
    if seeds is None:
        return [None] * size
    if isinstance(seeds, bool):
        raise TypeError("seeds must be None, an int, or one seed per slot")
    if isinstance(seeds, int):
        return [seeds + i for i in range(size)]
    if isinstance(seeds, (str, bytes)) or len(seeds) != size:
        raise ValueError(f"seeds must be None, an int, or a sequence of {size}")
    return list(seeds)
