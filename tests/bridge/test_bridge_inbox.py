"""The loop's inbox: calls posted from other threads all run, in order, once; closed is clear."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from envlink import Bridge, ClientClosedError
from envlink._bridge.loop import Inbox

pytestmark = pytest.mark.timeout(20)


@pytest.fixture
def loop_inbox() -> Iterator[tuple[asyncio.AbstractEventLoop, Inbox]]:
    """A fresh selector loop (not running) with its inbox; both closed afterwards."""
    loop = asyncio.new_event_loop()
    inbox = Inbox(loop)
    try:
        yield loop, inbox
    finally:
        inbox.close(loop)
        loop.close()


def _run_until(loop: asyncio.AbstractEventLoop, done: asyncio.Future[None],
               extra_iterations: int = 0) -> None:
    async def settle() -> None:
        await done
        for _ in range(extra_iterations):  # iterations for the reader to read the rest
            await asyncio.sleep(0)

    loop.run_until_complete(asyncio.wait_for(settle(), 10))


def test_a_burst_posted_before_the_loop_reads_runs_in_order_and_drains_the_socket(
        loop_inbox: tuple[asyncio.AbstractEventLoop, Inbox]) -> None:
    """10,000 posts (more wake-up bytes than one read takes): every call runs once, in
    order, and the wake-up socket ends empty."""
    loop, inbox = loop_inbox
    ran: list[int] = []
    done = loop.create_future()
    for i in range(10_000):
        inbox.post(ran.append, i)
    inbox.post(done.set_result, None)
    _run_until(loop, done, extra_iterations=4)  # 10,001 bytes, 4096 a read
    assert ran == list(range(10_000))
    assert inbox._reader is not None
    with pytest.raises(BlockingIOError):
        inbox._reader.recv(1)


def test_posts_from_many_threads_all_run_once_in_each_threads_order(
        loop_inbox: tuple[asyncio.AbstractEventLoop, Inbox]) -> None:
    """Eight threads posting at once while the loop runs: nothing lost, nothing doubled."""
    loop, inbox = loop_inbox
    ran: list[tuple[int, int]] = []
    per_thread, threads = 2_000, 8
    done = loop.create_future()

    def count(item: tuple[int, int]) -> None:
        ran.append(item)
        if len(ran) == per_thread * threads:
            done.set_result(None)

    start = threading.Barrier(threads)

    def poster(t: int) -> None:
        start.wait()
        for i in range(per_thread):
            inbox.post(count, (t, i))

    workers = [threading.Thread(target=poster, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    _run_until(loop, done)
    for w in workers:
        w.join(5)
    for t in range(threads):
        assert [i for (u, i) in ran if u == t] == list(range(per_thread))
    assert len(ran) == per_thread * threads


def test_a_posted_call_that_raises_is_reported_and_the_next_still_runs(
        loop_inbox: tuple[asyncio.AbstractEventLoop, Inbox]) -> None:
    """As with a loop handle: the exception goes to the loop's exception handler."""
    loop, inbox = loop_inbox
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: reported.append(ctx))

    def fail() -> None:
        raise ValueError("posted failure")

    done = loop.create_future()
    inbox.post(fail)
    inbox.post(done.set_result, None)
    _run_until(loop, done)
    assert done.result() is None
    assert [type(c["exception"]) for c in reported] == [ValueError]
    assert "posted call" in reported[0]["message"]


def test_post_on_a_closed_inbox_raises_runtime_error() -> None:
    """After the loop thread has ended, a post says so instead of queueing forever."""
    loop = asyncio.new_event_loop()
    inbox = Inbox(loop)
    inbox.close(loop)
    loop.close()
    with pytest.raises(RuntimeError, match="ended"):
        inbox.post(print, "never")


def test_a_loop_that_cannot_watch_a_socket_gets_its_calls_by_call_soon_threadsafe() -> None:
    """Where add_reader is not implemented (Windows' proactor loop), posts still run, in
    order, and a post after the loop closed raises RuntimeError."""
    class NoReaders(asyncio.SelectorEventLoop):
        def add_reader(self, *args: Any) -> None:
            raise NotImplementedError

    loop = NoReaders()
    inbox = Inbox(loop)
    ran: list[int] = []
    try:
        assert inbox._writer is None
        done = loop.create_future()
        for i in range(100):
            inbox.post(ran.append, i)
        inbox.post(done.set_result, None)
        _run_until(loop, done)
        assert ran == list(range(100))
    finally:
        inbox.close(loop)
        loop.close()
    with pytest.raises(RuntimeError):
        inbox.post(print, "never")


def test_the_bridge_closes_its_inbox_with_its_loop() -> None:
    """No socket outlives the bridge's loop thread; a later call is a clear error."""
    bridge = Bridge()

    async def one() -> int:
        return 1

    assert bridge.call(one, timeout=5) == 1
    inbox = bridge._inbox
    assert inbox is not None
    bridge.close()
    assert inbox._reader is not None and inbox._writer is not None
    assert inbox._reader.fileno() == -1 and inbox._writer.fileno() == -1
    with pytest.raises(ClientClosedError):
        bridge.call(one, timeout=5)


def test_a_call_whose_loop_thread_ended_under_it_is_closed_not_hung() -> None:
    """The loop thread gone but the bridge not closed (its post fails): the call gets
    ClientClosedError at once."""
    bridge = Bridge()

    async def one() -> int:
        return 1

    try:
        assert bridge.call(one, timeout=5) == 1
        loop, thread = bridge.loop, bridge.thread
        assert loop is not None and thread is not None
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        assert not thread.is_alive()
        with pytest.raises(ClientClosedError):
            bridge.call(one, timeout=5)
    finally:
        bridge.close()


def test_no_inbox_is_a_clear_error_and_leaves_no_loop_open(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The inbox cannot be made when the bridge starts (no socket pair: out of file
    descriptors): the call raises that OSError, the loop made for it is closed, and a
    later call, once it can be made, works."""
    from envlink._bridge import loop as loop_module

    made: list[asyncio.AbstractEventLoop] = []
    real_new_loop = loop_module.loop_factory()

    def new_loop() -> asyncio.AbstractEventLoop:
        made.append(real_new_loop())
        return made[-1]

    class NoPair(Inbox):
        def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
            raise OSError(24, "Too many open files")

    monkeypatch.setattr(loop_module, "loop_factory", lambda: new_loop)
    monkeypatch.setattr(loop_module, "Inbox", NoPair)
    bridge = Bridge()

    async def one() -> int:
        return 1

    try:
        with pytest.raises(OSError, match="Too many open files"):
            bridge.call(one, timeout=5)
        assert len(made) == 1 and made[0].is_closed()
        monkeypatch.setattr(loop_module, "Inbox", Inbox)
        assert bridge.call(one, timeout=5) == 1
    finally:
        bridge.close()
