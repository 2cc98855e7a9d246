"""What an :class:`~envlink.EnvPool` hands back: per-slot batch results and its view. No I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from envlink._client.client import EnvClient, StepResult
from envlink._errors import EnvlinkError

__all__ = ["Batch", "EndpointView", "PoolView", "SlotRecord", "SlotResult"]

ObsT = TypeVar("ObsT")

#: One slot's answer: its result, its session's typed error, or ``None`` when the
#: slot was not part of the call (masked out, or still in flight).
SlotResult = StepResult[ObsT] | EnvlinkError | None


class Batch(list[SlotResult[ObsT]], Generic[ObsT]):
    """The answers of one batch call, one per slot, in slot order.

    A list of length ``pool.size``: entry ``i`` is slot ``i``'s
    :class:`~envlink.StepResult`, or the :class:`~envlink.EnvlinkError` its session
    raised, or ``None`` if the slot took no part (masked out, or a straggler of a
    ready-first receive). A batch never fails as a whole because of one slot.

    Attributes:
        ready: the slots answered in this batch (result or error), ascending.
        stragglers: slots still in flight when a ready-first receive returned.
        autoreset: slots reset automatically by this call (see ``autoreset`` modes).
        final: under ``same_step`` autoreset, the terminal step of each slot that
            was reset in this call (its observation is the episode's last one).
    """

    ready: tuple[int, ...]
    stragglers: tuple[int, ...]
    autoreset: tuple[int, ...]
    final: dict[int, StepResult[ObsT]]

    def __init__(self, items: Iterable[SlotResult[ObsT]] = (), *,
                 ready: Iterable[int] = (), stragglers: Iterable[int] = (),
                 autoreset: Iterable[int] = (),
                 final: Mapping[int, StepResult[ObsT]] | None = None) -> None:
        super().__init__(items)
        self.ready = tuple(sorted(ready))
        self.stragglers = tuple(sorted(stragglers))
        self.autoreset = tuple(sorted(autoreset))
        self.final = dict(final or {})

    @property
    def errors(self) -> dict[int, EnvlinkError]:
        """The slots that failed, with their typed errors."""
        return {i: r for i, r in enumerate(self) if isinstance(r, EnvlinkError)}

    @property
    def ok(self) -> bool:
        """Whether no slot of this batch failed."""
        return not any(isinstance(r, EnvlinkError) for r in self)

    def results(self) -> list[StepResult[ObsT]]:
        """The results, in slot order, raising the first slot's error if any failed.

        Raises:
            EnvlinkError: the error of the first failed slot.
            ValueError: a slot has no answer (masked out or still in flight).
        """
        out: list[StepResult[ObsT]] = []
        for i, r in enumerate(self):
            if isinstance(r, EnvlinkError):
                raise r
            if r is None:
                raise ValueError(f"slot {i} has no answer in this batch")
            out.append(r)
        return out

    def __repr__(self) -> str:
        return (f"Batch({list.__repr__(self)}, ready={len(self.ready)}, "
                f"stragglers={self.stragglers}, errors={sorted(self.errors)})")


@dataclass(frozen=True)
class EndpointView:
    """One endpoint in :meth:`EnvPool.view`.

    Attributes:
        url: the endpoint's base URL.
        breaker: its circuit breaker's state (``closed``, ``open``, ``half_open``).
        consecutive_failures: connection failures since its last success.
        sessions: the pool's sessions placed there (being placed included).
        server_max: the server's session limit, once it said it.
        states: the pool's slots counted on this endpoint, by slot state.
    """

    url: str
    breaker: str
    consecutive_failures: int
    sessions: int
    server_max: int | None
    states: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolView:
    """A snapshot of a pool: its endpoints and the state of each slot.

    Attributes:
        endpoints: one view per endpoint, in the order given.
        slots: each slot's state (``empty``, ``placing``, ``active``, ``recovering``,
            ``lost``), in slot order.
        slot_endpoints: the URL each slot's session is on (``None``: none).
    """

    endpoints: tuple[EndpointView, ...]
    slots: tuple[str, ...]
    slot_endpoints: tuple[str | None, ...]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form."""
        return {
            "endpoints": [
                {"url": e.url, "breaker": e.breaker,
                 "consecutive_failures": e.consecutive_failures, "sessions": e.sessions,
                 "server_max": e.server_max, "states": dict(e.states)}
                for e in self.endpoints
            ],
            "slots": list(self.slots),
            "slot_endpoints": list(self.slot_endpoints),
        }


@dataclass(frozen=True)
class SlotRecord:
    """What a pool keeps of one slot besides its session's journal (:meth:`EnvPool.slot_record`).

    Enough, with the journal, to take the slot over in another process.

    Attributes:
        client: the slot's session (``None``: none); use it on the pool's loop.
        actions: the typed actions of the current episode, kept only for a client
            whose action hook is its own (the journal keeps the JSON payloads, which
            such a hook may not accept back); ``None`` otherwise. A live view.
        needs_reset: under ``next_step`` autoreset, the episode ended and the next
            step resets the slot.
        episodes: episodes begun on the slot.
        reset_kwargs: the arguments of its last reset.
    """

    client: EnvClient[Any, Any, Any] | None
    actions: Sequence[Any] | None
    needs_reset: bool
    episodes: int
    reset_kwargs: Mapping[str, Any]
