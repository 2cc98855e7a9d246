"""Bridge lifecycle: close, waiting callers, leftover tasks, atexit, GC, fork, thread leaks."""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from envlink import Bridge, ClientClosedError, SyncProxy
from envlink._bridge import _close_all_at_exit

from .conftest import envlink_threads

pytestmark = pytest.mark.timeout(20)


async def echo(value: Any) -> Any:
    await asyncio.sleep(0)
    return value


class Echo:
    async def echo(self, value: Any) -> Any:
        await asyncio.sleep(0)
        return value


class Hangs:
    """Coroutines that wait until cancelled, and which of them were."""

    def __init__(self) -> None:
        self.started = threading.Semaphore(0)
        self.cancelled: list[int] = []

    async def hang(self, i: int) -> None:
        self.started.release()
        try:
            await asyncio.Event().wait()  # referenced by this coroutine only
        except asyncio.CancelledError:
            self.cancelled.append(i)
            raise

    def wait_started(self, n: int) -> None:
        for _ in range(n):
            assert self.started.acquire(timeout=5)


def test_close_is_idempotent_and_joins_the_thread() -> None:
    """close() twice is fine; the loop thread is gone after the first."""
    bridge = Bridge()
    bridge.call(echo, 1, timeout=5)
    thread = bridge.thread
    bridge.close()
    bridge.close()
    assert bridge.closed
    assert thread is not None
    assert not thread.is_alive()


def test_close_before_any_call_starts_nothing() -> None:
    """Closing an unused bridge starts no thread."""
    before = envlink_threads()
    bridge = Bridge()
    bridge.close()
    assert bridge.thread is None
    assert envlink_threads() == before


def test_calls_after_close_raise_client_closed() -> None:
    """A call after close() raises ClientClosedError (used or never used)."""
    for used in (True, False):
        bridge = Bridge()
        if used:
            bridge.call(echo, 1, timeout=5)
        bridge.close()
        with pytest.raises(ClientClosedError):
            bridge.call(echo, 1, timeout=5)


def test_waiting_callers_get_client_closed_and_tasks_are_cancelled() -> None:
    """Callers blocked in a call when close() happens get ClientClosedError; their
    coroutines are cancelled."""
    hangs = Hangs()
    bridge = Bridge()
    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(bridge.call, hangs.hang, i, timeout=None) for i in range(3)]
        hangs.wait_started(3)
        bridge.close()
        for f in futures:
            with pytest.raises(ClientClosedError):
                f.result(5)
    assert sorted(hangs.cancelled) == [0, 1, 2]
    assert not bridge.thread.is_alive()  # type: ignore[union-attr]


def test_a_coroutine_its_caller_let_go_of_at_close_is_still_cancelled() -> None:
    """The callers are woken by close() and drop their calls, and the collector runs,
    all before the loop shuts down: the coroutines (awaiting what nothing else
    references) are still cancelled by the shutdown, their cleanup run."""
    hangs = Hangs()
    bridge = Bridge()
    with ThreadPoolExecutor(4) as pool:  # three callers and the closer
        futures = [pool.submit(bridge.call, hangs.hang, i, timeout=None) for i in range(3)]
        hangs.wait_started(3)
        loop = bridge.loop
        assert loop is not None
        hold = threading.Event()
        loop.call_soon_threadsafe(hold.wait, 10)  # the loop thread waits here
        closer = pool.submit(bridge.close)
        for f in futures:
            with pytest.raises(ClientClosedError):
                f.result(5)
        del f, futures
        gc.collect()
        hold.set()
        closer.result(10)
    assert sorted(hangs.cancelled) == [0, 1, 2]


def test_close_from_the_loop_thread_does_not_hang() -> None:
    """close() called by a coroutine on the bridge stops the loop without joining itself."""
    bridge = Bridge()

    async def close_me() -> str:
        bridge.close()
        return "closed"

    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(bridge.call, close_me, timeout=5)
        try:
            result = future.result(5)
        except ClientClosedError:
            result = "closed"  # close() woke the caller first: also correct
    assert result == "closed"
    assert bridge.closed
    thread = bridge.thread
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()


