"""One shard of a :class:`~envlink.ray.RayEnvPool`: an in-process pool inside a Ray actor.

A shard owns ``K`` consecutive slots of the pool as an ordinary
:class:`~envlink.EnvPool` on the actor's own event loop (Ray runs the methods of an
actor whose methods are coroutines on one loop: no bridge thread). Each answer
carries, for every slot it answered, what the driver needs to survive the actor:
the new journal entries and the slot's autoreset bookkeeping (:class:`SlotMirror`).

This module imports no Ray: :mod:`envlink.ray` wraps :class:`Shard` with
``ray.remote``; the class is usable (and tested) as a plain object too.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import propagate

from envlink._errors import EnvlinkError
from envlink._events.pool_events import BatchReport, BatchStarted, PoolHook
from envlink._pool.options import PoolOptions
from envlink._pool.pool import EnvPool, pool_telemetry_hook
from envlink._pool.results import Batch, PoolView, SlotResult
from envlink._sansio.journal import EpisodeJournal, JournalEntry

if TYPE_CHECKING:
    from envlink.telemetry import TelemetryHandle

__all__ = ["DriverSlot", "RaySpan", "Shard", "ShardAnswer", "ShardSpec", "ShardTelemetry",
           "SlotMirror", "SlotRestore"]

#: The resource attribute naming a shard on everything its actor exports.
RESOURCE_SHARD = "envlink.ray.shard"


class Dumps(Protocol):
    """A pickler's ``dumps`` that can pass buffers out of band (protocol 5)."""

    def __call__(self, obj: Any, protocol: int | None = None, *,
                 buffer_callback: Callable[[pickle.PickleBuffer], Any] | None = None,
                 ) -> bytes: ...


@dataclass(frozen=True)
class ShardTelemetry:
    """How shard actors export telemetry (OTLP), set once on the driver.

    Attributes:
        otlp_endpoint: base URL of an OTLP receiver (a Collector) reachable from
            every node; ``None``: the actors export nothing.
        otlp_protocol: ``"http/protobuf"`` (default) or ``"grpc"``.
        service_name: ``service.name`` of the actors' telemetry.
        resource_attributes: more resource attributes; each actor adds
            ``envlink.ray.shard`` (its shard number).
        metric_export_interval: seconds between metric exports.
    """

    otlp_endpoint: str | None = None
    otlp_protocol: str | None = None
    service_name: str = "envlink-ray-shard"
    resource_attributes: Mapping[str, Any] = field(default_factory=dict)
    metric_export_interval: float | None = None


@dataclass(frozen=True)
class ShardSpec:
    """Everything a shard actor needs to build its pool (pickled to the actor).

    Attributes:
        shard: the shard's number.
        offset: the driver's number of the shard's first slot.
        options: the shard's pool (its size, the driver's endpoints and options; an
            ``autoreset_kwargs`` is called with the driver's slot numbers).
        telemetry: how the actor exports its telemetry.
    """

    shard: int
    offset: int
    options: PoolOptions
    telemetry: ShardTelemetry | None = None


