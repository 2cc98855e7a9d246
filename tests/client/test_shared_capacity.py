"""Capacity shared across a process's clients: Limits, the FIFO queue and on_capacity="wait"."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from envlink import (
    CapacityReachedError,
    GenericEnvClient,
    Limits,
    get_limits,
    set_limits,
    set_testing,
)
from envlink._client import capacity
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(60)

CLIENTS = 8


@pytest.fixture
def server() -> Iterator[ServerThread]:
    with ServerThread(env="echo", max_sessions=2) as st:
        yield st


@pytest.fixture
def shared_limit() -> Iterator[None]:
    previous = set_limits(Limits(max_sessions_per_endpoint=2))
    try:
        yield
    finally:
        set_limits(previous)


class QueueSpy:
    """Wraps the real ledger's acquire: says when ``expected`` callers are queued."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, expected: int) -> None:
        self.queued = 0
        self.expected = expected
        self.all_queued = threading.Event()
        self._lock = threading.Lock()
        real = capacity.LEDGER.acquire

        def acquire(key: str, limit: int | None, waiter: Any) -> bool:
            granted = real(key, limit, waiter)
            if not granted:
                with self._lock:
                    self.queued += 1
                    if self.queued >= self.expected:
                        self.all_queued.set()
            return granted

        monkeypatch.setattr(capacity.LEDGER, "acquire", acquire)


def _episode(url: str, index: int, errors: list[BaseException], **options: Any) -> None:
    try:
        with GenericEnvClient(url, on_capacity="wait", **options).sync() as env:
            env.reset()
            for step in range(3):
                reply = env.step({"message": f"{index}.{step}"})
                assert reply.observation["echoed_message"] == f"{index}.{step}"
    except BaseException as exc:
        errors.append(exc)


@pytest.mark.usefixtures("shared_limit")
def test_eight_clients_queue_for_two_sessions_and_all_finish(
        server: ServerThread, monkeypatch: pytest.MonkeyPatch) -> None:
    """Eight independent sync clients, a server limited to two sessions and the shared limit
    of two: six queue while two hold sessions, then every one finishes, none errors."""
    spy = QueueSpy(monkeypatch, expected=CLIENTS - 2)
    holders = [GenericEnvClient(server.url).sync() for _ in range(2)]
    for holder in holders:
        holder.reset()
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_episode, args=(server.url, i, errors))
               for i in range(CLIENTS - 2)]
    for t in threads:
        t.start()
    assert spy.all_queued.wait(20), f"only {spy.queued} queued"
    assert server.call(lambda srv: srv.connections_opened) == 2  # nobody got past the limit
    for holder in holders:
        holder.close()
    for t in threads:
        t.join(30)
    assert not [t for t in threads if t.is_alive()]
    assert errors == []
    # Every client's session ran to its end on the server, two at a time at most.
    server.call(lambda srv: srv.wait_for("session.destroyed", CLIENTS), timeout=20)
    assert server.call(lambda srv: srv.connections_opened) == CLIENTS
    assert capacity.LEDGER.held(holders[0].async_client.ws_url) == 0


def test_without_wait_the_third_client_fails_at_once(server: ServerThread) -> None:
    """With no local limit and on_capacity left at "raise", a third session is refused by
    the server and the caller gets CapacityReachedError from its first try."""
    holders = [GenericEnvClient(server.url).sync() for _ in range(2)]
    third = GenericEnvClient(server.url).sync()
    try:
        for holder in holders:
            holder.reset()
        with pytest.raises(CapacityReachedError) as refused:
            third.reset()
        assert refused.value.max_sessions == 2
        assert refused.value.details.get("local") is None  # the server's answer
        assert server.call(lambda srv: srv.connections_opened) == 3  # one try, no retry
    finally:
        for env in (*holders, third):
            env.close()


@pytest.mark.usefixtures("shared_limit")
def test_a_full_local_limit_fails_at_once_without_wait(server: ServerThread) -> None:
    """With the shared limit full and on_capacity="raise", the third client gets a local
    CapacityReachedError without touching the server; a slot freed is usable again."""
    holders = [GenericEnvClient(server.url).sync() for _ in range(2)]
    third = GenericEnvClient(server.url).sync()
    try:
        for holder in holders:
            holder.reset()
        with pytest.raises(CapacityReachedError) as refused:
            third.reset()
        assert refused.value.details == {"local": True}
        assert (refused.value.active_sessions, refused.value.max_sessions) == (2, 2)
        assert server.call(lambda srv: srv.connections_opened) == 2
        holders[0].close()
        assert third.reset().observation["echoed_message"] == "Echo environment ready!"
    finally:
        for env in (*holders, third):
            env.close()


