"""``EnvPool``: a batch of sessions on one event loop, spread over several servers.

Batched ``reset``/``step`` with masks, a ready-first form for stragglers
(``step_send`` then ``step_recv(min_ready=...)``), gymnasium's autoreset modes,
and per-slot answers: a batch never fails as a whole because one session did.
Sessions are placed on the least-loaded endpoint, moved on ``CAPACITY_REACHED``,
kept off failing servers by a circuit breaker per endpoint, and rebuilt on
another endpoint under ``on_session_lost="replay"``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from envlink._client.client import EnvClient, GenericEnvClient, StepResult
from envlink._config import UNSET, UnsetType, redact_url
from envlink._errors import ClientClosedError
from envlink._events.pool_events import PoolHook
from envlink._pool.batch import BatchRunner, seed_list
from envlink._pool.breaker import CircuitBreaker
from envlink._pool.interface import AsyncPool
from envlink._pool.options import DEFAULT_CAPACITY_POLICY, AutoresetMode, PoolOptions
from envlink._pool.placement import Placement
from envlink._pool.results import Batch, EndpointView, PoolView, SlotRecord
from envlink._pool.slot import Slot, SlotEngine, SlotState
from envlink._sansio.journal import EpisodeJournal
from envlink._sansio.replay import same_answer

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from envlink._fleet.settings import FleetLimits

__all__ = ["DEFAULT_CAPACITY_POLICY", "AutoresetMode", "EnvPool", "pool_telemetry_hook"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")


def pool_telemetry_hook(tracer_provider: TracerProvider | None,
                        meter_provider: MeterProvider | None) -> PoolHook:
    """The hook a pool reports to: envlink's OpenTelemetry and structlog emitter."""
    # The emitter (OpenTelemetry's metrics API, envlink's instruments) is imported by
    # the first pool that uses it, not by `import envlink`.
    from envlink._telemetry.pool_hook import PoolTelemetryHook

    return PoolTelemetryHook(tracer_provider, meter_provider)


