"""A thread given the ident of a bridge's ended loop thread is not that loop's thread.

The OS reuses the ident of an ended thread for the next one it starts (on Linux, almost
at once): a check by ident alone took such a thread, a thread-pool worker closing its
client after the bridge had closed, for the loop thread, and close() raised
ReentrantCallError.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from envlink import Bridge, GenericEnvClient
from envlink._bridge import loop as loop_module
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)

class _IdentOf:
    """The ``threading`` module as the bridge's loop module sees it, except that one
    thread is given another thread's ident: the OS reusing an ended thread's ident,
    made certain instead of waited for."""

    def __init__(self, thread: threading.Thread, ident: int) -> None:
        self._thread, self._ident = thread, ident

    def get_ident(self) -> int:
        if threading.current_thread() is self._thread:
            return self._ident
        return threading.get_ident()

    def __getattr__(self, name: str) -> Any:
        return getattr(threading, name)


def test_close_from_a_thread_reusing_the_loop_threads_ident(
        server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """After the bridge's loop thread has ended, a new thread with its ident is not on the
    loop thread, and the sync client's close() from it returns (the bridge is closed,
    so there is nothing left to do)."""
    bridge = Bridge(name="reused-ident")
    env = GenericEnvClient(server_thread.url).sync(bridge=bridge)
    env.reset()
    assert bridge.thread is not None
    loop_ident = bridge.thread.ident
    assert loop_ident is not None
    bridge.close()
    assert not bridge.thread.is_alive()
    seen: dict[str, Any] = {}

    def in_a_new_thread() -> None:
        seen["ident"] = loop_module.threading.get_ident()
        seen["on_loop_thread"] = bridge.on_loop_thread()
        try:
            env.close()
            seen["close"] = "ok"
        except Exception as exc:  # the outcome is what is checked
            seen["close"] = repr(exc)

    thread = threading.Thread(target=in_a_new_thread)
    monkeypatch.setattr(loop_module, "threading", _IdentOf(thread, loop_ident))
    thread.start()
    thread.join(10)
    assert seen == {"ident": loop_ident, "on_loop_thread": False, "close": "ok"}


def test_the_loop_thread_is_still_on_the_loop_thread() -> None:
    """On the loop thread itself, on_loop_thread() holds (a blocking call there is
    refused, as before)."""
    with Bridge(name="own-thread") as bridge:
        async def where() -> bool:
            return bridge.on_loop_thread()

        assert bridge.call(where, timeout=10) is True
        assert bridge.on_loop_thread() is False
