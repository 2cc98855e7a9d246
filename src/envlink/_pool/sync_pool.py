"""The blocking facade of :class:`~envlink.EnvPool`: ``pool.sync()`` → :class:`SyncEnvPool`.

The whole pool runs on one :class:`~envlink.Bridge` (one event-loop thread, however
many sessions). Each call is a bridged call: the caller's context crosses into the
loop (the pool's batch span is a child of the caller's span), it is traced and
measured, and the blocking wait is bounded by the batch deadline plus a margin.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from envlink._bridge import Bridge
from envlink._config import UNSET, UnsetType
from envlink._sync.facade import TIMEOUT_MARGIN, BlockingFacade

if TYPE_CHECKING:
    from envlink._client.client import StepResult
    from envlink._pool.interface import AsyncPool
    from envlink._pool.results import Batch, PoolView

__all__ = ["SyncEnvPool"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")


class SyncEnvPool(BlockingFacade["AsyncPool[ActT, ObsT]"], Generic[ActT, ObsT]):
    """Blocking facade of an :class:`~envlink.EnvPool` (or a ``RayEnvPool``): ``pool.sync()``.

    Same methods as the pool, blocking. ``timeout=`` is the batch deadline; the
    bridge waits that long plus a margin (with neither a ``timeout`` nor the pool's
    ``batch_timeout``, it waits for the sessions' own deadlines). Each wait comes
    from :meth:`AsyncPool.call_deadline`: ``close()`` waits the sessions' close
    deadline, ``view()`` and ``step_send()`` the batch deadline, plus the margin.
    ``close()`` is the client facade's: a second caller waits for the first.

    Example::

        with EnvPool(urls, 64).sync() as pool:
            batch = pool.reset(seeds=0)
            batch = pool.step([{"move": 1}] * 64)

    Args:
        pool: the async pool (either pool: anything that is an ``AsyncPool``).
        bridge: a bridge to share (left open on :meth:`close`); by default the
            process-wide :func:`~envlink.default_bridge` (its thread ends when the
            last facade on it closes), or, for a
            pool with its own tracer or meter provider, a bridge of its own on
            them, closed by :meth:`close`.
        timeout_margin: seconds the bridge waits beyond the batch deadline.
    """

    def __init__(self, pool: AsyncPool[ActT, ObsT], *, bridge: Bridge | None = None,
                 timeout_margin: float = TIMEOUT_MARGIN) -> None:
        owns = False
        if bridge is None and (pool.tracer_provider is not None
                               or pool.meter_provider is not None):
            # The bridge's spans and metrics go where the pool's go.
            owns = True
            bridge = Bridge(name="envlink-pool", tracer_provider=pool.tracer_provider,
                            meter_provider=pool.meter_provider)
        super().__init__(pool, bridge, owns_bridge=owns, timeout_margin=timeout_margin)

    @property
    def async_pool(self) -> AsyncPool[ActT, ObsT]:
        """The wrapped async pool (use it only from the bridge's loop)."""
        return self._envlink_target

    def reset(self, seeds: int | Sequence[int | None] | None = None, *,
              mask: Sequence[bool] | None = None,
              timeout: float | UnsetType | None = UNSET, **kwargs: Any) -> Batch[ObsT]:
        """Blocking :meth:`EnvPool.reset`."""
        result: Batch[ObsT] = self._envlink_call(
            "reset", self._envlink_target.reset, (seeds,), {"mask": mask, **kwargs}, timeout)
        return result

    def reset_at(self, index: int, *, timeout: float | UnsetType | None = UNSET,
                 **kwargs: Any) -> StepResult[ObsT]:
        """Blocking :meth:`EnvPool.reset_at`."""
        result: StepResult[ObsT] = self._envlink_call(
            "reset_at", self._envlink_target.reset_at, (index,), kwargs, timeout)
        return result

    def step(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None, *,
             timeout: float | UnsetType | None = UNSET) -> Batch[ObsT]:
        """Blocking :meth:`EnvPool.step`."""
        result: Batch[ObsT] = self._envlink_call(
            "step", self._envlink_target.step, (actions, mask), {}, timeout)
        return result

    def step_send(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None,
                  *, timeout: float | UnsetType | None = UNSET) -> None:
        """Blocking :meth:`EnvPool.step_send` (returns once the steps are started)."""
        self._envlink_call("step_send", self._envlink_target.step_send, (actions, mask), {},
                           timeout)

    def step_recv(self, min_ready: int | None = None, *,
                  timeout: float | None = None) -> Batch[ObsT]:
        """Blocking :meth:`EnvPool.step_recv`."""
        result: Batch[ObsT] = self._envlink_call(
            "step_recv", self._envlink_target.step_recv, (min_ready,), {}, timeout)
        return result

    def view(self) -> PoolView:
        """The pool's view, read on the loop thread (consistent with its tasks)."""
        pool = self._envlink_target

        async def read() -> PoolView:
            return pool.view()

        result: PoolView = self._envlink_call("view", read, (), {}, UNSET)
        return result

    def close(self, *, timeout: float | UnsetType | None = UNSET) -> None:
        """Close the pool, and the bridge if this facade owns it. Idempotent.

        A second caller (another thread) waits for the first close to finish, as long
        as a close may take (:meth:`AsyncPool.call_deadline`, plus the margin).

        Args:
            timeout: seconds to wait for the pool's close (default: twice its
                sessions' close deadline).

        Raises:
            CallTimeoutError: the pool did not close in time (the bridge is closed
                anyway when owned), or, for a second caller, the first close did not.
            ReentrantCallError: called from the bridge's own loop thread.
        """
        super().close(timeout=timeout)

    def __enter__(self) -> SyncEnvPool[ActT, ObsT]:
        return self
