"""EnvPool: batches of sessions over many endpoints, and the in-actor shard.

What ``envlink.ray`` builds on is named here: the interface both pools offer, the
options both check, the hook both report to, the shard an actor runs, and the
batch runner and helpers both use (one ready-first collection).
"""

from envlink._events.pool_events import BatchReport, BatchStarted, PoolHook
from envlink._pool.batch import BatchRunner, seed_list, single_result, slot_mask
from envlink._pool.interface import AsyncPool
from envlink._pool.options import AutoresetMode, PoolOptions
from envlink._pool.pool import EnvPool, pool_telemetry_hook
from envlink._pool.results import Batch, EndpointView, PoolView, SlotRecord, SlotResult
from envlink._pool.shard import (
    DriverSlot,
    Shard,
    ShardAnswer,
    ShardSpec,
    ShardTelemetry,
    SlotRestore,
)

__all__ = [
    "AsyncPool",
    "AutoresetMode",
    "Batch",
    "BatchReport",
    "BatchRunner",
    "BatchStarted",
    "DriverSlot",
    "EndpointView",
    "EnvPool",
    "PoolHook",
    "PoolOptions",
    "PoolView",
    "Shard",
    "ShardAnswer",
    "ShardSpec",
    "ShardTelemetry",
    "SlotRecord",
    "SlotRestore",
    "SlotResult",
    "pool_telemetry_hook",
    "seed_list",
    "single_result",
    "slot_mask",
]