@dataclass(frozen=True)
class SlotMirror:
    """A slot's state after an answer, as the driver keeps it.

    ``episode_id`` ``None``: the slot has no session. Otherwise ``entries`` are the
    journal's entries from position ``base`` (``base == 0`` with ``head`` set: a new
    episode, the whole journal).
    """

    episode_id: str | None
    base: int = 0
    entries: tuple[JournalEntry, ...] = ()
    head: EpisodeJournal | None = None
    truncated: bool = False
    unknown_steps: tuple[str, ...] = ()
    steps_applied: int = 0
    actions: tuple[Any, ...] | None = None
    actions_base: int = 0
    needs_reset: bool = False
    episodes: int = 0
    reset_kwargs: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ShardAnswer:
    """A shard's batch, in local slot numbers, with the mirrors of its answered slots.

    ``bugs``: the ready slots whose step raised a caller's bug (a ready-first receive
    collects them per slot, so the driver raises each for its own slot). ``raised``:
    what a whole-batch call (``reset``, ``step``) raised once each of its slots had
    answered (a caller's bug, or a result that cannot cross to the driver); ``mirrors``
    still hold every slot of the call, so the driver keeps them before it raises it.
    ``offset``: the driver's number of the shard's first slot (to name a slot in an
    error raised on the driver).
    """

    items: list[SlotResult[Any]]
    ready: tuple[int, ...]
    stragglers: tuple[int, ...]
    autoreset: tuple[int, ...]
    final: dict[int, Any]
    mirrors: dict[int, SlotMirror]
    view: PoolView | None = None
    bugs: dict[int, Exception] = field(default_factory=dict)
    raised: Exception | None = None
    offset: int = 0

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        # A shard's answer crosses with its results pickled by the shard (Ray then copies
        # bytes): pickled once, the shard knows a slot that cannot cross, and a failure to
        # unpickle them on the driver is answered for their slots, not as a dead shard.
        # Their buffers (large arrays) ride beside the bytes, which Ray's protocol 5
        # passes out of band, as it did the results themselves.
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        packed: tuple[bool, bytes, tuple[pickle.PickleBuffer, ...]] | None = (
            self.__dict__.get("_packed"))
        if packed is None:
            return _arrive, (fields, False, None)
        fields["items"] = len(self.items)
        fields["final"] = None
        whole, blob, buffers = packed
        if not buffers:
            return _arrive, (fields, whole, blob)
        if not isinstance(protocol, int) or protocol < 5:  # a PickleBuffer needs 5
            return _arrive, (fields, whole, blob, tuple(_copied(b) for b in buffers))
        return _arrive, (fields, whole, blob, buffers)


@dataclass(frozen=True)
class SlotRestore:
    """What a new shard needs to take over one slot of a dead one."""

    journal: EpisodeJournal | None
    actions: list[Any] | None
    needs_reset: bool
    episodes: int
    reset_kwargs: Mapping[str, Any]


@dataclass
class DriverSlot:
    """What the driver keeps of one slot, from its shard's answers (enough to rebuild it)."""

    journal: EpisodeJournal | None = None
    actions: list[Any] | None = None
    needs_reset: bool = False
    episodes: int = 0
    reset_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        """An episode is open on a session (not waiting for its automatic reset)."""
        return self.journal is not None and not self.needs_reset

    def absorb(self, m: SlotMirror) -> None:
        """Apply a shard's mirror of this slot."""
        self.needs_reset, self.episodes = m.needs_reset, m.episodes
        self.reset_kwargs = dict(m.reset_kwargs)
        if m.episode_id is None:
            self.journal, self.actions = None, None
            return
        journal = self.journal
        if (m.head is not None or journal is None or journal.episode_id != m.episode_id
                or len(journal.entries) != m.base):
            # A new episode, or a delta that does not fit (never expected): start from the
            # head; without one the copy has no reset answer and is not replayable.
            head = m.head or EpisodeJournal(episode_id=m.episode_id)
            journal = EpisodeJournal(reset_kwargs=dict(head.reset_kwargs),
                                     reset_response_json=head.reset_response_json,
                                     max_steps=head.max_steps, episode_id=m.episode_id,
                                     keep_steps=head.keep_steps)
            self.journal = journal
        journal.entries.extend(m.entries)
        journal.truncated = m.truncated
        journal.steps_applied = m.steps_applied
        # Steps whose outcome the shard's client does not know: while any is left the
        # copy is not replayable either (a replay could silently diverge).
        journal.carry_unknown(m.unknown_steps)
        if m.actions is None:
            self.actions = None
        else:
            base = [] if self.actions is None else self.actions[:m.actions_base]
            self.actions = base + list(m.actions)

    def restore(self, *, replay: bool) -> SlotRestore:
        """What a new shard needs: the episode to replay (``replay``), else the flags only."""
        return SlotRestore(journal=self.journal if replay else None,
                           actions=self.actions if replay else None,
                           needs_reset=self.needs_reset, episodes=self.episodes,
                           reset_kwargs=dict(self.reset_kwargs))


class RaySpan:
    """Reports the shard's part of a driver's batch, in the driver's trace context."""

    def __init__(self, hook: PoolHook, shard: int, size: int) -> None:
        self.hook = hook
        self.shard = shard
        self.size = size

    @contextlib.contextmanager
    def __call__(self, method: str, carrier: Mapping[str, str] | None,
                 slots: int) -> Iterator[None]:
        from opentelemetry import context

        token = context.attach(propagate.extract(dict(carrier or {})))
        try:
            with BatchReport(self.hook, BatchStarted(method, self.size, slots,
                                                     shard=self.shard)):
                yield
        finally:
            context.detach(token)


