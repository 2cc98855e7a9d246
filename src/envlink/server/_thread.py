"""Run an :class:`EnvServer` on a :class:`~envlink.Bridge`'s loop thread, for sync code."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from envlink._bridge import Bridge
from envlink.server._environments.environment import EnvironmentFactory
from envlink.server._server import EnvServer

__all__ = ["THREAD_NAME", "ServerThread"]

THREAD_NAME = "envlink-test-server"
T = TypeVar("T")
_log = logging.getLogger("envlink.server")


class _ServerBridge(Bridge):
    """A bridge whose loop thread is named ``envlink-test-server``, without telemetry."""

    def __init__(self) -> None:
        # Calls from a test's own event loop are expected (and brief); the server's
        # traffic is traced by the server, not by the hop.
        super().__init__(on_foreign_loop="allow", hooks=())

    def _thread_name(self) -> str:
        return THREAD_NAME


class ServerThread:
    """An :class:`EnvServer` running in a daemon thread named ``envlink-test-server``.

    ``with ServerThread(env="echo", ...) as st:`` starts it and stops it on exit.
    Takes the same arguments as :class:`EnvServer`. The thread is a
    :class:`~envlink.Bridge`'s loop thread: :meth:`call` is a bridged call.
    """

    def __init__(self, env: str | EnvironmentFactory = "echo", **kwargs: Any) -> None:
        self._env = env
        self._kwargs = kwargs
        self._bridge: Bridge | None = None
        self._server: EnvServer | None = None

    def __enter__(self) -> ServerThread:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def server(self) -> EnvServer:
        """The running server. Touch it only through :meth:`call` (it lives on another loop)."""
        if self._server is None:
            raise RuntimeError("the server thread is not started")
        return self._server

    @property
    def url(self) -> str:
        """The server's base URL, ``ws://HOST:PORT``."""
        return self.server.url

    @property
    def ws_url(self) -> str:
        """The WebSocket endpoint, ``ws://HOST:PORT/ws``."""
        return self.server.ws_url

    @property
    def http_url(self) -> str:
        """``http://HOST:PORT``."""
        return self.server.http_url

    @property
    def port(self) -> int:
        """The listening port."""
        return self.server.port

    def start(self, timeout: float = 10.0) -> None:
        """Start the thread and the server; return once it listens.

        Raises:
            RuntimeError: already started.
            OSError: the server could not bind its address.
        """
        if self._bridge is not None:
            raise RuntimeError("the server thread is already started")
        bridge = self._bridge = _ServerBridge()

        async def start_server() -> EnvServer:
            server = EnvServer(self._env, **self._kwargs)
            await server.start()
            return server

        try:
            self._server = bridge.call(start_server, timeout=timeout, method="start")
        except BaseException:
            bridge.close(timeout)
            self._bridge = None
            raise

    def call(self, fn: Callable[[EnvServer], Any], timeout: float | None = 30.0) -> Any:
        """Run ``fn(server)`` on the server's loop and return its result.

        ``fn`` may be a plain function or return an awaitable (e.g. a coroutine
        function, or ``lambda s: s.wait_for_request("step")``), which is awaited.

        Raises:
            RuntimeError: not started, or called from the server's own thread (it
                would deadlock: :class:`~envlink.ReentrantCallError`).
            TimeoutError: no result within ``timeout`` seconds (the call is cancelled;
                :class:`~envlink.CallTimeoutError`).
        """
        bridge = self._bridge
        server = self.server
        if bridge is None or bridge.closed:
            raise RuntimeError("the server loop is not running")

        async def invoke() -> Any:
            result = fn(server)
            if inspect.isawaitable(result):
                result = await result
            return result

        return bridge.call(invoke, timeout=timeout, method="call")

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server and the loop, and join the thread (idempotent)."""
        bridge, server = self._bridge, self._server
        if bridge is None:
            return
        try:
            if server is not None and not bridge.closed:
                bridge.call(server.stop, timeout=timeout, method="stop")
        except Exception:
            # Closing the bridge below cancels what is left; stop() must not fail an exit.
            _log.warning("envlink test server did not stop cleanly", exc_info=True)
        finally:
            bridge.close(timeout)
            self._bridge = None
