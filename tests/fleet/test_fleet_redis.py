"""FleetLimits across hosts through a real redis-server: leases, order, a store that stops."""

from __future__ import annotations

import os
import signal
import time

import pytest

from envlink._fleet.backend import Want
from envlink.server import ServerThread

from .conftest import RedisServer, Workers, most_at_once, require_redis

require_redis()
from envlink._fleet.redis_store import RedisStore  # noqa: E402 - needs the redis client

pytestmark = pytest.mark.timeout(90)


def test_processes_sharing_redis_never_exceed_the_limit(redis_server: RedisServer,
                                                        workers: Workers) -> None:
    """3 processes x 3 sessions at once, 2 rounds, max_sessions_per_endpoint=2."""
    fleet = {"store": redis_server.url, "max_sessions_per_endpoint": 2}
    with ServerThread(env="echo", max_sessions=64) as st:
        procs = [workers.start(mode="churn", url=st.url, fleet=fleet, sessions=3, rounds=2)
                 for _ in range(3)]
        results = [workers.result(p) for p in procs]
    assert [r["errors"] for r in results] == [[]] * 3
    assert len([s for r in results for s in r["spans"]]) == 18
    assert most_at_once([s for r in results for s in r["spans"]]) <= 2


def test_a_lost_holders_leases_expire(redis_server: RedisServer, workers: Workers) -> None:
    """A holder SIGKILLed (no release, no renewal): its slots come back once its lease
    (2 s) runs out, and not before it was killed."""
    fleet = {"store": redis_server.url, "max_sessions_per_endpoint": 3, "lease": 2.0}
    with ServerThread(env="echo", max_sessions=64) as st:
        holder = workers.start(mode="hold", url=st.url, fleet=fleet, sessions=3)
        assert workers.line(holder) == "held"
        waiter = workers.start(mode="churn", url=st.url, fleet=fleet, sessions=3, rounds=1)
        assert workers.line(waiter) == "ready"
        killed = time.monotonic()
        os.kill(holder.pid, signal.SIGKILL)
        result = workers.result(waiter)
        took = time.monotonic() - killed
    assert result["errors"] == []
    assert min(s for s, _ in result["spans"]) > killed
    assert took < 2.0 + 5.0


def test_held_leases_are_renewed(redis_server: RedisServer, workers: Workers) -> None:
    """A live holder keeps its slots past many lease times: a waiter stays refused until
    the deadline."""
    fleet = {"store": redis_server.url, "max_sessions_per_endpoint": 1, "lease": 0.6}
    with ServerThread(env="echo", max_sessions=64) as st:
        holder = workers.start(mode="hold", url=st.url, fleet=fleet, sessions=1)
        assert workers.line(holder) == "held"
        waiter = workers.start(mode="churn", url=st.url, fleet=fleet, sessions=1, rounds=1,
                               timeout=3.0)
        result = workers.result(waiter)
    assert len(result["errors"]) == 1 and "CapacityReachedError" in result["errors"][0]


def test_store_stopped_mid_run_fails_typed_or_falls_back(redis_server: RedisServer,
                                                         workers: Workers) -> None:
    """redis-server killed while sessions wait for slots: the waiters fail at once with
    FleetStoreError (no hang); with on_store_error='local' they open their sessions."""
    raising = {"store": redis_server.url, "max_sessions_per_endpoint": 1,
               "store_timeout": 1.0}
    local = {**raising, "on_store_error": "local"}
    with ServerThread(env="echo", max_sessions=64) as st:
        holder = workers.start(mode="hold", url=st.url, fleet=raising, sessions=1)
        assert workers.line(holder) == "held"
        failing = workers.start(mode="churn", url=st.url, fleet=raising, sessions=2,
                                rounds=1, timeout=60.0)
        falling_back = workers.start(mode="churn", url=st.url, fleet=local, sessions=2,
                                     rounds=1, timeout=60.0)
        assert workers.line(failing) == "ready" and workers.line(falling_back) == "ready"
        stopped = time.monotonic()
        redis_server.stop()
        failed, fell_back = workers.result(failing), workers.result(falling_back)
        took = time.monotonic() - stopped
    assert len(failed["errors"]) == 2
    assert all("FleetStoreError" in e for e in failed["errors"]), failed["errors"]
    assert fell_back["errors"] == [] and len(fell_back["spans"]) == 2
    assert took < 15


def test_waiters_are_served_in_arrival_order(redis_server: RedisServer) -> None:
    """Two stores (as two hosts): the oldest waiter gets the freed slot; a waiter whose
    lease ran out no longer blocks the queue."""
    a = RedisStore(redis_server.url, 2.0, 60.0, lease=30.0)
    b = RedisStore(redis_server.url, 2.0, 60.0, lease=0.2)
    try:
        held = Want("session x", 1)
        a.join([held])
        assert a.grant([held]) == [True]
        first, later = Want("session x", 1), Want("session x", 1)
        b.join([first])
        a.join([later])
        a.renew([later])
        b.renew([first])
        a.release([held])
        assert a.grant([later]) == [False]            # first is ahead
        assert b.grant([first]) == [True]
        b.release([first])
        assert a.grant([later]) == [True]
        gone = Want("session x", 1)
        b.join([gone])                                   # never renewed: gone after 0.2 s
        last = Want("session x", 1)
        a.join([last])
        a.release([later])
        assert a.grant([last]) == [False]              # gone is ahead, for now
        deadline = time.monotonic() + 10
        while a.grant([last]) != [True]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (scope,) = [s for s in a.status() if s.scope == "session x"]
        assert (scope.holders, scope.waiters, scope.limit) == (1, 0, 1)
    finally:
        a.close()
        b.close()




def test_a_refusal_lowers_the_limit_for_every_host(redis_server: RedisServer) -> None:
    """One host's CAPACITY_REACHED lowers the endpoint's limit that another host reads,
    to what the fleet held there, and it grows back by one per interval."""
    a = RedisStore(redis_server.url, 2.0, 0.5, lease=30.0)
    b = RedisStore(redis_server.url, 2.0, 0.5, lease=30.0)
    try:
        wants = [Want("session y", None) for _ in range(3)]
        for want in wants:
            a.join([want])
        assert a.grant(wants) == [True, True, True]
        assert a.refused("session y", None) == 2
        assert b.limit("session y", None) == 2
        deadline = time.monotonic() + 10
        while b.limit("session y", 5) != 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        a.close()
        b.close()


def test_steps_never_touch_the_store(redis_server: RedisServer) -> None:
    """Once a session is open, its steps go on with the store stopped (a step never
    reaches it), and closing the session does not hang on it."""
    import envlink

    fleet = envlink.FleetLimits(redis_server.url, max_sessions_per_endpoint=4,
                                store_timeout=1.0)
    config = envlink.ClientConfig(fleet=fleet, timeout=envlink.Timeout(10))
    with ServerThread(env="echo") as st:
        env = envlink.GenericEnvClient(st.url, config=config).sync()
        try:
            env.reset()
            redis_server.stop()
            started = time.monotonic()
            for _ in range(20):
                env.step({"message": "x"})
            assert time.monotonic() - started < 5
        finally:
            started = time.monotonic()
            env.close()
            assert time.monotonic() - started < 5
