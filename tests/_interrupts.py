"""Ctrl-C in tests: a real SIGINT sent to the main thread once a server has received a
given number of steps, and SIGINT raising ``KeyboardInterrupt`` there as in a script."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from envlink.server import ServerThread

#: The interrupted steps' injected latency: a test fails if anything waits it out.
SLOW = 5.0


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(env="deterministic") as st:
        yield st


@pytest.fixture(autouse=True)
def _sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in the main thread, as in a plain script."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def interrupt_when_steps_arrive(server: ServerThread, count: int) -> threading.Thread:
    """Send SIGINT to the main thread once the server has received the count-th step."""
    main = threading.main_thread().ident
    assert main is not None and threading.get_ident() == main

    def fire() -> None:
        server.call(lambda s: s.wait_for_request("step", count), timeout=20)
        signal.pthread_kill(main, signal.SIGINT)

    thread = threading.Thread(target=fire, name="interrupter", daemon=True)
    thread.start()
    return thread
