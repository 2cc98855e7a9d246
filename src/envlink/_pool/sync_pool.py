"""The blocking facade of :class:`~envlink.EnvPool`: ``pool.sync()`` → :class:`SyncEnvPool`.

The whole pool runs on one :class:`~envlink.Bridge` (one event-loop thread, however
many sessions). Each call is a bridged call: the caller's context crosses into the
loop (the pool's batch span is a child of the caller's span), it is traced and
measured, and the blocking wait is bounded by the batch deadline plus a margin.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from envlink._bridge import Bridge, SyncProxy
from envlink._client.default_bridge import lease_bridge
from envlink._client.sync_client import TIMEOUT_MARGIN
from envlink._config import UNSET, UnsetType
from envlink._errors import ClientClosedError, ReentrantCallError

if TYPE_CHECKING:
    from envlink._client.client import StepResult
    from envlink._pool.interface import AsyncPool
    from envlink._pool.results import Batch, PoolView

__all__ = ["SyncEnvPool"]

ActT = TypeVar("ActT")
ObsT = TypeVar("ObsT")


class SyncEnvPool(SyncProxy["AsyncPool[ActT, ObsT]"], Generic[ActT, ObsT]):
    """Blocking facade of an :class:`~envlink.EnvPool` (or a ``RayEnvPool``): ``pool.sync()``.

    Same methods as the pool, blocking. ``timeout=`` is the batch deadline; the
    bridge waits that long plus a margin (with neither a ``timeout`` nor the pool's
    ``batch_timeout``, it waits for the sessions' own deadlines).

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
        # On the default bridge, a lease until close(): the last facade on it ends its thread.
        bridge, self._envlink_release = lease_bridge(bridge, self)
        super().__init__(pool, bridge, timeout=None)
        self._envlink_owns_bridge = owns
        self._envlink_margin = float(timeout_margin)
        self._envlink_close_lock = threading.Lock()
        self._envlink_closed = False

    def _envlink_call(self, method: str, kwargs: dict[str, Any],
                      timeout: float | UnsetType | None, *args: Any) -> Any:
        pool = self._envlink_target
        seconds = pool.batch_timeout if timeout is UNSET else timeout
        wait = None if seconds is None else seconds + self._envlink_margin
        if method in ("reset", "step", "step_send", "reset_at"):
            kwargs = {**kwargs, "timeout": timeout}
        fn = functools.partial(getattr(pool, method), *args, **kwargs)
        return self._envlink_bridge.call(fn, timeout=wait, method=method)

    @property
    def async_pool(self) -> AsyncPool[ActT, ObsT]:
        """The wrapped async pool (use it only from the bridge's loop)."""
        return self._envlink_target

    @property
    def bridge(self) -> Bridge:
        """The bridge this facade runs on."""
        return self._envlink_bridge

    def reset(self, seeds: int | Sequence[int | None] | None = None, *,
              mask: Sequence[bool] | None = None,
              timeout: float | UnsetType | None = UNSET, **kwargs: Any) -> Batch[ObsT]:
        """Blocking :meth:`EnvPool.reset`."""
        result: Batch[ObsT] = self._envlink_call(
            "reset", {"mask": mask, **kwargs}, timeout, seeds)
        return result

    def reset_at(self, index: int, *, timeout: float | UnsetType | None = UNSET,
                 **kwargs: Any) -> StepResult[ObsT]:
        """Blocking :meth:`EnvPool.reset_at`."""
        result: StepResult[ObsT] = self._envlink_call("reset_at", kwargs, timeout, index)
        return result

    def step(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None, *,
             timeout: float | UnsetType | None = UNSET) -> Batch[ObsT]:
        """Blocking :meth:`EnvPool.step`."""
        result: Batch[ObsT] = self._envlink_call("step", {"mask": mask}, timeout, actions)
        return result

    def step_send(self, actions: Sequence[ActT | None], mask: Sequence[bool] | None = None,
                  *, timeout: float | UnsetType | None = UNSET) -> None:
        """Blocking :meth:`EnvPool.step_send` (returns once the steps are started)."""
        self._envlink_bridge.call(functools.partial(
            self._envlink_target.step_send, actions, mask, timeout=timeout),
            timeout=self._envlink_margin + 5.0, method="step_send")

    def step_recv(self, min_ready: int | None = None, *,
                  timeout: float | None = None) -> Batch[ObsT]:
        """Blocking :meth:`EnvPool.step_recv`."""
        wait = None if timeout is None else timeout + self._envlink_margin
        result: Batch[ObsT] = self._envlink_bridge.call(functools.partial(
            self._envlink_target.step_recv, min_ready, timeout=timeout),
            timeout=wait, method="step_recv")
        return result

    def view(self) -> PoolView:
        """The pool's view, read on the loop thread (consistent with its tasks)."""
        async def read() -> PoolView:
            return self._envlink_target.view()

        result: PoolView = self._envlink_bridge.call(read, timeout=self._envlink_margin + 5.0,
                                                     method="view")
        return result

    def close(self) -> None:
        """Close the pool, and the bridge if this facade owns it. Idempotent.

        Raises:
            ReentrantCallError: called from the bridge's own loop thread.
        """
        bridge = self._envlink_bridge
        if bridge.on_loop_thread():
            raise ReentrantCallError("SyncEnvPool.close() called from its bridge's loop "
                                     "thread; await the pool's close() instead")
        with self._envlink_close_lock:
            if self._envlink_closed:
                return
            self._envlink_closed = True
        try:
            if not bridge.closed:
                with contextlib.suppress(ClientClosedError):
                    bridge.call(self._envlink_target.close, timeout=30.0, method="close")
        finally:
            if self._envlink_owns_bridge:
                bridge.close()
            elif self._envlink_release is not None:
                self._envlink_release()

    def __enter__(self) -> SyncEnvPool[ActT, ObsT]:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> Literal[False]:
        self.close()
        return False

    def __repr__(self) -> str:
        return f"<SyncEnvPool of {self._envlink_target!r} on {self._envlink_bridge!r}>"
