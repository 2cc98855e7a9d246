"""FleetLimits on one host (a directory store): real processes, a real server."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

import envlink
from envlink._fleet.backend import Want
from envlink._fleet.directory import DirectoryStore
from envlink.server import ServerThread

from .conftest import Workers, most_at_once

pytestmark = pytest.mark.timeout(90)


def test_processes_sharing_a_directory_never_exceed_the_limit(tmp_path: Path,
                                                              workers: Workers) -> None:
    """4 processes x 4 sessions at once, 3 rounds, under max_sessions_per_endpoint=3:
    never more than 3 open together, and every session opened (they waited)."""
    fleet = {"store": str(tmp_path), "max_sessions_per_endpoint": 3}
    with ServerThread(env="echo", max_sessions=64) as st:
        procs = [workers.start(mode="churn", url=st.url, fleet=fleet, sessions=4, rounds=3,
                               steps=2) for _ in range(4)]
        results = [workers.result(p) for p in procs]
    spans = [s for r in results for s in r["spans"]]
    assert [r["errors"] for r in results] == [[]] * 4
    assert len(spans) == 4 * 4 * 3
    assert most_at_once(spans) <= 3


def test_total_limit_spans_endpoints(tmp_path: Path, workers: Workers) -> None:
    """max_sessions bounds the fleet's sessions on every endpoint together."""
    fleet = {"store": str(tmp_path), "max_sessions": 2}
    with ServerThread(env="echo") as one, ServerThread(env="echo") as two:
        procs = [workers.start(mode="churn", url=url, fleet=fleet, sessions=3, rounds=2)
                 for url in (one.url, two.url)]
        results = [workers.result(p) for p in procs]
    assert [r["errors"] for r in results] == [[], []]
    assert most_at_once([s for r in results for s in r["spans"]]) <= 2


def test_sigkilled_holders_slots_come_back(tmp_path: Path, workers: Workers) -> None:
    """A process SIGKILLed while it holds every slot: a waiting process gets them at once
    (well within 10 s), with no server-side help."""
    fleet = {"store": str(tmp_path), "max_sessions_per_endpoint": 4}
    with ServerThread(env="echo", max_sessions=64) as st:
        holder = workers.start(mode="hold", url=st.url, fleet=fleet, sessions=4)
        assert workers.line(holder) == "held"
        waiter = workers.start(mode="churn", url=st.url, fleet=fleet, sessions=4, rounds=1,
                               timeout=30.0)
        assert workers.line(waiter) == "ready"
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        result = workers.result(waiter)
        took = time.monotonic() - killed
    assert result["errors"] == []
    assert len(result["spans"]) == 4
    assert min(s for s, _ in result["spans"]) > killed
    assert took < 10.0


def test_capacity_reached_lowers_the_shared_limit(tmp_path: Path, workers: Workers) -> None:
    """A server that holds 2 sessions, held by one process; another opens 2 with no
    fleet limit set: the refusal lowers the shared limit to 2, its sessions wait in the
    fleet's queue (the refusal never reaches the caller) and open once the first ends."""
    fleet = {"store": str(tmp_path)}
    store = DirectoryStore(str(tmp_path), 2.0, 3600.0)
    try:
        with ServerThread(env="echo", max_sessions=2) as st:
            scope = f"session ws://127.0.0.1:{st.port}/ws"
            holder = workers.start(mode="hold", url=st.url, fleet=fleet, sessions=2)
            assert workers.line(holder) == "held"
            waiter = workers.start(mode="churn", url=st.url, fleet=fleet, sessions=2,
                                   rounds=1, timeout=30.0)
            assert workers.line(waiter) == "ready"
            deadline = time.monotonic() + 20
            while not any(s.scope == scope and s.waiters == 2 for s in store.status()):
                assert time.monotonic() < deadline, store.status()
                time.sleep(0.02)
            (seen,) = [s for s in store.status() if s.scope == scope]
            assert seen.limit == 2 and seen.holders == 2
            assert holder.stdin is not None
            holder.stdin.close()                     # the holder closes its sessions
            result = workers.result(waiter)
    finally:
        store.close()
    assert result["errors"] == []
    assert len(result["spans"]) == 2


def test_provider_starts_paced_across_processes(tmp_path: Path, workers: Workers) -> None:
    """provider_start_rate=3 shared by 4 processes starting 3 providers each: no second
    holds more than 3 starts (every window of one second, measured from each start)."""
    fleet = {"store": str(tmp_path), "provider_start_rate": 3, "max_provider_starts": 2}
    with ServerThread(env="echo", max_sessions=64) as st:
        procs = [workers.start(mode="starts", url=st.url, fleet=fleet, starts=3)
                 for _ in range(4)]
        starts = sorted(t for p in procs for t in workers.result(p)["starts"])
    assert len(starts) == 12
    for i, first in enumerate(starts):
        assert sum(1 for t in starts[i:] if t < first + 1.0) <= 3, starts


def test_waiters_are_served_in_arrival_order(tmp_path: Path) -> None:
    """Two stores on one directory (as two processes): a slot freed goes to the oldest
    waiter, not to a later one of the releasing side; a dead waiter is skipped."""
    a = DirectoryStore(str(tmp_path), 2.0, 60.0)
    b = DirectoryStore(str(tmp_path), 2.0, 60.0)
    try:
        held = Want("session x", 1)
        a.join(held)
        assert a.grant([held]) == [True]
        first, later = Want("session x", 1), Want("session x", 1)
        b.join(first)
        a.join(later)
        assert a.grant([later]) == [False] and b.grant([first]) == [False]
        a.release([held])
        assert a.grant([later]) == [False]          # first is ahead
        assert b.grant([first]) == [True]
        b.release([first])
        gone = Want("session x", 1)
        b.join(gone)
        last = Want("session x", 1)
        a.join(last)
        b.forget()                                   # b's process is gone
        assert a.grant([later, last]) == [True, False]
    finally:
        a.close()


def test_store_that_cannot_be_used_fails_typed(tmp_path: Path) -> None:
    """A store path that is a file: the session fails at once with FleetStoreError;
    with on_store_error='local' it goes on under the process's own limits."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with ServerThread(env="echo") as st:
        config = envlink.ClientConfig(fleet=envlink.FleetLimits(str(blocker / "store")),
                                      timeout=envlink.Timeout(10))
        env = envlink.GenericEnvClient(st.url, config=config).sync()
        try:
            started = time.monotonic()
            with pytest.raises(envlink.FleetStoreError, match="not-a-dir"):
                env.reset()
            assert time.monotonic() - started < 5
        finally:
            env.close()
        local = envlink.ClientConfig(fleet=envlink.FleetLimits(
            str(blocker / "store"), on_store_error="local"), timeout=envlink.Timeout(10))
        with envlink.GenericEnvClient(st.url, config=local).sync() as env:
            env.reset()