class Shard:
    """A shard's pool and its mirrors (the body of the Ray actor).

    Args:
        spec: the shard's number, its slots, the pool options and telemetry.
        dumps: what pickles an answer's results for the driver where the standard
            pickler cannot (``envlink.ray`` gives Ray's own, which pickles by value
            what only the actor can import); called with protocol 5 and a
            ``buffer_callback``.
    """

    def __init__(self, spec: ShardSpec, dumps: Dumps = pickle.dumps) -> None:
        self.spec = spec
        self._dumps = dumps
        self._handle: TelemetryHandle | None = None
        tracer_provider = meter_provider = None
        if spec.telemetry is not None and spec.telemetry.otlp_endpoint:
            from envlink.telemetry import configure

            t = spec.telemetry
            self._handle = configure(
                service_name=t.service_name,
                resource_attributes={**t.resource_attributes,
                                     RESOURCE_SHARD: str(spec.shard)},
                otlp_endpoint=t.otlp_endpoint,
                otlp_protocol=t.otlp_protocol,  # type: ignore[arg-type]
                metric_export_interval=t.metric_export_interval, set_global=False)
            tracer_provider = self._handle.tracer_provider
            meter_provider = self._handle.meter_provider
        o = spec.options
        user = o.autoreset_kwargs
        offset = spec.offset
        arguments = o.arguments()
        arguments["autoreset_kwargs"] = (None if user is None
                                         else lambda i, episode: user(offset + i, episode))
        self.pool: EnvPool[Any, Any] = EnvPool(**arguments, tracer_provider=tracer_provider,
                                               meter_provider=meter_provider)
        self._span = RaySpan(pool_telemetry_hook(tracer_provider, meter_provider), spec.shard,
                             o.size)
        # Per slot: the episode id, journal entries and typed actions already mirrored.
        self._sent: list[tuple[str | None, int, int]] = [(None, 0, 0)] * o.size

    async def reset(self, seeds: Sequence[int | None], mask: Sequence[bool],
                    timeout: float | None, kwargs: Mapping[str, Any],
                    carrier: Mapping[str, str] | None = None) -> ShardAnswer:
        """The pool's ``reset`` on this shard's slots (seeds given per local slot); what
        it raises is answered in ``raised``."""
        try:
            with self._span("reset", carrier, sum(mask)):
                batch = await self.pool.reset(list(seeds), mask=list(mask), timeout=timeout,
                                              **kwargs)
        except Exception as exc:
            return self._raised(mask, exc)
        return self._packed(self._answer(batch), whole=True)

    async def step(self, actions: Sequence[Any], mask: Sequence[bool],
                   timeout: float | None,
                   carrier: Mapping[str, str] | None = None) -> ShardAnswer:
        """The pool's ``step`` on this shard's slots; what it raises is answered in
        ``raised``."""
        try:
            with self._span("step", carrier, sum(mask)):
                batch = await self.pool.step(list(actions), list(mask), timeout=timeout)
        except Exception as exc:
            return self._raised(mask, exc)
        return self._packed(self._answer(batch), whole=True)

    async def step_send(self, actions: Sequence[Any], mask: Sequence[bool],
                        timeout: float | None,
                        carrier: Mapping[str, str] | None = None) -> None:
        """The pool's ``step_send`` on this shard's slots."""
        with self._span("step", carrier, sum(mask)):
            await self.pool.step_send(list(actions), list(mask), timeout=timeout)

    async def step_recv(self, carrier: Mapping[str, str] | None = None) -> ShardAnswer:
        """Wait until at least one sent step answered; collect every answered one.

        Steps sent while it waits count too: the first answer of any of them ends the
        wait (not only the answers of the steps in flight when the wait began). A
        step that raised a caller's bug is answered in ``bugs``, not raised, so that
        the other slots' answers and mirrors still reach the driver. So is an answer
        that could not be pickled to the driver (its slot is collected here either way),
        or, once there, unpickled.
        """
        bugs: dict[int, Exception] = {}
        with self._span("recv", carrier, 1):
            batch = await self.pool.step_recv_first(bugs=bugs)
        return self._packed(self._answer(batch, bugs), whole=False)

    async def restore(self, slots: Mapping[int, SlotRestore],
                      carrier: Mapping[str, str] | None = None
                      ) -> dict[int, EnvlinkError | None]:
        """Take over slots of a dead shard; per slot ``None`` or why it is lost."""
        async def one(index: int, r: SlotRestore) -> EnvlinkError | None:
            try:
                await self.pool.restore_slot(index, r.journal, r.actions,
                                            needs_reset=r.needs_reset, episodes=r.episodes,
                                            reset_kwargs=r.reset_kwargs)
            except EnvlinkError as exc:
                return exc
            return None

        with self._span("restore", carrier, len(slots)):
            outcomes = await asyncio.gather(*(one(i, r) for i, r in slots.items()))
        return dict(zip(slots, outcomes, strict=True))

    async def view(self) -> PoolView:
        """The shard pool's view (local slot numbers)."""
        return self.pool.view()

    async def flush_telemetry(self, timeout_s: float = 10.0) -> bool:
        """Export what the actor recorded so far (no-op without telemetry)."""
        return self._handle.force_flush(timeout_s) if self._handle is not None else True

    async def close(self) -> None:
        """Close the pool's sessions and stop the actor's telemetry (flushing it); the
        episodes they recorded are on disk when it returns (the actor is killed next)."""
        try:
            await self.pool.close()
            config = self.spec.options.client_config
            flush = getattr(config.recorder if config is not None else None, "flush", None)
            if callable(flush):
                await asyncio.to_thread(flush)
        finally:
            if self._handle is not None:
                self._handle.shutdown(10.0)

    def _answer(self, batch: Batch[Any], bugs: dict[int, Exception] | None = None
                ) -> ShardAnswer:
        mirrors = {i: self._mirror(i) for i in batch.ready}
        return ShardAnswer(items=list(batch), ready=batch.ready, stragglers=batch.stragglers,
                           autoreset=batch.autoreset, final=dict(batch.final),
                           mirrors=mirrors, view=self.pool.view(),
                           bugs={i: _portable(exc) for i, exc in (bugs or {}).items()},
                           offset=self.spec.offset)

    def _packed(self, answer: ShardAnswer, *, whole: bool) -> ShardAnswer:
        """``answer`` with its results pickled once, here, for the driver.

        A slot whose result cannot be pickled is answered instead as a bug for its slot
        (a ready-first receive: one that failed to cross would lose the slots it
        collected while the driver could not tell them from those still in flight) or,
        in a whole-batch call, raised once its slots answered, their mirrors kept.
        """
        try:
            blob, buffers = _dumps((answer.items, answer.final), self._dumps)
        except Exception:
            failed: dict[int, Exception] = {}
            for j, item in enumerate(answer.items):  # rare: find the slots at fault
                try:
                    _dumps((item, answer.final.get(j)), self._dumps)
                except Exception as exc:
                    failed[j] = RuntimeError(
                        f"slot {self.spec.offset + j}: its answer could not be sent from "
                        f"its shard actor to the driver ({type(exc).__qualname__}: {exc})")
            answer = _without(answer, failed, whole=whole)
            blob, buffers = _dumps((answer.items, answer.final), self._dumps)
        object.__setattr__(answer, "_packed", (whole, blob, buffers))
        return answer

    def _raised(self, mask: Sequence[bool], exc: Exception) -> ShardAnswer:
        """A whole-batch call that raised: the pool raises a caller's bug only once every
        slot answered, so every slot of the call is mirrored (a driver that raises it
        keeps their journals)."""
        mirrors = {i: self._mirror(i) for i, chosen in enumerate(mask) if chosen}
        return ShardAnswer(items=[None] * len(mask), ready=(), stragglers=(), autoreset=(),
                           final={}, mirrors=mirrors, view=self.pool.view(),
                           raised=_portable(exc), offset=self.spec.offset)

    def _mirror(self, index: int) -> SlotMirror:
        slot = self.pool.slot_record(index)
        client = slot.client
        needs_reset, episodes = slot.needs_reset, slot.episodes
        reset_kwargs = slot.reset_kwargs
        if client is None:
            self._sent[index] = (None, 0, 0)
            return SlotMirror(episode_id=None, needs_reset=needs_reset, episodes=episodes,
                              reset_kwargs=reset_kwargs)
        journal = client.journal
        sent_id, sent_entries, sent_actions = self._sent[index]
        key = journal.episode_id
        fresh = key != sent_id or sent_entries > len(journal.entries)
        base = 0 if fresh else sent_entries
        actions = slot.actions
        abase = 0 if fresh or actions is None else min(sent_actions, len(actions))
        head = (EpisodeJournal(reset_kwargs=journal.reset_kwargs,
                               reset_response_json=journal.reset_response_json,
                               max_steps=journal.max_steps, episode_id=key,
                               keep_steps=journal.keep_steps)
                if fresh else None)
        self._sent[index] = (key, len(journal.entries),
                             len(actions) if actions is not None else 0)
        return SlotMirror(episode_id=key, base=base, entries=tuple(journal.entries[base:]),
                          head=head, truncated=journal.truncated,
                          unknown_steps=tuple(journal.unknown_steps),
                          steps_applied=journal.steps_applied,
                          actions=None if actions is None else tuple(actions[abase:]),
                          actions_base=abase, needs_reset=needs_reset, episodes=episodes,
                          reset_kwargs=reset_kwargs)


