"""Ctrl-C during a blocking pool step: every slot's call is given up as a client's own
interrupted call is, so the pool's next step does not queue behind the late answers."""

from __future__ import annotations

import time

import pytest

from envlink import EnvPool, SessionLostError, StepResult
from envlink.server import ServerThread

from .._interrupts import SLOW, interrupt_when_steps_arrive
from .._interrupts import _sigint_raises as _sigint_raises  # autouse
from .._interrupts import server as server  # the fixture

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("policy", ["raise", "resume"])
def test_ctrl_c_mid_batch_leaves_nothing_to_wait_behind(server: ServerThread,
                                                        policy: str) -> None:
    """Two slots, their second steps slowed and interrupted: the interrupt is prompt; the
    next step answers at once (under raise, each slot's SessionLostError naming the
    interrupt; under resume, its own answer, the interrupted step applied once)."""
    pool = EnvPool([server.url], 2, on_session_lost=policy).sync()
    try:
        pool.reset(seeds=[1, 2], max_steps=100)
        pool.step([{"move": 1}, {"move": 1}])
        server.call(lambda s: setattr(s.faults, "latency", SLOW))
        fired = interrupt_when_steps_arrive(server, 4)
        start = time.perf_counter()
        try:
            with pytest.raises(KeyboardInterrupt):
                pool.step([{"move": 2}, {"move": 2}])
            assert time.perf_counter() - start < SLOW
        finally:
            fired.join(20)
            server.call(lambda s: setattr(s.faults, "latency", 0.0))
        start = time.perf_counter()
        batch = list(pool.step([{"move": 3}, {"move": 3}]))
        assert time.perf_counter() - start < 1.5  # not behind the interrupted steps
        if policy == "raise":
            assert all(isinstance(r, SessionLostError) for r in batch), batch
            assert all("blocking caller was interrupted" in str(r) for r in batch)
            assert server.call(lambda s: s.steps_applied) == 4
            assert all(isinstance(r, StepResult) for r in pool.reset(seeds=[1, 2]))
        else:
            assert [r.observation["step"] for r in batch] == [3, 3]  # type: ignore[union-attr]
            assert server.call(lambda s: s.steps_applied) == 6
    finally:
        pool.close()
