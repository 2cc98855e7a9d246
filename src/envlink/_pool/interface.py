"""The interface both pools offer: :class:`AsyncPool`, for :class:`~envlink.EnvPool` and
``envlink.ray.RayEnvPool``.

Whatever stands for either pool (the blocking facade :class:`~envlink.SyncEnvPool`,
a user's training loop) is written against this protocol. Both pools subclass it,
so mypy checks that each one has all of it; the few methods that are the same for
both (one slot's reset, the context manager, the blocking facade) are written here
once, over the abstract batch calls.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from envlink._config import UNSET, Timeout, UnsetType
from envlink._pool.batch import single_result, slot_mask

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

    from envlink._bridge import Bridge
    from envlink._client.client import StepResult
    from envlink._pool.options import AutoresetMode, PoolOptions
    from envlink._pool.results import Batch, PoolView
    from envlink._pool.sync_pool import SyncEnvPool
    from envlink._sansio.policies import PoolSessionLostPolicy

__all__ = ["AsyncPool"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")
PoolT = TypeVar("PoolT", bound="AsyncPool[Any, Any]")


class AsyncPool(Protocol[ActT, ObsT]):
    """``size`` sessions stepped as a batch, on this event loop (in process or on Ray).

    Attributes:
        size: the number of slots.
        on_session_lost: ``"raise"``, ``"replay"`` or ``"resume"``.
        autoreset: ``"next_step"``, ``"same_step"`` or ``"disabled"``.
        batch_timeout: the default deadline of a batch call in seconds (``None``: none).
        tracer_provider: the tracer provider given (``None``: the global one).
        meter_provider: the meter provider given (``None``: the global one).
    """

    size: int
    on_session_lost: PoolSessionLostPolicy
    autoreset: AutoresetMode
    batch_timeout: float | None
    tracer_provider: TracerProvider | None
    meter_provider: MeterProvider | None
    # What the methods written here read; each pool sets them when it is built.
    _options: PoolOptions
    _closed: bool

    def _configure(self, options: PoolOptions, tracer_provider: TracerProvider | None,
                   meter_provider: MeterProvider | None) -> None:
        """Take the checked options and the providers (both pools' constructors do)."""
        self._options = options
        self.size = options.size
        self.on_session_lost = options.on_session_lost
        self.autoreset = options.autoreset
        self.batch_timeout = options.batch_timeout
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self._closed = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoint URLs, in the order given."""
        return self._options.urls

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def call_deadline(self, method: str,
                      timeout: float | UnsetType | None = UNSET) -> float | None:
        """Seconds a call of ``method`` with this ``timeout`` may last at most (None: no limit).

        The sync facade waits this long, plus a margin, so that the pool's own deadline
        always fires before the bridge's. A batch call (and ``view``, which waits only
        for the loop) takes the batch deadline, ``batch_timeout`` by default;
        ``step_recv`` takes its own ``timeout`` (by default it waits for the steps in
        flight); ``close`` closes the sessions together, each within twice its client's
        close deadline (as the client's ``close()``).

        Args:
            method: the pool's method.
            timeout: the ``timeout=`` the call gets; ``UNSET`` for the default.
        """
        if method == "close":
            config = self._options.client_config
            close = (config.timeout if config is not None else Timeout()).close
            seconds = close if timeout is UNSET else timeout
            return None if seconds is None else 2 * seconds
        if method == "step_recv":
            return None if timeout is UNSET else timeout
        return self.batch_timeout if timeout is UNSET else timeout

    @abstractmethod
    def view(self) -> PoolView:
        """A snapshot: sessions per endpoint and state, breaker states, each slot's state."""

    @abstractmethod
    async def reset(self, seeds: int | Sequence[int | None] | None = None, *,
                    mask: Sequence[bool] | None = None,
                    timeout: float | UnsetType | None = UNSET,
                    **kwargs: Any) -> Batch[ObsT]:
        """Start a new episode in every slot (or the masked ones)."""

    @abstractmethod
    async def step(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None,
                   *, timeout: float | UnsetType | None = UNSET) -> Batch[ObsT]:
        """Apply one action per slot (or per masked slot) and wait for every answer."""

    @abstractmethod
    async def step_send(self, actions: Sequence[ActT | None],
                        mask: Sequence[bool] | None = None, *,
                        timeout: float | UnsetType | None = UNSET) -> None:
        """Start one step per slot (or per masked slot); collect with :meth:`step_recv`."""

    @abstractmethod
    async def step_recv(self, min_ready: int | None = None, *,
                        timeout: float | None = None) -> Batch[ObsT]:
        """Collect the answers of :meth:`step_send` as soon as ``min_ready`` are in."""

    @abstractmethod
    async def close(self) -> None:
        """Cancel what is in flight and close every session. Idempotent."""

    async def reset_at(self, index: int, *, timeout: float | UnsetType | None = UNSET,
                       **kwargs: Any) -> StepResult[ObsT]:
        """Reset one slot on its own and return its result.

        Raises:
            EnvlinkError: that slot's error.
            IndexError: no such slot.
        """
        mask = slot_mask(index, self.size)
        return single_result(await self.reset(mask=mask, timeout=timeout, **kwargs), index)

    async def __aenter__(self: PoolT) -> PoolT:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def sync(self, bridge: Bridge | None = None) -> SyncEnvPool[ActT, ObsT]:
        """A blocking facade running this pool on one bridge thread.

        Args:
            bridge: share an existing :class:`~envlink.Bridge`; by default the
                process-wide :func:`~envlink.default_bridge`, or a bridge of the
                facade's own for a pool with its own providers (see
                :class:`~envlink.SyncEnvPool`).
        """
        from envlink._pool.sync_pool import SyncEnvPool

        return SyncEnvPool(self, bridge=bridge)
