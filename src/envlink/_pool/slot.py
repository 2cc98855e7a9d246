"""One slot of an :class:`~envlink.EnvPool`: placing its session, stepping it, rebuilding it.

A slot owns at most one :class:`~envlink.EnvClient` (one session) at a time,
on one endpoint. :class:`SlotEngine` holds what every slot shares (placement,
client factory, policies, hook) and runs the operations of one slot. It
uses the client's public API only: ``reset``/``step``/``close``, ``journal``,
``reconnect_policy`` and the typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from envlink._client.client import EnvClient, StepResult
from envlink._deadlines import bounded
from envlink._errors import (
    CallTimeoutError,
    CapacityReachedError,
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    ReplayDivergedError,
    RetryBudgetExhaustedError,
    ServerError,
    SessionLostError,
)
from envlink._events.pool_events import BreakerChange, PoolEvent, PoolHook
from envlink._pool.breaker import BreakerState
from envlink._pool.placement import Placement, PoolServer
from envlink._sansio.journal import EpisodeJournal
from envlink._sansio.policies import ReconnectPolicy, testing_enabled
from envlink._sansio.replay import RESET, JournalReplay, ReplayVerify
from envlink.names import LOG_POOL_CAPACITY_WAIT, LOG_POOL_SESSION_MOVED, LOG_SESSION_LOST

__all__ = ["Slot", "SlotEngine", "SlotState"]

# One connection attempt per endpoint while placing: the other endpoints and the
# breaker take the place of the client's own reconnect loop.
_PLACING = ReconnectPolicy(max_attempts=1, max_elapsed=None)


class SlotState(str, enum.Enum):
    """Where a slot's session stands (the ``envlink.pool.session.state`` attribute)."""

    EMPTY = "empty"            # no session (never reset, or given up after an error)
    PLACING = "placing"        # looking for an endpoint with room
    ACTIVE = "active"          # a session is open on an endpoint
    RECOVERING = "recovering"  # rebuilding a lost session on another endpoint
    LOST = "lost"              # the session was lost; reset() places it again


class Slot:
    """One environment of the pool (internal; the view exposes what users need)."""

    __slots__ = ("actions", "client", "cut_after_send", "endpoint", "episodes", "index",
                 "needs_reset", "reset_kwargs", "state", "task", "unsettled")

    def __init__(self, index: int) -> None:
        self.index = index
        self.client: EnvClient[Any, Any, Any] | None = None
        self.endpoint: PoolServer | None = None
        self.state = SlotState.EMPTY
        self.reset_kwargs: dict[str, Any] = {}
        self.episodes = 0
        # Typed actions of the current episode, kept only when the client's action
        # hook is custom (the journal keeps the JSON payload, which such a hook may
        # not accept back); None otherwise.
        self.actions: list[Any] | None = None
        self.needs_reset = False
        self.task: asyncio.Task[Any] | None = None
        # Whether the current operation was cut (batch deadline, cancellation) after its
        # step frame may have reached the server (the step's outcome is unknown).
        self.cut_after_send = False
        # Whether the session's journal may hold steps of unknown outcome (it is read
        # before the next step, so a cut step is told from one cut earlier).
        self.unsettled = False


ClientFactory = Callable[[str], EnvClient[Any, Any, Any]]


