"""FleetLimits(store="ray:NAME"): a Ray worker and the driver share one named actor."""

from __future__ import annotations

import time
from typing import Any

import pytest

from ._ray_support import require_ray

require_ray()

import envlink  # noqa: E402
from envlink._fleet.ray_store import RayStore  # noqa: E402
from envlink.server import ServerThread  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _open_in_worker(url: str, fleet: envlink.FleetLimits) -> float:
    """A Ray task: open a session under the fleet, return how long it waited."""
    start = time.monotonic()
    config = envlink.ClientConfig(fleet=fleet, timeout=envlink.Timeout(60))
    with envlink.GenericEnvClient(url, config=config).sync() as env:
        env.reset()
    return time.monotonic() - start


def test_a_ray_task_waits_for_the_drivers_slot(ray_local: Any) -> None:
    """The driver holds the endpoint's only slot; a Ray task's session waits for it in the
    named actor's queue and opens once the driver's session ends."""
    fleet = envlink.FleetLimits("ray:test-fleet", max_sessions_per_endpoint=1)
    config = envlink.ClientConfig(fleet=fleet, timeout=envlink.Timeout(30))
    with ServerThread(env="echo") as st:
        holder = envlink.GenericEnvClient(st.url, config=config).sync()
        holder.reset()
        task = ray_local.remote(_open_in_worker).remote(st.url, fleet)
        store = RayStore("test-fleet", 10.0, 60.0, 10.0)
        scope = f"session ws://127.0.0.1:{st.port}/ws"
        deadline = time.monotonic() + 60
        while not any(s.scope == scope and s.waiters == 1 for s in store.status()):
            assert time.monotonic() < deadline, store.status()
            time.sleep(0.05)
        (row,) = [s for s in store.status() if s.scope == scope]
        assert (row.holders, row.limit) == (1, 1)
        holder.close()
        waited = ray_local.get(task, timeout=60)
    assert waited > 0