def test_context_manager_closes() -> None:
    """`with Bridge() as b:` closes the bridge on exit."""
    with Bridge() as bridge:
        bridge.call(echo, 1, timeout=5)
    assert bridge.closed
    assert not bridge.thread.is_alive()


def test_atexit_hook_closes_forgotten_bridges() -> None:
    """The atexit hook closes every bridge still open."""
    bridge = Bridge()
    bridge.call(echo, 1, timeout=5)
    _close_all_at_exit()
    assert bridge.closed
    assert not bridge.thread.is_alive()


def test_process_exits_cleanly_with_a_forgotten_bridge() -> None:
    """A script that never closes its bridge (a call still pending) exits with status 0,
    and the pending coroutine's cleanup runs."""
    script = textwrap.dedent("""
        import asyncio, threading
        from envlink import Bridge

        b = Bridge()
        started = threading.Event()

        async def hang():
            started.set()
            try:
                await asyncio.Event().wait()
            finally:
                print("cleanup ran", flush=True)

        threading.Thread(target=lambda: b.call(hang, timeout=None), daemon=True).start()
        started.wait(5)
        print("exiting", flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=15)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["exiting", "cleanup", "ran"]


def test_exit_after_the_loop_used_its_default_executor_logs_nothing() -> None:
    """A bridge whose loop ran work in its default executor (a DNS look-up does) closes
    at exit without a warning: on 3.12 the executor's shutdown thread cannot start
    there, and its workers were joined already."""
    script = textwrap.dedent("""
        import asyncio, logging
        logging.basicConfig()
        from envlink import Bridge

        async def in_executor():
            return await asyncio.get_running_loop().run_in_executor(None, int, "7")

        print(Bridge().call(in_executor, timeout=5), flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=15)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["7"]
    assert "envlink bridge" not in proc.stderr, proc.stderr


def test_garbage_collected_bridge_stops_its_thread() -> None:
    """A bridge dropped without close() stops its loop thread (best effort, via __del__)."""
    bridge = Bridge()
    bridge.call(echo, 1, timeout=5)
    thread = bridge.thread
    del bridge
    gc.collect()
    assert thread is not None
    thread.join(5)
    assert not thread.is_alive()


def test_200_bridges_leave_no_thread_alive() -> None:
    """200 proxies on their own bridges, created, used and closed: no envlink thread left."""
    before = envlink_threads()
    for i in range(200):
        bridge = Bridge()
        proxy = SyncProxy(Echo(), bridge, timeout=5)
        assert proxy.echo(i) == i
        bridge.close()
    assert envlink_threads() - before == set()


def test_forked_child_uses_a_fresh_loop() -> None:
    """After os.fork() the child's first call through the inherited bridge starts a fresh
    loop thread and returns the right result; the parent's bridge keeps working."""
    script = textwrap.dedent("""
        import asyncio, os, sys, threading
        from envlink import Bridge

        async def where(x):
            await asyncio.sleep(0)
            return x, threading.get_ident(), id(asyncio.get_running_loop())

        b = Bridge()
        _, parent_thread, parent_loop = b.call(where, 1, timeout=5)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                value, thread, loop = b.call(where, 2, timeout=5)
                fresh = b.thread is not None and b.thread.is_alive()
                if value == 2 and fresh and b.thread.ident == thread and loop != parent_loop:
                    code = 0
                b.close()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert b.call(where, 3, timeout=5)[0] == 3
        b.close()
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=15)
    assert proc.returncode == 0, proc.stderr


def test_repr_shows_state() -> None:
    """repr() says whether the bridge is idle, running or closed."""
    bridge = Bridge()
    assert "idle" in repr(bridge)
    bridge.call(echo, 1, timeout=5)
    assert "running" in repr(bridge)
    bridge.close()
    assert "closed" in repr(bridge)
