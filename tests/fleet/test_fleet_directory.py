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


def test_pools_wait_their_turn_without_a_refusal(tmp_path: Path, workers: Workers) -> None:
    """4 processes x EnvPool(8 sessions) over two servers of 8 sessions each, sharing
    FleetLimits(max_sessions=16): no slot answers an error, the servers refuse no
    session open (the pools place their sessions one pool at a time)."""
    import json
    import urllib.request

    with ServerThread(env="echo", max_sessions=8) as one, \
            ServerThread(env="echo", max_sessions=8) as two:
        fleet = {"store": str(tmp_path), "max_sessions": 16, "max_sessions_per_endpoint": 8}
        procs = [workers.start(mode="pool", urls=[one.url, two.url], fleet=fleet, sessions=8,
                               episodes=2, timeout=60.0) for _ in range(4)]
        for proc in procs:
            assert workers.line(proc) == "ready"
        for proc in procs:                      # all at once
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        results = [workers.result(p) for p in procs]
        refused = 0
        for st in (one, two):
            with urllib.request.urlopen(f"http://127.0.0.1:{st.port}/health",
                                        timeout=10) as answer:
                refused += json.loads(answer.read())["counters"].get("capacity_refused", 0)
    assert [r["errors"] for r in results] == [[]] * 4
    assert refused == 0


def test_sigkilled_holders_slots_come_back(tmp_path: Path, workers: Workers) -> None:
    """A process SIGKILLed while it holds all 32 slots: a waiting process gets them all
    within 10 s, with no server-side help."""
    fleet = {"store": str(tmp_path), "max_sessions_per_endpoint": 32}
    with ServerThread(env="echo", max_sessions=128) as st:
        holder = workers.start(mode="hold", url=st.url, fleet=fleet, sessions=32)
        assert workers.line(holder) == "held"
        waiter = workers.start(mode="churn", url=st.url, fleet=fleet, sessions=32, rounds=1,
                               timeout=30.0)
        assert workers.line(waiter) == "ready"
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        result = workers.result(waiter)
        took = time.monotonic() - killed
    assert result["errors"] == []
    assert len(result["spans"]) == 32
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
        a.join([held])
        assert a.grant([held]) == [True]
        first, later = Want("session x", 1), Want("session x", 1)
        b.join([first])
        a.join([later])
        assert a.grant([later]) == [False] and b.grant([first]) == [False]
        a.release([held])
        assert a.grant([later]) == [False]          # first is ahead
        assert b.grant([first]) == [True]
        b.release([first])
        gone = Want("session x", 1)
        b.join([gone])
        last = Want("session x", 1)
        a.join([last])
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


def test_fleet_status_command_shows_holders_waiters_and_limits(tmp_path: Path,
                                                                workers: Workers) -> None:
    """`envlink fleet status DIR` lists the endpoint's holders, their process, the live
    waiters and the limit; a missing store is exit status 1 with the reason."""
    import json
    import subprocess
    import sys

    fleet = {"store": str(tmp_path / "fleet"), "max_sessions_per_endpoint": 2}
    with ServerThread(env="echo") as st:
        holder = workers.start(mode="hold", url=st.url, fleet=fleet, sessions=2)
        assert workers.line(holder) == "held"
        waiter = workers.start(mode="churn", url=st.url, fleet=fleet, sessions=1, rounds=1)
        assert workers.line(waiter) == "ready"
        command = [sys.executable, "-m", "envlink", "fleet", "status", fleet["store"]]
        deadline = time.monotonic() + 20
        while True:
            out = subprocess.run([*command, "--json"], capture_output=True, text=True,
                                 timeout=30, check=True).stdout
            (row,) = [json.loads(line) for line in out.splitlines()]
            if row["waiters"] == 1:
                break
            assert time.monotonic() < deadline, row
        assert row["scope"] == f"session ws://127.0.0.1:{st.port}/ws"
        assert (row["holders"], row["limit"]) == (2, 2)
        assert row["processes"] == [f"{os.uname().nodename}:{holder.pid}"]
        table = subprocess.run(command, capture_output=True, text=True, timeout=30,
                               check=True).stdout
        assert "HOLDERS  WAITERS  LIMIT" in table and str(holder.pid) in table
    missing = subprocess.run([sys.executable, "-m", "envlink", "fleet", "status",
                              str(tmp_path / "none")], capture_output=True, text=True,
                             timeout=30)
    assert missing.returncode == 1 and "no fleet store" in missing.stderr


async def _two_pools_of_8(store: Path, deadline: float) -> tuple[list[object], list[object]]:
    """Two pools of 8 on one server, under max_sessions=8 of ``store``, each resetting and
    stepping at once, every call bounded by ``deadline``: each pool's errors."""
    import asyncio

    config = envlink.ClientConfig(fleet=envlink.FleetLimits(str(store), max_sessions=8),
                                  timeout=envlink.Timeout(deadline))
    with ServerThread(env="echo", max_sessions=64) as st:

        async def run() -> list[object]:
            async with envlink.EnvPool(st.url, 8, client_config=config,
                                       batch_timeout=deadline) as pool:
                results = list(await pool.reset())
                results += list(await pool.step([{"message": "x"}] * 8))
            return [r for r in results if isinstance(r, BaseException)]

        first, second = await asyncio.wait_for(asyncio.gather(run(), run()), 60)
    return first, second


async def test_two_pools_placing_at_once_do_not_hold_and_wait(tmp_path: Path) -> None:
    """Two pools of 8 resetting at once under max_sessions=8: one places all of its
    sessions, the other waits its turn and places them once the first closes (never 4
    each, both waiting for the rest until the deadline)."""
    first, second = await _two_pools_of_8(tmp_path, deadline=20)
    assert first == [] and second == []


async def test_the_placing_turn_keeps_two_pools_wants_apart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same two pools, with the first pool's last four wants held back a few loop
    iterations (as a slow process's would be): the second pool's wants must still queue
    after all of the first's. Without the placing turn they would slip in between, each
    pool would hold 4 sessions and wait for the rest until its deadline."""
    import asyncio

    from envlink._fleet.worker import PLACING, Fleet

    original = Fleet.acquire
    wants = 0

    async def acquire(self: Fleet, scope: str, *args: object, **kwargs: object) -> object:
        nonlocal wants
        if scope != PLACING:
            wants += 1
            if 5 <= wants <= 8:  # the first pool's last four
                for _ in range(50):
                    await asyncio.sleep(0)
        return await original(self, scope, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Fleet, "acquire", acquire)
    first, second = await _two_pools_of_8(tmp_path, deadline=15)
    assert first == [] and second == []
    assert wants == 16  # each session placed once: no want gave up at its deadline


def test_a_pace_is_shared_by_every_store_on_the_directory(tmp_path: Path) -> None:
    """Two stores (as two processes) taking turns of one pace of 4 per second: no second
    holds more than 4 of their turns together."""
    stores = [DirectoryStore(str(tmp_path), 2.0, 60.0) for _ in range(2)]
    taken: list[float] = []
    try:
        deadline = time.monotonic() + 2.5
        i = 0
        while time.monotonic() < deadline:
            wait = stores[i % 2].pace("opens", 4)
            i += 1
            if wait == 0.0:
                taken.append(time.time())
            else:
                time.sleep(min(wait, 0.05))     # the pace's own wait, as a caller's
    finally:
        for store in stores:
            store.close()
    assert len(taken) >= 8
    for i, first in enumerate(taken):
        assert sum(1 for t in taken[i:] if t < first + 1.0) <= 4, taken