def _without(answer: ShardAnswer, failed: Mapping[int, Exception], *,
             whole: bool) -> ShardAnswer:
    """``answer`` less the slots in ``failed``: each answered as a bug for its slot, or
    (``whole``: a whole-batch call) the first raised by the call unless it raised one."""
    if not failed:
        return answer
    items, final = list(answer.items), dict(answer.final)
    for j in failed:
        items[j] = None
        final.pop(j, None)
    autoreset = tuple(j for j in answer.autoreset if j not in failed)
    if whole:
        return replace(answer, items=items, final=final, autoreset=autoreset,
                       raised=answer.raised or next(iter(failed.values())))
    return replace(answer, items=items, final=final, autoreset=autoreset,
                   bugs={**answer.bugs, **failed})


def _dumps(value: Any, dumps: Dumps) -> tuple[bytes, tuple[pickle.PickleBuffer, ...]]:
    """``value`` pickled by the standard pickler (the fast one), else by ``dumps``
    (Ray's, which also pickles by value what only the actor can import), with the
    buffers it holds (large arrays) kept out of band."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        blob = pickle.dumps(value, 5, buffer_callback=buffers.append)
    except Exception:
        buffers.clear()
        blob = dumps(value, 5, buffer_callback=buffers.append)
    for buffer in buffers:
        buffer.raw()  # one that is not contiguous cannot cross: BufferError, here
    return blob, tuple(buffers)


def _copied(buffer: pickle.PickleBuffer) -> bytes | bytearray:
    """``buffer``'s bytes in band (pickle protocols before 5), writable as it was."""
    return bytes(buffer) if buffer.raw().readonly else bytearray(buffer)