class EnvPool(AsyncPool[ActT, ObsT]):
    """``size`` environment sessions over one or several servers, stepped as a batch.

    Every session is an :class:`~envlink.EnvClient` of the given class and keeps
    all of its guarantees (a deadline per call, never a step applied twice); the
    pool adds placement, a deadline per batch, and recovery on another endpoint.
    All sessions run on the event loop of the caller (one thread for the whole
    pool); :meth:`sync` gives a blocking facade on one bridge thread.

    Autoreset modes (as gymnasium's ``AutoresetMode``), for a slot whose step
    returned ``done=True``:

    * ``"next_step"`` (default): that step returns the terminal observation. On
      the *next* ``step`` the slot's action is ignored, the session is reset, and
      the slot's answer is the reset's observation with ``reward=0.0`` and
      ``done=False``; the slot is listed in ``batch.autoreset``.
    * ``"same_step"``: the session is reset within the same ``step``; the slot's
      answer is the reset's observation with the terminal step's ``reward``,
      ``done=True`` and ``metadata``; the terminal step itself (its observation is
      the episode's last) is in ``batch.final[slot]``.
    * ``"disabled"``: nothing is reset; reset slots with ``reset(mask=...)``.

    An automatic reset uses ``autoreset_kwargs(slot, episode)`` if given, else the
    slot's last reset arguments without ``seed`` (gymnasium resets without a seed).

    Args:
        endpoints: one base URL, or several (``http(s)://`` or ``ws(s)://``).
        size: number of sessions (slots).
        client: an :class:`~envlink.EnvClient` subclass (default
            :class:`~envlink.GenericEnvClient`), or a callable ``url -> client``.
        client_config: the :class:`~envlink.ClientConfig` of each client, when
            ``client`` is a class: each gets exactly it, with the pool's
            ``on_session_lost`` (leave the config's at ``"raise"``) and the pool's
            providers where the config has none. Default: the class's own defaults.
        client_options: deprecated: the client's keyword arguments as a mapping
            (``{"timeout": ...}``), turned into a ``client_config`` once.
        on_session_lost: ``"raise"`` (default: that slot's answer is
            :class:`~envlink.SessionLostError`), ``"replay"`` (the episode is rebuilt
            on the least-loaded endpoint from its journal, each replayed answer
            verified, then the interrupted step is applied) or ``"resume"`` (each
            client resumes on its own server where it offers it). Not ``"auto"``:
            the pool's replay rebuilds on any endpoint and its resume stays on one,
            so it asks which.
        autoreset: ``"next_step"``, ``"same_step"`` or ``"disabled"``.
        autoreset_kwargs: ``(slot, episode) -> reset kwargs`` for automatic resets.
        batch_timeout: default deadline of a batch call in seconds (``None``: none;
            each session call keeps its client's own deadline).
        max_inflight: most session calls running at once (``None``: every slot of a
            batch at once). A window keeps each call's own deadline for the server
            and the network rather than for the pool's queue on a busy loop; a
            batch still waits for all its slots, and the batch deadline covers
            the time queued.
        capacity: backoff, attempts, elapsed cap and :class:`~envlink.RetryBudget`
            for waiting while every endpoint is full or its breaker open.
        breaker_threshold: consecutive connection failures that open an
            endpoint's circuit breaker.
        breaker_reset_timeout: seconds a breaker stays open before one probe.
        replay_verify: compares a recorded answer with a replayed one (default:
            equality of the whole ``data`` object).
        tracer_provider: OpenTelemetry tracer provider (default: the global one).
        meter_provider: OpenTelemetry meter provider (default: the global one).

    The options after ``client`` are those of the pool's ``PoolOptions``, where they
    are declared and checked once for this pool and ``envlink.ray``'s.

    Raises:
        ValueError: a bad endpoint, size, mode or option.
        TypeError: ``client`` is neither an EnvClient class nor a callable, or an
            unknown option.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        size: int,
        *,
        client: type[EnvClient[ActT, ObsT, Any]] | Callable[[str], EnvClient[ActT, ObsT, Any]]
        = GenericEnvClient,  # type: ignore[assignment]
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        **options: Any,
    ) -> None:
        # The options are PoolOptions' fields, declared and checked there only.
        pool = PoolOptions(endpoints, size, client=client, **options)
        self._configure(pool, tracer_provider, meter_provider)
        self._hook = pool_telemetry_hook(tracer_provider, meter_provider)
        self._factory = pool.client_factory(tracer_provider, meter_provider)
        self._engine: SlotEngine | None = None
        self._verify = pool.replay_verify or same_answer
        self._slots = [Slot(i) for i in range(size)]
        self._batches: BatchRunner[ObsT] = BatchRunner(
            size, self._hook, pool.max_inflight,
            cut_after_send=lambda i: self._slots[i].cut_after_send)

    # ------------------------------------------------------------------ properties

    def clients(self) -> list[EnvClient[ActT, ObsT, Any] | None]:
        """Each slot's current client (``None``: no session); use them on the pool's loop."""
        return [s.client for s in self._slots]

    def view(self) -> PoolView:
        """A snapshot: sessions per endpoint and state, breaker states, each slot's state."""
        engine = self._engine
        eps = engine.placement.endpoints if engine is not None else []
        parsed = self._options.parsed
        counts: dict[int, dict[str, int]] = {i: {} for i in range(len(parsed))}
        for slot in self._slots:
            if slot.endpoint is not None and slot.state is not SlotState.EMPTY:
                by_state = counts[slot.endpoint.index]
                by_state[slot.state.value] = by_state.get(slot.state.value, 0) + 1
        views = []
        for i, (url, _h, _p) in enumerate(parsed):
            ep = eps[i] if eps else None
            views.append(EndpointView(
                url=redact_url(url), breaker=ep.breaker.state.value if ep else "closed",
                consecutive_failures=ep.breaker.consecutive_failures if ep else 0,
                sessions=ep.sessions if ep else 0,
                server_max=ep.server_max if ep else None, states=counts[i]))
        return PoolView(endpoints=tuple(views),
                        slots=tuple(s.state.value for s in self._slots),
                        slot_endpoints=tuple(s.endpoint.display if s.endpoint and s.client
                                             else None for s in self._slots))

    # ------------------------------------------------------------------ batch calls

    async def reset(self, seeds: int | Sequence[int | None] | None = None, *,
                    mask: Sequence[bool] | None = None,
                    timeout: float | UnsetType | None = UNSET,
                    **kwargs: Any) -> Batch[ObsT]:
        """Start a new episode in every slot (or the masked ones).

        Args:
            seeds: ``None`` (no seed), an int ``s`` (slot ``i`` gets ``s + i``, as
                gymnasium), or one seed (or ``None``) per slot.
            mask: which slots to reset (default: all); the others answer ``None``.
            timeout: this batch's deadline (default: ``batch_timeout``).
            **kwargs: reset arguments for every slot's environment.

        Returns:
            A :class:`Batch`: per slot a :class:`~envlink.StepResult` or its error.

        Raises:
            ValueError: bad seeds or mask, or a slot still has a step in flight.
            ClientClosedError: the pool is closed.
        """
        chosen = self._chosen(mask)
        per_slot = seed_list(seeds, self.size)
        engine = self._ready_engine()
        calls = {}
        for i in chosen:
            args = dict(kwargs)
            if per_slot[i] is not None:
                args["seed"] = per_slot[i]
            calls[i] = engine.reset(self._slots[i], args)
        return await self._run("reset", calls, timeout, set(), {})

    async def step(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None,
                   *, timeout: float | UnsetType | None = UNSET) -> Batch[ObsT]:
        """Apply one action per slot (or per masked slot) and wait for every answer.

        Args:
            actions: one action per slot (entries of masked-out slots are ignored).
            mask: which slots to step (default: all); the others answer ``None``.
            timeout: this batch's deadline (default: ``batch_timeout``); a slot not
                done by then answers :class:`~envlink.CallTimeoutError`.

        Returns:
            A :class:`Batch` (see the autoreset modes in the class docstring).

        Raises:
            ValueError: ``actions`` or ``mask`` has the wrong length, or a slot still
                has a step in flight (from :meth:`step_send`).
            ClientClosedError: the pool is closed.
        """
        chosen = self._chosen(mask, actions)
        autoreset: set[int] = set()
        final: dict[int, StepResult[ObsT]] = {}
        calls = self._step_calls(chosen, actions, autoreset, final)
        return await self._run("step", calls, timeout, autoreset, final)

    async def step_send(self, actions: Sequence[ActT | None],
                        mask: Sequence[bool] | None = None, *,
                        timeout: float | UnsetType | None = UNSET) -> None:
        """Start one step per slot (or per masked slot) and return at once.

        Collect the answers with :meth:`step_recv`. ``timeout`` (default:
        ``batch_timeout``) bounds each slot's step from now.

        Raises:
            ValueError: as :meth:`step`.
            ClientClosedError: the pool is closed.
        """
        chosen = self._chosen(mask, actions)
        seconds = self._options.seconds(timeout)
        batches = self._batches
        self._batches.send(self._step_calls(chosen, actions, batches.sent_autoreset,
                                            batches.sent_final), seconds)

    async def step_recv(self, min_ready: int | None = None, *,
                        timeout: float | None = None) -> Batch[ObsT]:
        """Collect the answers of :meth:`step_send` as soon as ``min_ready`` are in.

        Args:
            min_ready: answers to wait for (default: every slot in flight; with
                nothing in flight, an empty batch is returned at once).
            timeout: most seconds to wait; on expiry the answers in so far are
                returned (possibly fewer than ``min_ready``), the rest stay in flight.

        Returns:
            A :class:`Batch` with the answered slots (``batch.ready``) and the slots
            still in flight (``batch.stragglers``, collected by a later call).

        Raises:
            ValueError: ``min_ready`` is not in ``1..len(in flight)`` (nothing in
                flight included).
        """
        return await self._batches.recv(min_ready, timeout)

    # ------------------------------------------------------------------ lifecycle

    async def close(self) -> None:
        """Cancel what is in flight and close every session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        engine = self._engine
        if engine is not None:
            self._hook.unwatch_breakers(engine)
        await self._batches.cancel_all()
        if engine is not None:
            for slot in self._slots:
                engine.detach(slot)
            await engine.drain()

    # ------------------------------------------------------------------ across processes

    def slot_record(self, index: int) -> SlotRecord:
        """What the pool keeps of slot ``index`` besides its session's journal.

        With the session's journal (``record.client.journal``), enough to take the
        slot over in another process with :meth:`restore_slot` (``envlink.ray`` keeps
        it of each slot of its shard actors).

        Raises:
            IndexError: no such slot.
        """
        slot = self._slots[index]
        return SlotRecord(client=slot.client, actions=slot.actions,
                          needs_reset=slot.needs_reset, episodes=slot.episodes,
                          reset_kwargs=dict(slot.reset_kwargs))

    async def restore_slot(self, index: int, journal: EpisodeJournal | None,
                           actions: Sequence[Any] | None = None, *, needs_reset: bool = False,
                           episodes: int = 0,
                           reset_kwargs: Mapping[str, Any] | None = None) -> None:
        """Take over a slot's episode from a pool in another process (a dead Ray shard).

        With a journal, the episode is rebuilt here (placed, reset with the recorded
        kwargs, each recorded step replayed and checked); without one, only the slot's
        bookkeeping (autoreset pending, episode count, last reset arguments) is restored.

        Args:
            index: an idle slot without a session.
            journal: the episode to rebuild, or ``None``.
            actions: the typed actions of the episode (see :class:`SlotRecord`).
            needs_reset: the slot's next step resets it (``next_step`` autoreset).
            episodes: episodes begun on the slot so far.
            reset_kwargs: the arguments of its last reset.

        Raises:
            SessionLostError: the episode could not be rebuilt (carries ``journal``).
            ReplayDivergedError: the environment answered differently.
            ValueError: the slot has a session or a call in flight.
            ClientClosedError: the pool is closed.
        """
        engine = self._ready_engine()
        slot = self._slots[index]
        if slot.client is not None or self._batches.busy([index]):
            raise ValueError(f"slot {index} is in use; only an idle, empty slot is restored")
        if journal is not None:
            await engine.restore(slot, journal, None if actions is None else list(actions))
        slot.needs_reset = needs_reset
        slot.episodes = episodes
        slot.reset_kwargs = dict(reset_kwargs or {})

    async def step_recv_first(self, *, bugs: dict[int, Exception] | None = None
                              ) -> Batch[ObsT]:
        """Collect every sent step that has answered, once at least one has.

        Unlike :meth:`step_recv`, steps sent by :meth:`step_send` while it waits count
        too: the first answer of any of them ends the wait (a Ray shard actor runs a
        send while a receive waits). If the pool is closed during the wait, each
        waited-for step answers :class:`~envlink.ClientClosedError`.

        Args:
            bugs: where to put, by slot, a caller's bug (an exception that is not an
                envlink error: a bad action, a hook or parser that raised) instead of
                raising it as :meth:`step_recv` does; such a slot answers ``None``
                and, as with :meth:`step_recv`, is no longer in flight.

        Raises:
            ValueError: no step in flight.
        """
        waited = await self._batches.wait_first()
        if waited and self._closed and not self._batches.inflight:
            return self._batches.closed_batch(waited, bugs)  # as step_recv at close
        return await self._batches.recv(1, 0, bugs)

    # ------------------------------------------------------------------ internals

    def _ready_engine(self) -> SlotEngine:
        if self._closed:
            raise ClientClosedError("the pool is closed")
        if self._engine is None:
            # Built on first use, on the loop that runs the pool.
            threshold = self._options.breaker_threshold
            reset_timeout = self._options.breaker_reset_timeout
            holder: list[SlotEngine] = []

            def make_breaker(index: int) -> CircuitBreaker:
                return CircuitBreaker(threshold, reset_timeout, on_change=lambda old, new: (
                    holder[0].breaker_changed(holder[0].placement.endpoints[index], old, new)))

            options = self._options
            capacity = options.capacity_policy
            placement = Placement(options.parsed, make_breaker, capacity_backoff=capacity)
            engine = SlotEngine(placement, self._factory, on_session_lost=self.on_session_lost,
                                capacity=capacity, verify=self._verify, hook=self._hook)
            holder.append(engine)
            self._engine = engine
            self._hook.watch_breakers(engine)
        return self._engine

    def _chosen(self, mask: Sequence[bool] | None,
                actions: Sequence[Any] | None = None) -> list[int]:
        self._ready_engine()
        chosen = self._options.select(mask, actions, self._batches.busy)
        for i in chosen:  # a new call: no cut yet (it may be cut before it even starts)
            self._slots[i].cut_after_send = False
        return chosen

    def _step_calls(self, chosen: list[int], actions: Sequence[ActT | None],
                    autoreset: set[int], final: dict[int, StepResult[ObsT]]
                    ) -> dict[int, Any]:
        engine = self._ready_engine()
        calls: dict[int, Any] = {}
        for i in chosen:
            slot = self._slots[i]
            if self.autoreset == "next_step" and slot.needs_reset:
                calls[i] = self._next_step_reset(engine, slot)
                autoreset.add(i)
            else:
                calls[i] = self._step_one(engine, slot, actions[i], autoreset, final)
        return calls

    async def _next_step_reset(self, engine: SlotEngine, slot: Slot) -> StepResult[ObsT]:
        result: StepResult[ObsT] = await engine.reset(slot, self._next_kwargs(slot))
        return StepResult(observation=result.observation, reward=0.0, done=False,
                          metadata=result.metadata)

    async def _step_one(self, engine: SlotEngine, slot: Slot, action: Any,
                        autoreset: set[int], final: dict[int, StepResult[ObsT]]
                        ) -> StepResult[ObsT]:
        result: StepResult[ObsT] = await engine.step(slot, action)
        if not result.done or self.autoreset == "disabled":
            return result
        if self.autoreset == "next_step":
            slot.needs_reset = True
            return result
        final[slot.index] = result
        autoreset.add(slot.index)
        fresh: StepResult[ObsT] = await engine.reset(slot, self._next_kwargs(slot))
        return StepResult(observation=fresh.observation, reward=result.reward, done=True,
                          metadata=result.metadata)

    def _next_kwargs(self, slot: Slot) -> dict[str, Any]:
        user = self._options.autoreset_kwargs
        if user is not None:
            return dict(user(slot.index, slot.episodes))
        return {k: v for k, v in slot.reset_kwargs.items() if k != "seed"}

    async def _run(self, method: str, calls: dict[int, Any],
                   timeout: float | UnsetType | None, autoreset: set[int],
                   final: dict[int, StepResult[ObsT]]) -> Batch[ObsT]:
        try:
            seconds = self._options.seconds(timeout)
        except ValueError:
            for coro in calls.values():
                coro.close()
            raise
        config = self._options.client_config
        fleet = config.fleet if config is not None else None
        if fleet is not None and any(self._slots[i].client is None for i in calls):
            return await self._placing_turn(fleet, seconds, method, calls, autoreset, final)
        return await self._batches.run(method, calls, seconds, autoreset, final)

    async def _placing_turn(self, fleet: FleetLimits, seconds: float | None, method: str,
                            calls: dict[int, Any], autoreset: set[int],
                            final: dict[int, StepResult[ObsT]]) -> Batch[ObsT]:
        # Under the fleet's shared limits, one pool at a time places its sessions (in
        # arrival order across processes): a pool that got some of its slots never
        # waits for the rest while holding them against another pool doing the same.
        from envlink._fleet.worker import PLACING, PLACING_TURN, PlacingTurn, fleet_for
        shared = fleet_for(fleet)
        expires = None if seconds is None else time.monotonic() + seconds
        try:
            hold = await shared.acquire(PLACING, 1, None, expires, "pool_placing")
        except BaseException:
            for coro in calls.values():
                coro.close()
            raise
        # The turn ends as soon as every session being placed is in the fleet's queue.
        turn = PlacingTurn(shared, hold, sum(1 for i in calls if self._slots[i].client is None))
        token = PLACING_TURN.set(turn)
        try:
            left = None if expires is None else max(0.001, expires - time.monotonic())
            return await self._batches.run(method, calls, left, autoreset, final)
        finally:
            PLACING_TURN.reset(token)
            turn.end()
