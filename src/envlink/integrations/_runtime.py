"""What the training adapters share: a reset that waits, and sessions released once.

Training frameworks build many environment objects in one process (TRL pools one per
concurrent rollout, SkyRL builds one per trajectory). They all run on the process's
default bridge (one loop thread, :func:`~envlink.default_bridge`) and count against
the process-wide session limit; their sessions are released when the objects are
dropped and, at the latest, at exit (before the bridge's own exit hook closes the loop).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import dataclasses
import threading
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from envlink._bridge import Bridge
from envlink._client.client import EnvClient, StepResult
from envlink._client.configuration import ClientConfig, config_from_options
from envlink._errors import (
    CallTimeoutError,
    CapacityReachedError,
    ClientClosedError,
    ConnectError,
    ConnectionLostError,
    EnvlinkError,
    SessionLostError,
)
from envlink._sansio.policies import ReconnectPolicy
from envlink._sansio.retry import Retry
from envlink._sync.default_bridge import default_bridge

__all__ = [
    "DEFAULT_CLIENT_CONFIG",
    "DEFAULT_CLIENT_OPTIONS",
    "adapter_config",
    "Lease",
    "retry_until_ready",
    "reset_until_ready",
    "shared_bridge",
    "stop_run",
    "transient",
    "wait_for_run",
]

T = TypeVar("T")

#: What the adapters' clients do unless told otherwise: recover a lost session (resume
#: where the server can, else replay) and wait for a full endpoint instead of failing.
DEFAULT_CLIENT_OPTIONS: dict[str, Any] = {"on_session_lost": "auto", "on_capacity": "wait"}
#: The same, as the config the adapters' clients get when given none.
DEFAULT_CLIENT_CONFIG = ClientConfig(on_session_lost="auto", on_capacity="wait")
#: Every lease not yet released: closed at exit, before the bridge's own exit hook.
_live: weakref.WeakSet[Lease] = weakref.WeakSet()
#: Closes handed to a bridge's loop (a lease released inside running async code), each
#: with the facade it closes, held until the close has ended: the facade's lease keeps
#: the default bridge, and its loop, open until then (the last facade to go closes it,
#: which would cancel the close before its frame is sent); waited for at exit.
_closing: dict[concurrent.futures.Future[None], Any] = {}
#: How long the exit hook waits for the closes handed to a loop, in all.
_EXIT_CLOSE_WAIT = 10.0



def adapter_config(config: ClientConfig | None,
                   options: Mapping[str, Any] | None) -> ClientConfig:
    """An adapter's client config: ``client_config`` as given, else ``client_options``
    (deprecated) over :data:`DEFAULT_CLIENT_OPTIONS`, made into a config once.

    Raises:
        ValueError: both are given.
        TypeError: ``config`` is not a :class:`~envlink.ClientConfig`, or ``options``
            has a key that is not client configuration.
    """
    if config is not None:
        if options:
            raise ValueError("pass client_config or client_options (deprecated), not both")
        if not isinstance(config, ClientConfig):
            raise TypeError(f"client_config must be a ClientConfig or None, "
                            f"got {type(config).__name__}")
        return config
    if not options:
        return DEFAULT_CLIENT_CONFIG
    return config_from_options({**DEFAULT_CLIENT_OPTIONS, **options})


def shared_bridge() -> Bridge:
    """The bridge the adapters run on: the process's default bridge (one loop thread)."""
    return default_bridge()


def transient(exc: BaseException) -> bool:
    """Whether a failed reset may simply be tried again (a reset is idempotent).

    A full server, a refused or dropped connection, a lost session and a timed-out
    reset are transient; a validation error or a rejected handshake (401, 404) is not.
    """
    if isinstance(exc, CapacityReachedError):
        return True
    if isinstance(exc, ConnectError):
        return exc.retryable
    return isinstance(exc, (ConnectionLostError, SessionLostError, CallTimeoutError))


async def reset_until_ready(client: EnvClient[Any, Any, Any], kwargs: Mapping[str, Any], *,
                            deadline: float, policy: ReconnectPolicy | None = None,
                            retry_on: Callable[[BaseException], bool] = transient,
                            ) -> StepResult[Any]:
    """``client.reset(**kwargs)``, tried again while it fails transiently, within ``deadline``.

    The tries go through envlink's retry primitive as a wait, with the client's
    reconnect policy's backoff (no try cap, its retry budget not spent), until
    ``deadline``: a full server is waited for, a dropped connection is reopened, and
    the last error is raised once the deadline passed.

    Args:
        client: the async client (called on its own loop).
        kwargs: the reset arguments.
        deadline: seconds the whole reset may take.
        policy: the backoff (default: the client's reconnect policy).
        retry_on: which failures are tried again.

    Raises:
        CallTimeoutError: the deadline expired during a try.
        EnvlinkError: the last failure, when it is not transient.
    """
    async def attempt(remaining: float) -> StepResult[Any]:
        return await client.reset(timeout=remaining, **dict(kwargs))

    return await retry_until_ready(attempt, deadline=deadline,
                                   policy=policy or client.reconnect_policy,
                                   operation="reset", retry_on=retry_on)


