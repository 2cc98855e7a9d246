"""Run an :class:`EnvServer` on its own event loop in a daemon thread, for sync code."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from envlink.server._environment import EnvironmentFactory
from envlink.server._server import EnvServer

__all__ = ["THREAD_NAME", "ServerThread"]

THREAD_NAME = "envlink-test-server"
T = TypeVar("T")


class ServerThread:
    """An :class:`EnvServer` running in a daemon thread named ``envlink-test-server``.

    ``with ServerThread(env="echo", ...) as st:`` starts it and stops it on exit.
    Takes the same arguments as :class:`EnvServer`.
    """

    def __init__(self, env: str | EnvironmentFactory = "echo", **kwargs: Any) -> None:
        self._env = env
        self._kwargs = kwargs
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
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
        if self._thread is not None:
            raise RuntimeError("the server thread is already started")
        ready: concurrent.futures.Future[EnvServer] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(ready,), name=THREAD_NAME,
                                        daemon=True)
        self._thread.start()
        try:
            self._server = ready.result(timeout)
        except BaseException:
            self._thread.join(timeout)
            self._thread = None
            raise

    def _run(self, ready: concurrent.futures.Future[EnvServer]) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            try:
                server = EnvServer(self._env, **self._kwargs)
                loop.run_until_complete(server.start())
            except BaseException as exc:
                ready.set_exception(exc)
                return
            ready.set_result(server)
            loop.run_forever()
            loop.run_until_complete(server.stop())
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()

    def call(self, fn: Callable[[EnvServer], Any], timeout: float | None = 30.0) -> Any:
        """Run ``fn(server)`` on the server's loop and return its result.

        ``fn`` may be a plain function or return an awaitable (e.g. a coroutine
        function, or ``lambda s: s.wait_for_request("step")``), which is awaited.

        Raises:
            RuntimeError: called from the server's own thread (it would deadlock).
            TimeoutError: no result within ``timeout`` seconds (the call is cancelled).
        """
        loop = self._loop
        server = self.server
        if loop is None or not loop.is_running():
            raise RuntimeError("the server loop is not running")
        if threading.current_thread() is self._thread:
            raise RuntimeError("ServerThread.call from the server's own thread would deadlock")

        async def invoke() -> Any:
            result = fn(server)
            if inspect.isawaitable(result):
                result = await result
            return result

        future = asyncio.run_coroutine_threadsafe(invoke(), loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"ServerThread.call did not finish within {timeout} s") from None

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the server and the loop, and join the thread (idempotent)."""
        thread, loop = self._thread, self._loop
        if thread is None or loop is None:
            return
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout)
        self._thread = None
        self._loop = None
