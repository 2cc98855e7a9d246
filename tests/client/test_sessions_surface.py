"""OpenEnv 0.10's client surface on envlink's reference server: new_session(), base_url,
typed error-frame attributes, and "mcp" messages refused by a server without them."""

from __future__ import annotations

import asyncio

import pytest

import envlink
from envlink import GenericEnvClient
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)


async def test_new_session_opens_a_second_session_closed_with_the_parent(
        any_server: EnvServer) -> None:
    """The child is connected, separate, of the same class and options; the parent's close
    ends both sessions."""
    parent = GenericEnvClient(any_server.url + "/", timeout=5.0, on_session_lost="replay")
    await parent.reset()
    child = await parent.new_session()
    assert type(child) is GenericEnvClient
    assert child.connected and child is not parent
    assert (child.base_url, child.on_session_lost, child.timeouts) == (
        parent.base_url, "replay", parent.timeouts)
    await child.reset()
    await child.step({"message": "only in the child"})
    assert (await child.state())["step_count"] == 1
    assert (await parent.state())["step_count"] == 0
    await any_server.wait_for("session.created", 2)
    await parent.close()
    assert child.closed
    await any_server.wait_for("session.destroyed", 2)


async def test_new_session_on_a_closed_client_opens_it_again(server: EnvServer) -> None:
    """As OpenEnv's, new_session() on a closed client works (and the child is closed with
    the client); after close(final=True) it is refused."""
    client = GenericEnvClient(server.url, timeout=5.0)
    await client.close()
    child = await client.new_session()
    assert (await child.reset()).done is False
    await client.close(final=True)
    assert child.closed
    with pytest.raises(envlink.ClientClosedError):
        await client.new_session()


async def test_new_session_through_the_sync_facade(server: EnvServer) -> None:
    """The sync facade's child runs on the same bridge and is closed with its parent."""

    def run() -> None:  # blocking code, off the server's event loop
        with GenericEnvClient(server.url, timeout=5.0).sync() as env:
            env.reset()
            child = env.new_session()
            assert child.bridge is env.bridge
            child.reset()
            child.step({"message": "x"})
            assert child.state()["step_count"] == 1
            assert env.state()["step_count"] == 0
        assert child.async_client.closed

    await asyncio.to_thread(run)


def test_base_url_is_as_given_and_ws_url_is_the_socket() -> None:
    """base_url as OpenEnv reports it (no trailing slash, no credentials); ws_url the socket."""
    client = GenericEnvClient("https://user:secret@env.example:8443/api/")
    assert client.base_url == "https://env.example:8443/api"
    assert client.ws_url == "wss://env.example:8443/api/ws"
    assert "secret" not in client.base_url + client.ws_url


async def test_mcp_request_on_a_server_without_mcp_messages_is_a_server_error(
        plain_server: EnvServer) -> None:
    """A server that does not know the "mcp" type answers an error frame: a ServerError."""
    async with GenericEnvClient(plain_server.url, timeout=5.0) as env:
        await env.reset()
        with pytest.raises(envlink.ServerError) as refused:
            await env.mcp_list_tools()
        assert refused.value.code == envlink.ErrorCode.UNKNOWN_TYPE
        # The session is still usable.
        assert (await env.step({"message": "still here"})).observation is not None


async def test_mcp_request_validates_its_method() -> None:
    """A method that is not a non-empty string is the caller's error, before any I/O."""
    client = GenericEnvClient("http://127.0.0.1:9", timeout=1.0)
    for bad in ("", None, 3):
        with pytest.raises(TypeError):
            await client.mcp_request(bad)  # type: ignore[arg-type]
    await client.close()


def test_policy_auto_is_accepted_and_checked() -> None:
    """on_session_lost accepts "auto"; anything else is a ValueError naming the choices."""
    client = GenericEnvClient("http://127.0.0.1:9", on_session_lost="auto")
    assert client.on_session_lost == "auto"
    assert client.recovery == "raise"  # nothing negotiated yet, nothing to replay
    with pytest.raises(ValueError, match="'auto'"):
        client.on_session_lost = "sometimes"  # type: ignore[assignment]
    with pytest.raises(ValueError, match="'auto'"):
        GenericEnvClient("http://127.0.0.1:9", on_session_lost="never")  # type: ignore[arg-type]