async def retry_until_ready(attempt: Callable[[float], Awaitable[T]], *, deadline: float,
                            policy: ReconnectPolicy, operation: str,
                            retry_on: Callable[[BaseException], bool] = transient) -> T:
    """``attempt(remaining_seconds)``, tried again while it fails transiently, within ``deadline``.

    The waiting behind :func:`reset_until_ready` for any idempotent opening step (a
    harness session's connect, for one): a wait with ``policy``'s backoff (no try cap,
    its retry budget not spent), tries going on until ``deadline``: a backoff that would
    pass it is cut to end at it and a last try is made then, never a wait ended early.

    Raises:
        CallTimeoutError: the deadline expired during a try.
        EnvlinkError: the last failure, when it is not transient.
    """
    waiting = dataclasses.replace(policy, max_elapsed=None)
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline

    async def run(_: int) -> T:
        left = retry.time_for_try()
        assert left is not None  # the loop has a deadline
        return await attempt(left)

    # The wait lasts until the deadline: a backoff is cut to end there, and a last
    # try (given at least LAST_TRY seconds) is made then.
    retry = Retry(waiting, operation=operation, sleep=asyncio.sleep, clock=loop.time,
                  retry_on=retry_on, deadline=end)
    return await retry.run(run)


class Lease:
    """One adapter's hold on one sync client, released exactly once.

    Kept apart from the adapter object so that a ``weakref.finalize`` on the adapter
    can release it without keeping the adapter alive.
    """

    def __init__(self) -> None:
        self.client: Any = None  # a SyncEnvClient once connected
        self._lock = threading.Lock()
        _live.add(self)

    def held(self, what: str) -> Any:
        """The client, while the lease holds it.

        Raises:
            ClientClosedError: released (``what`` names the session in the message).
        """
        client = self.client
        if client is None:
            raise ClientClosedError(f"the {what} is closed")
        return client

    def release(self) -> None:
        """End the server session (``close`` on the wire) and drop the client. Idempotent."""
        with self._lock:
            client, self.client = self.client, None
        if client is None:
            return
        bridge = client.bridge
        loop = bridge.loop
        if loop is not None and _in_running_loop():
            # A garbage collection inside running async code (the bridge's own loop, or
            # a caller's): a blocking close would stall or deadlock that loop, so the
            # close is handed to the bridge's loop and not waited for here. The facade
            # is held until the close has ended (its lease keeps the bridge open), and
            # the exit hook waits for it.
            closing = _close(client.async_client)
            try:
                future = asyncio.run_coroutine_threadsafe(closing, loop)
            except RuntimeError:  # the loop is already closed
                closing.close()
                return
            _closing[future] = client
            future.add_done_callback(_closed)
            return
        # Best effort: the session may already be gone with its server.
        with contextlib.suppress(Exception):
            client.close()


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _close(client: EnvClient[Any, Any, Any]) -> None:
    # A coroutine (the client's close may be any awaitable) for run_coroutine_threadsafe.
    await client.close()


def _closed(future: concurrent.futures.Future[None]) -> None:
    # Drops the facade: the last one on the default bridge closes it (on its loop).
    _closing.pop(future, None)


@atexit.register
def _release_all_at_exit() -> None:
    # Registered after envlink's bridge hook (imported above), so it runs before it:
    # the sessions are closed on the wire while the loop thread still runs, those
    # released inside running async code (handed to the loop) included.
    for lease in list(_live):
        lease.release()
    # A loop closed meanwhile never runs its close: not waited for.
    pending = [future for future, client in list(_closing.items())
               if not _loop_closed(client.bridge.loop)]
    concurrent.futures.wait(pending, timeout=_EXIT_CLOSE_WAIT)


def _loop_closed(loop: asyncio.AbstractEventLoop | None) -> bool:
    return loop is None or loop.is_closed()


def wait_for_run(bridge: Bridge, run: asyncio.Task[T], timeout_s: float | None,
                 what: str) -> T:
    """Wait on the bridge's loop for a loop-owning session's background ``run``, without
    cancelling it when the wait ends (``asyncio.shield``): the run goes on.

    Raises:
        TimeoutError: ``timeout_s`` passed (or the run's own ``CallTimeoutError``).
        ClientClosedError: the session was closed (its run cancelled) during the wait.
        Exception: what the run raised.
    """
    async def wait() -> T:
        try:
            return await asyncio.wait_for(asyncio.shield(run), timeout_s)
        except asyncio.CancelledError:
            if not run.cancelled():
                raise
            # close() from another thread (TRL closes live sessions on stop): a typed
            # error for the waiter, never a bare cancellation out of a pool thread,
            # which a trainer's ``except Exception`` would not catch.
            raise ClientClosedError(f"the {what} session was closed while its run "
                                    "was awaited") from None

    try:
        return bridge.call(wait, timeout=None, method="harness.wait")
    except asyncio.TimeoutError as exc:
        if isinstance(exc, EnvlinkError):
            raise
        raise TimeoutError(f"the {what} run did not complete in {timeout_s} s") from None


async def stop_run(run: asyncio.Task[Any] | None) -> None:
    """Cancel a loop-owning session's background run if it is still going, and retrieve
    its outcome, so that a run nobody waited for logs no warning."""
    if run is None:
        return
    if not run.done():
        run.cancel()
    with contextlib.suppress(BaseException):
        await run