def _arrive(fields: dict[str, Any], whole: bool, blob: bytes | None,
            buffers: Sequence[Any] = ()) -> ShardAnswer:
    """A shard's answer where it arrives (the driver): results that fail to unpickle
    (a class missing on the driver) are answered for their slots, as :func:`_without`
    does, the mirrors kept."""
    if blob is None:
        return ShardAnswer(**fields)
    try:
        items, final = pickle.loads(blob, buffers=buffers)
    except Exception as exc:
        answer = ShardAnswer(**{**fields, "items": [None] * fields["items"], "final": {}})
        failed: dict[int, Exception] = {
            j: RuntimeError(
                f"slot {answer.offset + j}: its answer could not be unpickled on the driver, "
                f"with the others of its shard's answer ({type(exc).__qualname__}: {exc})")
            for j in answer.ready if j not in answer.bugs}
        return _without(answer, failed, whole=whole)
    return ShardAnswer(**{**fields, "items": items, "final": final})


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling to the driver, else a RuntimeError with its text
    (an answer Ray cannot pickle fails the shard's whole receive, one it cannot unpickle
    on the driver passes for a dead shard)."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return RuntimeError(f"{type(exc).__qualname__}: {exc} (raised in a shard actor; "
                            "it could not be pickled to the driver)")
    return exc