def test_wait_retries_the_servers_refusal_until_a_session_ends(server: ServerThread) -> None:
    """With no local limit, on_capacity="wait" retries CAPACITY_REACHED (backoff, woken when
    a session of the endpoint ends) and succeeds once a holder closes."""
    holders = [GenericEnvClient(server.url).sync() for _ in range(2)]
    errors: list[BaseException] = []
    with set_testing(False):
        for holder in holders:
            holder.reset()
        waiter = threading.Thread(target=_episode, args=(server.url, 9, errors))
        waiter.start()
        # Its first try was refused (the refused connection is closed by the server).
        server.call(lambda srv: srv.wait_for("connection.closed", 1), timeout=20)
        holders[0].close()
        waiter.join(30)
    holders[1].close()
    assert not waiter.is_alive()
    assert errors == []
    assert server.call(lambda srv: srv.connections_opened) >= 4  # refused, then admitted


async def test_a_capacity_wait_has_no_try_cap_before_its_deadline() -> None:
    """Waiting for room is no retry of a failure: the server's CAPACITY_REACHED is waited
    out for as many tries as fit before the call's deadline (here 1500, the backoffs
    removed), not given up after a count of its own."""
    gate = capacity.CapacityGate("ws://127.0.0.1:9/ws", None, "wait")
    tries = 0

    async def attempt() -> str:
        nonlocal tries
        tries += 1
        if tries < 1500:
            raise CapacityReachedError("full", active_sessions=1, max_sessions=1)
        return "admitted"

    with set_testing():
        assert await gate.call("reset", 30.0, attempt) == "admitted"
    gate.release()
    assert tries == 1500


@pytest.mark.usefixtures("shared_limit")
def test_a_queued_wait_ends_at_the_deadline_with_the_typed_error(server: ServerThread) -> None:
    """A client queued behind a full limit gets CapacityReachedError when its call's
    deadline comes, and its place in the queue is given up."""
    holders = [GenericEnvClient(server.url).sync() for _ in range(2)]
    late = GenericEnvClient(server.url, on_capacity="wait").sync()
    try:
        for holder in holders:
            holder.reset()
        with pytest.raises(CapacityReachedError, match="deadline"):
            late.reset(timeout=1.0)
        holders[0].close()
        assert late.reset().done is False
    finally:
        for env in (*holders, late):
            env.close()


def test_per_client_limits_and_validation(server: ServerThread) -> None:
    """A client's own Limits apply to it (the process-wide ones stay unset); bad values are
    typed errors."""
    assert get_limits() == Limits()
    one = Limits(max_sessions_per_endpoint=1)
    first = GenericEnvClient(server.url, limits=one).sync()
    second = GenericEnvClient(server.url, limits=one).sync()
    try:
        first.reset()
        with pytest.raises(CapacityReachedError):
            second.reset()
    finally:
        first.close()
        second.close()
    with pytest.raises(ValueError, match="max_sessions_per_endpoint"):
        Limits(max_sessions_per_endpoint=0)
    with pytest.raises(ValueError, match="on_capacity"):
        GenericEnvClient(server.url, on_capacity="later")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Limits"):
        GenericEnvClient(server.url, limits=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Limits"):
        set_limits(3)  # type: ignore[arg-type]


@pytest.mark.usefixtures("shared_limit")
def test_a_pool_and_a_lone_client_share_the_limit(server: ServerThread) -> None:
    """A pool's sessions count against the same process-wide limit as independent clients:
    with the pool holding both, a lone client is refused locally until the pool closes."""
    from envlink import EnvPool

    lone = GenericEnvClient(server.url).sync()
    try:
        with EnvPool(server.url, 2).sync() as pool:
            assert pool.reset(seeds=0).ok
            assert capacity.LEDGER.held(lone.async_client.ws_url) == 2
            with pytest.raises(CapacityReachedError) as refused:
                lone.reset()
            assert refused.value.details == {"local": True}
        assert lone.reset().done is False
    finally:
        lone.close()