class SlotEngine:
    """Runs slot operations under the pool's placement and policies, reporting to its hook.

    Args:
        placement: the endpoints and the placement rule.
        factory: builds a client for a base URL.
        on_session_lost: ``raise``, ``replay`` or ``resume``.
        capacity: backoff, attempts, elapsed cap and retry budget for waiting
            while every endpoint is full or unreachable.
        verify: compares a recorded answer with a replayed one.
        hook: what the slots' sessions, placements and breakers are reported to.
    """

    def __init__(self, placement: Placement, factory: ClientFactory, *,
                 on_session_lost: str, capacity: ReconnectPolicy, verify: ReplayVerify,
                 hook: PoolHook) -> None:
        self.placement = placement
        self.factory = factory
        self.on_session_lost = on_session_lost
        self.capacity = capacity
        self.verify = verify
        self.hook = hook
        self._changed: asyncio.Event | None = None
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ bookkeeping

    def set_state(self, slot: Slot, state: SlotState, endpoint: PoolServer | None) -> None:
        """Move a slot, keeping the sessions-by-endpoint-and-state gauge exact."""
        old_ep, old_state = slot.endpoint, slot.state
        if old_ep is endpoint and old_state is state:
            return
        hook = self.hook
        if old_ep is not None and old_state is not SlotState.EMPTY:
            hook.sessions_changed(old_ep.host, old_ep.port, old_state.value, -1)
        if endpoint is not None and state is not SlotState.EMPTY:
            hook.sessions_changed(endpoint.host, endpoint.port, state.value, 1)
        slot.endpoint, slot.state = endpoint, state

    def breaker_changed(self, ep: PoolServer, old: BreakerState, new: BreakerState) -> None:
        """Callback of every endpoint's breaker: report it, wake waiting placements."""
        self.hook.breaker_changed(BreakerChange(
            ep.host, ep.port, ep.display, old.value, new.value,
            ep.breaker.consecutive_failures))
        self.notify()

    def breaker_states(self) -> Iterable[tuple[str, int, str]]:
        """Each endpoint's ``(host, port, breaker state)``; a read only, for metric collection."""
        return [(ep.host, ep.port, ep.breaker.peek().value)
                for ep in self.placement.endpoints]

    def notify(self) -> None:
        """Something changed (a slot freed, a breaker moved): wake waiting placements."""
        event, self._changed = self._changed, None
        if event is not None:
            event.set()

    def _changed_event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    def _report_placement(self, ep: PoolServer, result: str) -> None:
        self.hook.placement(ep.host, ep.port, result)

    # ------------------------------------------------------------------ lifecycle

    def detach(self, slot: Slot, state: SlotState = SlotState.EMPTY) -> None:
        """Forget the slot's session: free its endpoint slot, close its client in background.

        With a state other than ``EMPTY`` the slot stays counted on its old endpoint
        in that state (``lost``, ``recovering``) until it is placed again.
        """
        client, slot.client = slot.client, None
        ep = slot.endpoint
        if ep is not None and client is not None:
            self.placement.release(ep)
            self.notify()
        self.set_state(slot, state, None if state is SlotState.EMPTY else ep)
        if client is not None:
            self._spawn(self._close_quietly(client))

    async def _close_quietly(self, client: EnvClient[Any, Any, Any]) -> None:
        with contextlib.suppress(EnvlinkError, asyncio.TimeoutError, TimeoutError):
            await client.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self) -> None:
        """Wait for background closes to finish (at pool close)."""
        while self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    # ------------------------------------------------------------------ operations

    async def reset(self, slot: Slot, kwargs: dict[str, Any]) -> StepResult[Any]:
        """Start a new episode on the slot; place a session first if it has none."""
        slot.cut_after_send = False
        client = slot.client
        if client is None:
            result = await self._place(slot, kwargs)
        else:
            try:
                result = await client.reset(**kwargs)
            except (ConnectError, ConnectionLostError, CapacityReachedError) as exc:
                # Its server is gone (or gave its slot away): place the session afresh,
                # elsewhere if need be.
                if slot.endpoint is not None and not isinstance(exc, ServerError):
                    slot.endpoint.breaker.record_failure()
                self.detach(slot)
                result = await self._place(slot, kwargs)
        slot.reset_kwargs = dict(kwargs)
        slot.episodes += 1
        slot.needs_reset = False
        if slot.actions is not None:
            slot.actions = []
        return result

    async def step(self, slot: Slot, action: Any) -> StepResult[Any]:
        """One step on the slot's session, recovered elsewhere under ``replay``."""
        slot.cut_after_send = False
        client = slot.client
        if client is None:
            raise SessionLostError(
                f"slot {slot.index} has no session (never reset, or its session was lost "
                "or could not be placed); reset it first")
        try:
            result = await self._send_step(slot, client, action)
        except ReplayDivergedError:
            self.detach(slot, SlotState.LOST)
            raise
        except SessionLostError as exc:
            journal = exc.journal
            if (self.on_session_lost != "replay" or not isinstance(journal, EpisodeJournal)
                    or not journal.replayable):
                self.detach(slot, SlotState.LOST)
                raise
            result = await self._rebuild(slot, journal, action, exc)
        if slot.actions is not None:
            slot.actions.append(action)
        return result

    async def _send_step(self, slot: Slot, client: EnvClient[Any, Any, Any],
                         action: Any) -> StepResult[Any]:
        """``client.step(action)``, noting in ``slot.cut_after_send`` whether a cut
        (the batch deadline, a cancellation) came after the step may have been sent.

        The client keeps such a step in its journal's ``unknown_steps``: one more there
        after the cut than before the call means this step's outcome is unknown. The
        journal is only read when it may hold some (after a cut), never per step.
        """
        before = 0
        if slot.unsettled:
            before = len(client.journal.unknown_steps)
            slot.unsettled = before > 0
        try:
            return await client.step(action)
        except asyncio.CancelledError:
            slot.cut_after_send = len(client.journal.unknown_steps) > before
            slot.unsettled = True
            raise
        except CallTimeoutError as exc:  # the client's own deadline
            slot.unsettled = slot.unsettled or exc.outcome_unknown
            raise

    # ------------------------------------------------------------------ placement

    async def _place(self, slot: Slot, kwargs: dict[str, Any]) -> StepResult[Any]:
        """Open a session on the least-loaded endpoint that takes it, then reset it."""
        policy = self.capacity
        placement = self.placement
        started = time.monotonic()
        tried: set[PoolServer] = set()
        last: EnvlinkError | None = None
        waits = 0
        self.set_state(slot, SlotState.PLACING, slot.endpoint)
        try:
            while True:
                ep = placement.choose(exclude=tried)
                if ep is None:
                    waits += 1
                    last = self._give_up_if_due(last, waits, started)
                    if waits > 1 and policy.budget is not None and not policy.budget.try_spend():
                        raise RetryBudgetExhaustedError(
                            "the retry budget refused another wait for a free endpoint"
                        ) from last
                    await self._wait_for_room(waits, last)
                    tried.clear()
                    continue
                tried.add(ep)
                outcome = await self._try_endpoint(slot, ep, kwargs)
                if isinstance(outcome, EnvlinkError):
                    last = outcome
                    continue
                if policy.budget is not None:
                    policy.budget.record_success()
                return outcome
        except BaseException:
            if slot.client is None:
                self.set_state(slot, SlotState.EMPTY, None)
            raise

    def _give_up_if_due(self, last: EnvlinkError | None, waits: int,
                        started: float) -> EnvlinkError:
        policy = self.capacity
        elapsed = time.monotonic() - started
        if last is None:
            last = ConnectError("no endpoint can take a session now (every endpoint is "
                                "full or its circuit breaker is open)")
        if waits > policy.max_attempts or (
                policy.max_elapsed is not None and elapsed >= policy.max_elapsed):
            raise last
        return last

    async def _wait_for_room(self, waits: int, last: EnvlinkError) -> None:
        delay = min(self.placement.next_change(), self.capacity.delay(waits))
        if not math.isfinite(delay):
            delay = self.capacity.max_delay
        self.hook.event(PoolEvent(LOG_POOL_CAPACITY_WAIT, {
            "wait": waits, "delay_s": round(delay, 4), "error_type": last.error_type}))
        event = self._changed_event()
        if testing_enabled():
            delay = min(delay, 0.01)  # set_testing(): no real backoff, still yield
        with contextlib.suppress(TimeoutError):
            async with bounded(delay):
                await event.wait()

    async def _try_endpoint(self, slot: Slot, ep: PoolServer, kwargs: dict[str, Any]
                            ) -> StepResult[Any] | EnvlinkError:
        """One placement attempt on ``ep``: a result, or the error that rules ``ep`` out."""
        placement = self.placement
        client = self.factory(ep.url)
        own_policy = client.reconnect_policy
        client.reconnect_policy = _PLACING
        placed = False
        try:
            result = await client.reset(**kwargs)
            placed = True
        except CapacityReachedError as exc:
            placement.refused(ep, active_sessions=exc.active_sessions,
                              max_sessions=exc.max_sessions)
            self._report_placement(ep, "capacity_reached")
            self._spawn(self._close_quietly(client))
            return exc
        except (ConnectError, ConnectionLostError, CallTimeoutError) as exc:
            placement.unreachable(ep)
            self._report_placement(ep, "unreachable")
            self._spawn(self._close_quietly(client))
            return exc
        except ServerError:
            # The server is up and the session exists; the reset itself was refused
            # (bad arguments...): the slot keeps the session, the caller gets the error.
            placed = True
            raise
        except BaseException:
            ep.breaker.release_probe()
            placement.release(ep)
            self._spawn(self._close_quietly(client))
            raise
        finally:
            client.reconnect_policy = own_policy
            if placed:
                placement.placed(ep)
                self._report_placement(ep, "placed")
                slot.client = client
                if self.on_session_lost == "replay" and client.tape is not None:
                    client.tape.keep_lost()  # for _rebuild
                if slot.actions is None and _custom_payload(client):
                    slot.actions = []
                self.set_state(slot, SlotState.ACTIVE, ep)
        return result

    # ------------------------------------------------------------------ recovery

    async def _rebuild(self, slot: Slot, journal: EpisodeJournal, action: Any,
                       cause: SessionLostError) -> StepResult[Any]:
        """Rebuild a lost episode on the least-loaded endpoint, then apply ``action``."""
        old = slot.endpoint
        actions = slot.actions
        # The episode as recorded so far goes on in the new session's recording.
        tape = slot.client.tape if slot.client is not None else None
        episode = tape.hand_over() if tape is not None else None
        self.detach(slot, SlotState.RECOVERING)
        try:
            client = await self._replay_onto(slot, journal, actions)
            if client.tape is not None:
                client.tape.continue_episode(episode)
                tape = None
            result = await self._send_step(slot, client, action)
        except BaseException as exc:
            if tape is not None:  # not continued: written as lost, the rebuild dropped
                if slot.client is not None and slot.client.tape is not None:
                    tape = slot.client.tape
                tape.rebuild_failed(episode)
            # The caller sees this loss: one warning, with the pool's policy and cause.
            self.hook.event(PoolEvent(LOG_SESSION_LOST, {
                "slot": slot.index, "policy": self.on_session_lost, "recovery": "replay",
                "steps": journal.step_count,
                "error": (f"{cause.__cause__ or cause}; replay failed: "
                          f"{type(exc).__name__}: {exc}")}))
            self._rebuild_failed(slot, journal, exc, old, " on another endpoint")
            raise
        self.hook.event(PoolEvent(LOG_POOL_SESSION_MOVED, {
            "slot": slot.index, "from_url": old.display if old else None,
            "to_url": slot.endpoint.display if slot.endpoint else None,
            "steps": journal.step_count, "error_type": cause.error_type,
            "recovery": "replay", "error": str(cause.__cause__ or cause)}))
        return result

    async def restore(self, slot: Slot, journal: EpisodeJournal,
                      actions: list[Any] | None) -> None:
        """Rebuild an episode recorded elsewhere (another process) on an empty slot.

        Raises:
            SessionLostError: it could not be placed or replayed (carries ``journal``).
            ReplayDivergedError: the environment answered differently.
        """
        try:
            client = await self._replay_onto(slot, journal, actions)
        except BaseException as exc:
            if slot.client is not None and slot.client.tape is not None:
                slot.client.tape.restore_failed(journal)
            self._rebuild_failed(slot, journal, exc, None, "")
            raise
        if client.tape is not None:  # the first copy of the episode went with its process
            client.tape.continue_episode(None)
        slot.reset_kwargs = dict(journal.reset_kwargs)

    def _rebuild_failed(self, slot: Slot, journal: EpisodeJournal, exc: BaseException,
                        endpoint: PoolServer | None, where: str) -> None:
        """Rebuilding an episode on ``slot`` failed with ``exc``: the slot is lost.

        Raises:
            SessionLostError: carrying ``journal``, for an envlink error that is not one
                already (the caller raises any other ``exc`` itself).
        """
        if slot.state is not SlotState.EMPTY or slot.client is not None:
            self.detach(slot, SlotState.LOST)
        else:
            self.set_state(slot, SlotState.LOST, endpoint)
        if isinstance(exc, EnvlinkError) and not isinstance(exc, SessionLostError):
            raise SessionLostError(
                f"slot {slot.index}: the session was lost and could not be rebuilt{where}: "
                f"{exc}", journal=journal) from exc

    async def _replay_onto(self, slot: Slot, journal: EpisodeJournal,
                           actions: list[Any] | None) -> EnvClient[Any, Any, Any]:
        """Place a session for the slot, reset it and replay the journal, checked."""
        replay = JournalReplay(journal, self.verify)
        try:
            await self._place(slot, replay.reset_kwargs)
        except ServerError as exc:
            replay.check(RESET, exc)
        client = slot.client
        assert client is not None
        steps: list[Any] = (list(actions) if actions is not None
                            else [e.action for e in replay.entries])
        refused: ServerError | None = None
        for step_action in steps:
            try:
                await client.step(step_action)
            except ServerError as exc:
                refused = exc
                break
        # The new client's journal holds the answers it got (one copy, not one per step).
        replayed = client.journal
        replay.check(RESET, replayed.reset_response_json)
        for index, entry in enumerate(replayed.entries):
            replay.check(index, entry.response_json)
        if refused is not None:
            replay.check(len(replayed.entries), refused)
        if slot.actions is not None:
            slot.actions = list(steps)
        return client


def _custom_payload(client: EnvClient[Any, Any, Any]) -> bool:
    """Whether the client turns actions into payloads its own way (a typed client)."""
    return type(client)._step_payload is not EnvClient._step_payload

