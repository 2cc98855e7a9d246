"""A pool's clients are built from one ClientConfig, given exactly; the old mapping is
turned into one once."""

from __future__ import annotations

import dataclasses
import pickle
from typing import Any

import pytest

from envlink import (
    ClientConfig,
    ConnectionOptions,
    EnvPool,
    GenericEnvClient,
    ReconnectPolicy,
    Timeout,
)
from envlink._pool import PoolOptions
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)

CONFIG = ClientConfig(timeout=Timeout(10.0, connect=3.0),
                      options=ConnectionOptions(ping_interval=None),
                      reconnect=ReconnectPolicy(max_attempts=2), max_journal_steps=50)


class OwnInitEnv(GenericEnvClient):
    """A typed client whose own __init__ passes configuration keywords of its own."""

    def __init__(self, base_url: str) -> None:
        super().__init__(base_url, timeout=1.0, on_session_lost="replay")


@pytest.mark.parametrize("cls", [GenericEnvClient, OwnInitEnv])
async def test_a_pool_gives_its_clients_exactly_its_config(
        server: EnvServer, cls: type[GenericEnvClient]) -> None:
    """Every client of a pool built with a ClientConfig runs with that very config."""
    async with EnvPool(server.url, 3, client=cls, client_config=CONFIG) as pool:
        assert (await pool.reset()).errors == {}
        clients = pool.clients()
        assert all(type(c) is cls for c in clients)
        assert [c.config if c else None for c in clients] == [CONFIG] * 3
        assert all(c is not None and c.timeouts == CONFIG.timeout for c in clients)


async def test_the_pool_sets_only_what_it_owns(server: EnvServer) -> None:
    """A "resume" pool's clients resume, and its providers fill the config's empty ones;
    the rest of the config is the one given."""
    from opentelemetry.sdk.trace import TracerProvider

    provider = TracerProvider()
    async with EnvPool(server.url, 1, client_config=CONFIG, on_session_lost="resume",
                       tracer_provider=provider) as pool:
        await pool.reset()
        client = pool.clients()[0]
        assert client is not None
        assert client.config == dataclasses.replace(CONFIG, on_session_lost="resume",
                                                    tracer_provider=provider)


def test_the_old_mapping_becomes_a_config_once() -> None:
    """client_options (deprecated) is turned into the ClientConfig the keywords build;
    with client_config too, or with keys that are not configuration, it is refused."""
    options = PoolOptions("ws://127.0.0.1:9", 2, client_options={
        "timeout": Timeout(10.0, connect=3.0), "websocket_ping_interval_s": None,
        "reconnect": ReconnectPolicy(max_attempts=2), "max_journal_steps": 50})
    assert options.client_config == CONFIG
    assert options.for_shard(1).client_config == CONFIG
    assert pickle.loads(pickle.dumps(options)).client_config == CONFIG
    with pytest.raises(ValueError, match="not both"):
        PoolOptions("ws://127.0.0.1:9", 2, client_config=CONFIG, client_options={})
    with pytest.raises(TypeError, match=r"not client configuration: task.*functools\.partial"):
        PoolOptions("ws://127.0.0.1:9", 2, client_options={"task": "hard", "timeout": 1.0})


@pytest.mark.parametrize(("config", "error", "match"), [
    (ClientConfig(on_session_lost="replay"), ValueError, "pass on_session_lost to EnvPool"),
    ({"timeout": 1.0}, TypeError, "client_config must be a ClientConfig"),
])
def test_a_config_the_pool_cannot_take_is_refused(
        config: Any, error: type[Exception], match: str) -> None:
    """A config that sets on_session_lost (the pool's to set), or a mapping, raises."""
    with pytest.raises(error, match=match):
        EnvPool("ws://127.0.0.1:9", 1, client_config=config)


def test_pool_options_are_declared_once() -> None:
    """EnvPool takes PoolOptions' fields as its keywords: an unknown one is a TypeError."""
    with pytest.raises(TypeError, match="batch_timout"):
        EnvPool("ws://127.0.0.1:9", 1, batch_timout=3.0)
    pool = EnvPool("ws://127.0.0.1:9", 2, batch_timeout=3.0, autoreset="disabled")
    assert (pool.batch_timeout, pool.autoreset, pool.size) == (3.0, "disabled", 2)


async def test_a_ray_shard_gives_its_clients_the_drivers_config(server: EnvServer) -> None:
    """The config travels pickled in a shard's spec (as Ray sends it) and the shard's
    clients run with exactly it."""
    from envlink._pool import Shard, ShardSpec

    spec = ShardSpec(shard=0, offset=0, options=PoolOptions(
        (server.url,), 4, client_config=CONFIG).for_shard(2))
    shard = Shard(pickle.loads(pickle.dumps(spec)))
    try:
        await shard.reset([None, None], [True, True], None, {})
        assert [c.config if c else None for c in shard.pool.clients()] == [CONFIG] * 2
    finally:
        await shard.close()
