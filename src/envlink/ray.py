"""``envlink.ray``: the :class:`~envlink.EnvPool` API with its sessions on Ray actors.

Needs the ``ray`` extra (``pip install 'envlink[ray]'``); ``import envlink`` never
imports Ray. A :class:`RayEnvPool` splits its slots into shards; each shard is an
async Ray actor that owns its sessions as an in-process :class:`~envlink.EnvPool`
on the actor's own event loop. The driver keeps what it needs to survive an
actor: every answer carries the new journal entries of the slots it answered, so
a shard that dies turns into per-slot :class:`~envlink.SessionLostError` with each
session's journal (``on_session_lost="raise"``), or into the episodes rebuilt on a
new shard actor by replay (``"replay"``). Ray's own errors never reach the caller.

Example::

    import ray
    from envlink.ray import RayEnvPool

    ray.init()
    with RayEnvPool(["http://10.0.0.5:8000", "http://10.0.0.6:8000"], 256,
                    shards=4, on_session_lost="replay").sync() as pool:
        batch = pool.reset(seeds=0)
        batch = pool.step([{"message": "hi"}] * 256)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

try:
    import ray
    import ray.exceptions
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("envlink.ray needs Ray: pip install 'envlink[ray]'") from exc
from opentelemetry import propagate

from envlink._client.client import EnvClient, GenericEnvClient, StepResult
from envlink._config import UNSET, UnsetType, check_number, is_int
from envlink._deadlines import bounded
from envlink._errors import (
    ClientClosedError,
    EnvlinkError,
    InvalidActionError,
    SessionLostError,
)
from envlink._pool import (
    AsyncPool,
    Batch,
    BatchReport,
    BatchRunner,
    BatchStarted,
    DriverSlot,
    EndpointView,
    PoolOptions,
    PoolView,
    Shard,
    ShardAnswer,
    ShardSpec,
    ShardTelemetry,
    SlotRestore,
    SlotResult,
    pool_telemetry_hook,
    seed_list,
)
from envlink.names import RAY_RESTART_DIED, RAY_RESTART_UNRESPONSIVE

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

__all__ = ["RayEnvPool", "ShardTelemetry"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")

#: What a shard reserves by default: it waits on sockets, so no CPU; spread over nodes.
DEFAULT_ACTOR_OPTIONS: Mapping[str, Any] = {"num_cpus": 0, "scheduling_strategy": "SPREAD"}


class _ShardLost(Exception):
    """A shard actor died or stopped answering (internal: never reaches the caller)."""

    def __init__(self, shard: int, generation: int, reason: str,
                 kind: str = RAY_RESTART_DIED) -> None:
        super().__init__(reason)
        self.shard = shard
        self.generation = generation
        self.reason = reason
        self.kind = kind


class _NotSent(Exception):
    """Ray could not pickle a call's arguments: nothing reached the shard (internal)."""


