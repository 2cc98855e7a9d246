"""Readiness and discovery: wait_until_ready, health, schema, metadata (async and sync)."""

from __future__ import annotations

import asyncio
import socket

import pytest

from envlink import (
    ClientClosedError,
    EnvironmentMetadata,
    EnvironmentSchema,
    GenericEnvClient,
    Health,
    HttpStatusError,
    NotReadyError,
    ProtocolError,
    ReconnectPolicy,
    RetryBudget,
)
from envlink.server import EnvServer, ServerThread

pytestmark = pytest.mark.timeout(20)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_discovery_calls_return_typed_models(server: EnvServer) -> None:
    """health(), schema() and metadata() return pydantic models of the server's answers."""
    async with GenericEnvClient(server.http_url) as client:
        health = await client.health()
        schema = await client.schema()
        meta = await client.metadata()
    assert isinstance(health, Health) and health.healthy
    assert isinstance(schema, EnvironmentSchema) and "step_count" in schema.state["properties"]
    assert isinstance(meta, EnvironmentMetadata) and meta.name == "echo_env"


async def test_wait_until_ready_returns_health(server: EnvServer) -> None:
    """wait_until_ready() on a running server answers at once with its health."""
    client = GenericEnvClient(server.http_url)
    health = await client.wait_until_ready(5)
    assert health.status == "healthy"
    await client.close()


async def test_not_ready_at_the_deadline_is_typed() -> None:
    """Nothing listening: NotReadyError after the deadline, with the attempts made."""
    client = GenericEnvClient(f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(NotReadyError, match=r"was not ready within 0\.3s") as info:
        await client.wait_until_ready(0.3)
    assert info.value.attempts >= 1 and info.value.last_status is None
    await client.close()


async def test_a_wait_lasts_until_its_deadline_with_a_last_poll_then() -> None:
    """wait_until_ready(N) on a dead port gives up at N seconds, not at the last backoff
    that fitted: the backoff is cut to end at the deadline and a last poll made then."""
    client = GenericEnvClient(f"http://127.0.0.1:{_closed_port()}")
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(NotReadyError, match=r"was not ready within 2s") as info:
        await client.wait_until_ready(2.0)
    assert loop.time() - started >= 2.0
    assert info.value.attempts >= 2
    await client.close()


async def test_a_wait_spends_no_retry_budget_and_ends_at_its_deadline() -> None:
    """A wait is no retry of a failure: under a client whose shared retry budget is
    empty (and a policy of 2 tries), wait_until_ready(N) still polls until N seconds,
    ends with NotReadyError, and leaves the budget as it was."""
    budget = RetryBudget(max_tokens=2)
    assert budget.try_spend() and not budget.try_spend()
    left = budget.tokens
    client = GenericEnvClient(f"http://127.0.0.1:{_closed_port()}",
                              reconnect=ReconnectPolicy(max_attempts=2, budget=budget))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(NotReadyError, match=r"within 1\.5s") as info:
        await client.wait_until_ready(1.5)
    assert loop.time() - started >= 1.5
    assert info.value.attempts > 2
    assert budget.tokens == left
    await client.close()


async def test_an_error_status_is_not_waited_for(server: EnvServer) -> None:
    """A 404 is not "not ready yet": HttpStatusError at once, with the status."""
    client = GenericEnvClient(server.http_url + "/nowhere")
    with pytest.raises(HttpStatusError) as info:
        await client.wait_until_ready(5)
    assert info.value.status == 404
    with pytest.raises(HttpStatusError):
        await client.schema()
    await client.close()


async def test_a_body_of_the_wrong_shape_is_a_protocol_error(server: EnvServer) -> None:
    """/state is JSON but not a schema: ProtocolError names the model."""
    client = GenericEnvClient(server.http_url)
    from envlink import EnvironmentSchema as Model
    from envlink._launch.discovery import fetch_model

    with pytest.raises(ProtocolError, match="not a EnvironmentSchema"):
        await fetch_model(Model, client._endpoint, client._options, "/state", 5)
    await client.close()


async def test_a_closed_client_reads_again_unless_closed_for_good(server: EnvServer) -> None:
    """After close(), discovery calls work again (as every call); after
    close(final=True) they raise ClientClosedError."""
    client = GenericEnvClient(server.http_url)
    await client.close()
    assert (await client.health()).status == "healthy"
    await client.close(final=True)
    with pytest.raises(ClientClosedError):
        await client.health()


def test_sync_facade_has_the_discovery_calls(server_thread: ServerThread) -> None:
    """Through .sync(): wait_until_ready, health, schema and metadata block and return models."""
    with GenericEnvClient(server_thread.http_url).sync() as env:
        assert env.wait_until_ready(5).healthy
        assert env.metadata().name == "echo_env"
        assert "action" in env.schema().model_dump()
        assert env.health().status == "healthy"