class RayEnvPool(AsyncPool[ActT, ObsT]):
    """``size`` sessions over one or several servers, placed on ``shards`` Ray actors.

    The API, the per-slot answers, masks, seeds, autoreset modes, ``min_ready`` and
    the batch deadline are those of :class:`~envlink.EnvPool` (same arguments, same
    :class:`~envlink.Batch`); :meth:`sync` gives the same blocking facade. Slots are
    split into ``shards`` consecutive blocks (slot ``i`` of a pool of 256 on 4
    shards lives on shard ``i // 64``); each shard places its sessions over all the
    endpoints, with its own placement, breakers and in-shard recovery.

    A shard actor that dies (killed, its node lost, its process crashed) or stops
    answering is replaced by a new actor at once. Its sessions are gone with it:

    * ``on_session_lost="raise"``: each of its slots with an open episode answers
      :class:`~envlink.SessionLostError` carrying that episode's journal (now if it
      was in the call, else at its next step) until it is reset; a slot whose reset
      was interrupted is reset on the new actor (a reset may be retried).
    * ``"replay"``: each open episode is rebuilt on the new actor from the driver's
      copy of its journal (reset with the recorded kwargs, every step replayed and
      checked), then the interrupted step is applied once. A slot that cannot be
      rebuilt answers ``SessionLostError``/``ReplayDivergedError``.
    * ``"resume"``: each client resumes on its own server inside a live shard; when
      the shard itself dies, as ``raise``.

    Args:
        endpoints: one base URL, or several; every shard's actor must reach them.
        size: number of sessions (slots).
        shards: number of shard actors (at most ``size``).
        actor_options: options of each shard actor (``ray.remote(...).options``):
            ``num_cpus``, ``resources``, ``scheduling_strategy``, ``runtime_env``...
            Default: ``{"num_cpus": 0, "scheduling_strategy": "SPREAD"}``.
        placement_group: a Ray placement group; shard ``i`` goes to bundle
            ``i % len(bundles)`` (overrides ``scheduling_strategy``).
        telemetry: :class:`ShardTelemetry` (OTLP endpoint, service name, resource
            attributes) for the actors; each adds ``envlink.ray.shard``.
        shard_timeout_margin: with a batch deadline, seconds the driver waits for a
            shard beyond it before it replaces the shard as unresponsive.
        client: as :class:`~envlink.EnvPool`.
        tracer_provider, meter_provider: the driver's providers (default: global).
        **options: the other options of :class:`~envlink.EnvPool`, with its defaults
            (``client_config``, ``on_session_lost``, ``autoreset``,
            ``autoreset_kwargs``, ``batch_timeout``, ``max_inflight``, ``capacity``,
            ``breaker_threshold``, ``breaker_reset_timeout``, ``replay_verify``);
            ``max_inflight`` and ``capacity`` apply per shard. They are pickled to the
            actors with ``client``, so the client class and callables must be
            importable there, and the ``client_config`` picklable (no providers:
            each shard's come from ``telemetry``). ``client_options`` (a mapping,
            deprecated) is turned into a ``client_config`` once, on the driver.

    Raises:
        ValueError: a bad endpoint, size, shard count, mode or option.
        TypeError: ``client`` is neither an EnvClient class nor a callable.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        size: int,
        *,
        shards: int = 2,
        client: type[EnvClient[ActT, ObsT, Any]] | Callable[[str], EnvClient[ActT, ObsT, Any]]
        = GenericEnvClient,  # type: ignore[assignment]
        actor_options: Mapping[str, Any] | None = None,
        placement_group: Any = None,
        telemetry: ShardTelemetry | None = None,
        shard_timeout_margin: float = 30.0,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        **options: Any,
    ) -> None:
        check_number(shards, "shards", integer=True, minimum=1, mistyped=ValueError,
                     expected="a positive integer")
        if is_int(size) and 0 < size < shards:
            raise ValueError(f"shards ({shards}) cannot exceed size ({size})")
        check_number(shard_timeout_margin, "shard_timeout_margin", above=0)
        # The same options, checked the same way, as the in-process pool of each shard.
        pool = PoolOptions(endpoints, size, client=client, **options)
        self._configure(pool, tracer_provider, meter_provider)
        self.shards = shards
        self._hook = pool_telemetry_hook(tracer_provider, meter_provider)
        self._margin = float(shard_timeout_margin)
        base, extra = divmod(size, shards)
        self._bounds: list[tuple[int, int]] = []
        offset = 0
        for s in range(shards):
            n = base + (1 if s < extra else 0)
            self._bounds.append((offset, n))
            offset += n
        self._shard_of = [s for s, (_o, n) in enumerate(self._bounds) for _ in range(n)]
        self._specs = [ShardSpec(shard=s, offset=o, options=pool.for_shard(n),
                                 telemetry=telemetry)
                       for s, (o, n) in enumerate(self._bounds)]
        opts = dict(DEFAULT_ACTOR_OPTIONS if actor_options is None else actor_options)
        self._actor_options: list[dict[str, Any]] = []
        for s in range(shards):
            per = dict(opts)
            if placement_group is not None:
                from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

                bundles = len(placement_group.bundle_specs)
                per["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                    placement_group, placement_group_bundle_index=s % bundles)
            self._actor_options.append(per)
        self._remote = ray.remote(Shard)
        self._actors: list[Any] = [None] * shards
        self._generation = [0] * shards
        self._recovering: dict[int, asyncio.Future[None]] = {}
        for s in range(shards):
            self._spawn(s)
        self._mirrors = [DriverSlot() for _ in range(size)]
        self._views: list[PoolView | None] = [None] * shards
        #: Slots whose session went with a dead shard: their error until reset.
        self._lost: dict[int, EnvlinkError] = {}
        self._running: set[int] = set()
        # Whole-batch calls cancelled on the driver that their shards still run, and
        # sends whose caller was cancelled (each still reaches its shard or answers).
        self._cancelled: set[asyncio.Future[Any]] = set()
        # Ready-first: the in-process pool's state, each sent step a future the shard's
        # collector answers; the actions are kept to send again to a new shard actor.
        self._batches: BatchRunner[ObsT] = BatchRunner(size, self._hook, shards=shards)
        self._sent_actions: dict[int, Any] = {}
        # The sent slots whose step went to their shard actor: the only ones its
        # collector waits for (a send still under way is not in the actor yet).
        self._submitted: set[int] = set()
        self._send_deadline: float | None = None
        self._collectors: dict[int, asyncio.Task[None]] = {}

    # ------------------------------------------------------------------ properties

    def shard_of(self, index: int) -> int:
        """The shard that owns slot ``index``."""
        return self._shard_of[index]

    def actors(self) -> list[Any]:
        """The current shard actor handles (a shard replaced after a death has a new one)."""
        return list(self._actors)

    def view(self) -> PoolView:
        """A snapshot as of each shard's last answer: endpoints summed over shards.

        An endpoint's breaker is the worst of the shards' (``open`` over
        ``half_open`` over ``closed``); a slot whose session went with a dead shard is
        ``lost``.
        """
        rank = {"closed": 0, "half_open": 1, "open": 2}
        endpoints: list[EndpointView] = []
        for e, url in enumerate(self.endpoints):
            views = [v.endpoints[e] for v in self._views if v is not None]
            states: dict[str, int] = {}
            for v in views:
                for k, n in v.states.items():
                    states[k] = states.get(k, 0) + n
            limits = [v.server_max for v in views if v.server_max is not None]
            endpoints.append(EndpointView(
                url=url, breaker=max((v.breaker for v in views), key=rank.__getitem__,
                                     default="closed"),
                consecutive_failures=max((v.consecutive_failures for v in views), default=0),
                sessions=sum(v.sessions for v in views),
                server_max=min(limits) if limits else None, states=states))
        slots: list[str] = []
        where: list[str | None] = []
        for s, (_o, n) in enumerate(self._bounds):
            shard_view = self._views[s]
            slots += list(shard_view.slots) if shard_view is not None else ["empty"] * n
            where += (list(shard_view.slot_endpoints) if shard_view is not None
                      else [None] * n)
        for i in self._lost:
            slots[i], where[i] = "lost", None
        return PoolView(endpoints=tuple(endpoints), slots=tuple(slots),
                        slot_endpoints=tuple(where))

    # ------------------------------------------------------------------ batch calls

    async def reset(self, seeds: int | Sequence[int | None] | None = None, *,
                    mask: Sequence[bool] | None = None,
                    timeout: float | UnsetType | None = UNSET,
                    **kwargs: Any) -> Batch[ObsT]:
        """Start a new episode in every slot (or the masked ones); as :meth:`EnvPool.reset`.

        Raises:
            ValueError: bad seeds or mask, or a slot still has a step in flight.
            ClientClosedError: the pool is closed.
        """
        chosen = self._chosen(mask)
        per_slot = seed_list(seeds, self.size)
        seconds = self._options.seconds(timeout)
        return await self._batch("reset", chosen, per_slot, seconds, dict(kwargs))

    async def step(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None,
                   *, timeout: float | UnsetType | None = UNSET) -> Batch[ObsT]:
        """One action per slot (or per masked slot); as :meth:`EnvPool.step`.

        Raises:
            ValueError: ``actions`` or ``mask`` has the wrong length, or a slot still
                has a step in flight.
            ClientClosedError: the pool is closed.
        """
        chosen = self._chosen(mask, actions)
        seconds = self._options.seconds(timeout)
        return await self._batch("step", chosen, list(actions), seconds, {})

    async def step_send(self, actions: Sequence[ActT | None],
                        mask: Sequence[bool] | None = None, *,
                        timeout: float | UnsetType | None = UNSET) -> None:
        """Start one step per slot (or per masked slot); collect with :meth:`step_recv`.

        Raises:
            ValueError: as :meth:`step`.
            ClientClosedError: the pool is closed.
        """
        chosen = self._chosen(mask, actions)
        seconds = self._options.seconds(timeout)
        self._send_deadline = seconds
        with BatchReport(self._hook, BatchStarted("step_send", self.size, len(chosen),
                                                  shards=self.shards)):
            carrier = _carrier()
            for i in chosen:
                self._sent_actions[i] = actions[i]
            self._batches.expect(chosen)
            for i in chosen:
                if i in self._lost:
                    self._batches.answer(i, self._lost[i])
            groups = self._group([i for i in chosen if i not in self._lost])
            self._submitted.difference_update(chosen)
            # Each shard's send runs to its end even if the caller is cancelled, as the
            # whole send of an EnvPool does: every slot is then sent, or answers why not.
            sends = asyncio.gather(*(self._send_shard(s, slots, carrier)
                                     for s, slots in groups.items()))
            try:
                await asyncio.shield(sends)
            except asyncio.CancelledError:
                self._cancelled.add(sends)
                sends.add_done_callback(self._cancelled.discard)
                raise

    async def step_recv(self, min_ready: int | None = None, *,
                        timeout: float | None = None) -> Batch[ObsT]:
        """Collect the answers of :meth:`step_send`; as :meth:`EnvPool.step_recv`.

        Raises:
            ValueError: ``min_ready`` is not in ``1..len(in flight)``.
        """
        try:
            batch = await self._batches.recv(min_ready, timeout)
        except BaseException:
            # A caller's bug (or a cancel): the slots it collected are no longer in flight.
            inflight = self._batches.inflight
            for i in [i for i in self._sent_actions if i not in inflight]:
                del self._sent_actions[i]
            raise
        for i in batch.ready:
            self._sent_actions.pop(i, None)
        return batch

    # ------------------------------------------------------------------ lifecycle

    async def flush_telemetry(self, timeout_s: float = 10.0) -> bool:
        """Make every shard actor export what it recorded so far (OTLP).

        Returns:
            Whether every live shard flushed within the timeout.
        """
        results = await asyncio.gather(
            *(self._call(s, "flush_telemetry", timeout_s, wait=timeout_s + self._margin)
              for s in range(self.shards)), return_exceptions=True)
        return all(r is True for r in results)

    async def close(self) -> None:
        """Cancel what is in flight, close every session and stop the actors. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in self._collectors.values():
            task.cancel()
        await asyncio.gather(*self._collectors.values(), return_exceptions=True)
        self._collectors.clear()
        await self._batches.cancel_all()  # a step_recv waiting gets ClientClosedError
        self._sent_actions.clear()
        self._submitted.clear()
        await asyncio.gather(*(self._call(s, "close", wait=self._margin)
                               for s in range(self.shards)), return_exceptions=True)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        # With the actors gone, what a cancelled batch still waited for ends now.
        await asyncio.gather(*self._cancelled, return_exceptions=True)

    # ------------------------------------------------------------------ batches

    async def _batch(self, method: str, chosen: list[int], per_slot: list[Any],
                     seconds: float | None, kwargs: dict[str, Any]) -> Batch[ObsT]:
        started = BatchStarted(method, self.size, len(chosen), shards=self.shards)
        with BatchReport(self._hook, started) as report:
            carrier = _carrier()
            items: list[SlotResult[ObsT]] = [None] * self.size
            autoreset: set[int] = set()
            final: dict[int, StepResult[ObsT]] = {}
            if method == "reset":
                for i in chosen:
                    self._lost.pop(i, None)
            else:
                for i in chosen:
                    if i in self._lost:
                        items[i] = self._lost[i]
            groups = self._group([i for i in chosen if items[i] is None])
            running = [i for slots in groups.values() for i in slots]
            self._running.update(running)
            # Every shard answers before a caller's bug is raised, as every slot of an
            # EnvPool does: no slot is left running, every answer is kept.
            work = asyncio.gather(*(
                self._shard_batch(method, s, slots, per_slot, seconds, kwargs, carrier)
                for s, slots in groups.items()), return_exceptions=True)
            try:
                outcomes = await asyncio.shield(work)
            except asyncio.CancelledError:
                # A cancel does not reach the actors: the slots stay busy (and their
                # answers are still kept) until the shards answer.
                def answered(_: asyncio.Future[Any]) -> None:
                    self._running.difference_update(running)
                    self._cancelled.discard(work)

                self._cancelled.add(work)
                work.add_done_callback(answered)
                raise
            self._running.difference_update(running)
            raised: BaseException | None = None
            for outcome in outcomes:  # shard order is slot order: the first is EnvPool's
                if isinstance(outcome, BaseException):
                    raised = raised or outcome
                    continue
                answers, auto, fin, bug = outcome
                raised = raised or bug
                for i, r in answers.items():
                    items[i] = r
                autoreset |= auto
                final.update(fin)
            if raised is not None:
                raise raised
            ok = {i for i in chosen if not isinstance(items[i], EnvlinkError)}
            batch: Batch[ObsT] = Batch(items, ready=chosen, autoreset=autoreset & ok,
                                       final=final)
            report.batch = batch
        return batch

    async def _shard_batch(self, method: str, s: int, slots: list[int], per_slot: list[Any],
                           seconds: float | None, kwargs: dict[str, Any],
                           carrier: dict[str, str]
                           ) -> tuple[dict[int, SlotResult[ObsT]], set[int],
                                      dict[int, StepResult[ObsT]], Exception | None]:
        """Shard ``s``'s part of a batch: its answers, autoresets, terminal steps, and
        the caller's bug it raised once its slots had answered (their mirrors kept)."""
        answers: dict[int, SlotResult[ObsT]] = {}
        try:
            answer = await self._call_slots(method, method, s, slots, per_slot, seconds,
                                            kwargs, carrier, answers)
        except _ShardLost as lost:
            if self._closed:  # close() stopped the actor under a cancelled batch
                return {i: ClientClosedError("the pool was closed during the call")
                        for i in slots}, set(), {}, None
            await self._recover(lost, carrier)
            if method == "reset":
                for i in slots:
                    self._lost.pop(i, None)
            answers = {i: self._lost[i] for i in slots if i in self._lost}
            redo = [i for i in slots if i not in self._lost]
            if not redo:
                return answers, set(), {}, None
            try:
                answer = await self._call_slots(method, method, s, redo, per_slot, seconds,
                                                kwargs, carrier, answers)
            except _ShardLost as again:
                for i in redo:
                    answers[i] = self._lose(i, again)
                return answers, set(), {}, None
        if answer is None:  # Ray could pickle none of them: nothing was sent
            return answers, set(), {}, None
        got, auto, fin = self._absorb(s, answer)
        answers.update(got)
        return answers, auto, fin, answer.raised

    async def _call_slots(self, method: str, kind: str, s: int, slots: list[int],
                          per_slot: Sequence[Any] | Mapping[int, Any], seconds: float | None,
                          kwargs: dict[str, Any], carrier: dict[str, str],
                          refused: dict[int, SlotResult[ObsT]]) -> Any:
        """Call shard ``s`` for ``slots`` (``kind``: their values are actions or seeds).

        A slot whose value Ray cannot pickle answers, in ``refused``, the
        :class:`~envlink.InvalidActionError` an EnvPool answers for a value the wire
        cannot carry, and the others are sent: still one call to the actor, since the
        refused one never left the driver. ``None``: nothing could be sent.
        """
        try:
            return await self._call(s, method, *self._args(kind, s, slots, per_slot, seconds,
                                                           kwargs, carrier),
                                    wait=self._wait(seconds))
        except _NotSent as first:
            reason = str(first)
            root = "action" if kind == "step" else "reset"
            for i in slots:
                try:
                    ray.cloudpickle.dumps(per_slot[i])  # type: ignore[no-untyped-call]
                except Exception as exc:
                    refused[i] = InvalidActionError(root, (
                        f"slot {i}: cannot be pickled to its shard actor "
                        f"({type(exc).__name__}: {exc})"))
            rest = [i for i in slots if i not in refused]
            if rest and len(rest) < len(slots):
                try:
                    return await self._call(s, method, *self._args(
                        kind, s, rest, per_slot, seconds, kwargs, carrier),
                        wait=self._wait(seconds))
                except _NotSent as again:
                    reason = str(again)
            for i in rest:  # not a slot's own value: the call's shared arguments
                refused[i] = InvalidActionError(root, (
                    f"slot {i}: the call to its shard actor cannot be pickled ({reason})"))
            return None

    def _args(self, method: str, s: int, slots: list[int],
              per_slot: Sequence[Any] | Mapping[int, Any],
              seconds: float | None, kwargs: dict[str, Any],
              carrier: dict[str, str]) -> tuple[Any, ...]:
        offset, n = self._bounds[s]
        mask = [False] * n
        values: list[Any] = [None] * n
        for i in slots:
            mask[i - offset] = True
            values[i - offset] = per_slot[i]
        if method == "reset":
            return values, mask, seconds, kwargs, carrier
        return values, mask, seconds, carrier

    def _absorb(self, s: int, answer: ShardAnswer
                ) -> tuple[dict[int, SlotResult[ObsT]], set[int], dict[int, StepResult[ObsT]]]:
        offset = self._bounds[s][0]
        for j, mirror in answer.mirrors.items():
            self._mirrors[offset + j].absorb(mirror)
        if answer.view is not None:
            self._views[s] = answer.view
        got = {offset + j: answer.items[j] for j in answer.ready if j not in answer.bugs}
        return (got, {offset + j for j in answer.autoreset},
                {offset + j: r for j, r in answer.final.items()})

    # ------------------------------------------------------------------ ready-first

    async def _send_shard(self, s: int, slots: list[int], carrier: dict[str, str]) -> None:
        if self._closed:  # closed before this send started: its slots are not in flight
            return
        seconds = self._send_deadline
        try:
            await self._submit(s, slots, seconds, carrier)
        except _ShardLost as lost:
            if self._closed:  # close() stopped the actor; cancel_all answered the slots
                return
            await self._redo_sent(lost, slots, carrier)
        if self._pending(s) and s not in self._collectors and not self._closed:
            self._collectors[s] = asyncio.ensure_future(self._collect(s))

    async def _submit(self, s: int, slots: list[int], seconds: float | None,
                      carrier: dict[str, str]) -> None:
        """Send ``slots``' steps to shard ``s`` (one call). A slot whose action Ray cannot
        pickle answers as in an EnvPool (see :meth:`_call_slots`); a send the shard
        refused sent none of them: :meth:`step_recv` raises its error, naming them."""
        self._submitted.update(slots)
        refused: dict[int, SlotResult[ObsT]] = {}
        try:
            await self._call_slots("step_send", "step", s, slots, self._sent_actions, seconds,
                                   {}, carrier, refused)
        except _ShardLost:
            raise
        except Exception as exc:
            self._batches.fail(slots, _naming(
                exc, slots, f"their steps were not sent to shard actor {s}"))
        for i, error in refused.items():
            self._batches.answer(i, error)

    async def _redo_sent(self, lost: _ShardLost, slots: list[int],
                         carrier: dict[str, str]) -> None:
        """After a shard died with sent steps: answer the lost ones, send the others again."""
        await self._recover(lost, carrier)
        s = lost.shard
        redo = [i for i in slots if i not in self._lost]
        for i in slots:
            if i in self._lost:
                self._batches.answer(i, self._lost[i])
        if redo:
            try:
                await self._submit(s, redo, self._send_deadline, carrier)
            except _ShardLost as again:
                for i in redo:
                    self._batches.answer(i, self._lose(i, again))

    def _pending(self, s: int) -> list[int]:
        """Shard ``s``'s slots whose step it was sent and has not answered."""
        offset, n = self._bounds[s]
        return [i for i in self._batches.pending()
                if offset <= i < offset + n and i in self._submitted]

    async def _collect(self, s: int) -> None:
        """Collect shard ``s``'s sent steps as they answer, into the driver's buffer."""
        try:
            while self._pending(s):
                try:
                    answer = await self._call(s, "step_recv", _carrier(),
                                              wait=self._wait(self._send_deadline))
                except _ShardLost as lost:
                    await self._redo_sent(lost, self._pending(s), _carrier())
                    continue
                got, auto, fin = self._absorb(s, answer)
                batches = self._batches
                batches.sent_autoreset |= auto
                batches.sent_final.update(fin)
                for i, result in got.items():
                    batches.answer(i, result)
                offset = self._bounds[s][0]
                for j, bug in answer.bugs.items():  # raised by recv for its own slot only
                    batches.fail([offset + j], bug)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # The shard's receive raised before it collected a step (it answers each
            # collected one, a result that cannot cross included), so it holds none of
            # these: recv raises it, with the driver's slot numbers.
            pending = self._pending(s)
            self._batches.fail(pending, _naming(
                exc, pending, f"their shard actor ({s}) could not collect them"))
        finally:
            self._collectors.pop(s, None)

    # ------------------------------------------------------------------ shards

    def _spawn(self, s: int) -> None:
        self._actors[s] = self._remote.options(**self._actor_options[s]).remote(
            self._specs[s], ray.cloudpickle.dumps)
        self._generation[s] += 1

    async def _call(self, s: int, method: str, *args: Any, wait: float | None) -> Any:
        """Call shard ``s``; Ray's errors become :class:`_ShardLost` or the shard's own."""
        actor, generation = self._actors[s], self._generation[s]
        expiry = None
        try:
            ref = getattr(actor, method).remote(*args)
        except TypeError as exc:  # what Ray raises for an argument it cannot pickle
            lines = str(exc).strip().splitlines()  # (then a long report of Ray's)
            raise _NotSent(lines[0] if lines else type(exc).__name__) from exc
        try:
            async with bounded(wait) as expiry:
                return await ref
        except ray.exceptions.RayTaskError as exc:
            # (Ray raises a subclass of both RayTaskError and the shard's exception.)
            cause = getattr(exc, "cause", None)
            if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
                raise cause from None  # the shard's own error (a caller's bug)
            raise _ShardLost(s, generation, _reason(exc)) from None
        except ray.exceptions.RayError as exc:
            raise _ShardLost(s, generation, _reason(exc)) from None
        except TimeoutError:
            if expiry is None or not expiry.expired():
                raise
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
            raise _ShardLost(s, generation, f"no answer within {wait:g} s",
                             RAY_RESTART_UNRESPONSIVE) from None

    async def _recover(self, lost: _ShardLost, carrier: dict[str, str]) -> None:
        """Replace a dead shard's actor (once per death) and take over its slots."""
        s = lost.shard
        running = self._recovering.get(s)
        if running is not None:
            await asyncio.shield(running)
            return
        if self._generation[s] != lost.generation:
            return  # already replaced
        future = asyncio.get_running_loop().create_future()
        self._recovering[s] = future
        try:
            await self._replace(lost, carrier)
        finally:
            del self._recovering[s]
            future.set_result(None)

    async def _replace(self, lost: _ShardLost, carrier: dict[str, str]) -> None:
        s = lost.shard
        offset, n = self._bounds[s]
        self._hook.shard_replaced(s, lost.kind, lost.reason, self.on_session_lost)
        with contextlib.suppress(Exception):
            ray.kill(self._actors[s], no_restart=True)
        self._spawn(s)
        self._views[s] = None
        records: dict[int, SlotRestore] = {}
        for i in range(offset, offset + n):
            m = self._mirrors[i]
            replay = (self.on_session_lost == "replay" and m.active and i not in self._lost
                      and m.journal is not None and m.journal.replayable)
            if m.active and i not in self._lost and not replay:
                self._lost[i] = self._lose(i, lost)
            records[i - offset] = m.restore(replay=replay)
            if not replay:
                m.journal, m.actions = None, None
        try:
            outcome = await self._call(s, "restore", records, carrier, wait=None)
        except _ShardLost as again:
            for j, r in records.items():
                if r.journal is not None:
                    self._lost[offset + j] = self._lose(offset + j, again)
            return
        for j, error in outcome.items():
            if error is not None:
                self._lost[offset + j] = error
                self._mirrors[offset + j].journal = None

    def _lose(self, i: int, lost: _ShardLost) -> SessionLostError:
        journal = self._mirrors[i].journal
        return SessionLostError(
            f"slot {i}: its shard actor ({lost.shard}) was lost ({lost.reason}) and the "
            "session with it", journal=journal.snapshot() if journal is not None else None)

    # ------------------------------------------------------------------ helpers

    def _group(self, slots: list[int]) -> dict[int, list[int]]:
        groups: dict[int, list[int]] = {}
        for i in slots:
            groups.setdefault(self._shard_of[i], []).append(i)
        return groups

    def _wait(self, seconds: float | None) -> float | None:
        return None if seconds is None else seconds + self._margin

    def _chosen(self, mask: Sequence[bool] | None,
                actions: Sequence[Any] | None = None) -> list[int]:
        if self._closed:
            raise ClientClosedError("the pool is closed")
        return self._options.select(mask, actions, self._busy)

    def _busy(self, chosen: list[int]) -> list[int]:
        return [i for i in chosen if i in self._batches.inflight or i in self._running]

    def __repr__(self) -> str:
        return (f"<RayEnvPool size={self.size} shards={self.shards} "
                f"endpoints={len(self.endpoints)}{' closed' if self._closed else ''}>")


def _carrier() -> dict[str, str]:
    """The current trace context (W3C ``traceparent``), to carry into a shard actor."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def _naming(exc: BaseException, slots: list[int], what: str) -> BaseException:
    """``exc`` as an error of its type whose message names the driver's ``slots``
    (a RuntimeError with its type and text where the type takes no message)."""
    text = f"slots {slots}: {what}: {exc}"
    try:
        named = type(exc)(text)
    except Exception:
        named = RuntimeError(f"{type(exc).__qualname__}: {text}")
    named.__cause__ = exc
    return named


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


if TYPE_CHECKING:
    from envlink._pool import EnvPool

    def _both_pools_are_whole(url: str) -> list[AsyncPool[Any, Any]]:
        """Never run: mypy proves here that each pool is a whole :class:`AsyncPool`
        (it refuses to build a class that left out a member of the interface, and to
        list it as one whose members do not match)."""
        return [EnvPool(url, 1), RayEnvPool(url, 1)]
