"""Which transport a client uses: ClientConfig(transport=...), ENVLINK_TRANSPORT, the log
line that names it, and what the picows transport leaves to websockets."""

from __future__ import annotations

import logging

import pytest

from envlink import ClientConfig, GenericEnvClient, InvalidArgumentError
from envlink._transports import choice
from envlink._transports.websocket import WebSocketTransport
from envlink.server import EnvServer

from .test_proxy_route import REMOTE, ConnectProxy, https_proxy_only  # noqa: F401

pytest.importorskip("picows")
from envlink._transports.picows_ws import PicowsTransport

pytestmark = pytest.mark.timeout(30)

URL = "ws://127.0.0.1:9"  # nothing is connected: the clients are only built


@pytest.fixture(autouse=True)
def _fresh_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(choice.TRANSPORT_VARIABLE, raising=False)
    monkeypatch.setattr(choice, "_said", set())


def _transport(client: GenericEnvClient) -> object:
    return client._transport


def test_the_default_is_auto_and_auto_is_picows_when_installed() -> None:
    """A client that names no transport uses "auto": picows, where it is installed."""
    assert ClientConfig().transport is None
    assert isinstance(_transport(GenericEnvClient(URL)), PicowsTransport)


def test_names_pick_the_transport() -> None:
    """"websockets" and "picows" are those transports; "auto" is picows when installed."""
    assert isinstance(_transport(GenericEnvClient(URL, transport="websockets")),
                      WebSocketTransport)
    assert isinstance(_transport(GenericEnvClient(URL, transport="picows")), PicowsTransport)
    assert isinstance(_transport(GenericEnvClient(URL, transport="auto")), PicowsTransport)


def test_an_unknown_name_is_refused_at_once() -> None:
    """A name that is no transport: InvalidArgumentError (a ValueError) from the config."""
    with pytest.raises(InvalidArgumentError, match="transport must be one of"):
        ClientConfig(transport="fastest")  # type: ignore[arg-type]


def test_picows_without_picows_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """transport="picows" where picows is not installed: InvalidArgumentError saying how
    to install it; "auto" then falls back to websockets."""
    monkeypatch.setattr(choice, "_installed", False)
    with pytest.raises(InvalidArgumentError, match=r"envlink\[fast\]"):
        GenericEnvClient(URL, transport="picows")
    assert isinstance(_transport(GenericEnvClient(URL, transport="auto")), WebSocketTransport)


def test_the_variable_forces_the_default_not_a_given_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """ENVLINK_TRANSPORT decides for clients that name no transport or "auto"; a name
    given in the configuration wins; a bad value is an InvalidArgumentError."""
    monkeypatch.setenv(choice.TRANSPORT_VARIABLE, "websockets")
    assert isinstance(_transport(GenericEnvClient(URL)), WebSocketTransport)
    assert isinstance(_transport(GenericEnvClient(URL, transport="auto")), WebSocketTransport)
    assert isinstance(_transport(GenericEnvClient(URL, transport="picows")), PicowsTransport)
    monkeypatch.setenv(choice.TRANSPORT_VARIABLE, "picows")
    assert isinstance(_transport(GenericEnvClient(URL)), PicowsTransport)
    monkeypatch.setenv(choice.TRANSPORT_VARIABLE, "quic")
    with pytest.raises(InvalidArgumentError, match="ENVLINK_TRANSPORT"):
        GenericEnvClient(URL)


def test_the_transport_in_use_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    """The first client of a transport says it in the log; later ones do not."""
    caplog.set_level(logging.INFO, logger="envlink.transport")
    GenericEnvClient(URL, transport="picows")
    GenericEnvClient(URL, transport="picows")
    said = [r.getMessage() for r in caplog.records if r.name == "envlink.transport"]
    assert len(said) == 1 and "picows transport" in said[0]


async def test_deflate_goes_through_websockets_said_once(
        server: EnvServer, caplog: pytest.LogCaptureFixture) -> None:
    """compression="deflate" on picows: the connection is websockets' (picows has no
    permessage-deflate), and the log says so once."""
    caplog.set_level(logging.INFO, logger="envlink.transport")
    async with GenericEnvClient(server.url, transport="picows", compression="deflate") as env:
        assert (await env.step({"message": "squeezed"})).observation[
            "echoed_message"] == "squeezed"
        assert type(env._driver.connector.conn).__name__ == "WebSocketConnection"
    said = [r.getMessage() for r in caplog.records if "fallback" in r.getMessage()]
    assert len(said) == 1 and "deflate" in said[0]


async def test_a_proxied_url_goes_through_websockets(
        https_proxy_only: ConnectProxy) -> None:  # noqa: F811
    """With HTTPS_PROXY set, picows's client reaches a remote ws:// server through the
    proxy (by websockets' transport), as the websockets client does."""
    from envlink.server import ServerThread

    with ServerThread(env="echo") as st:
        url = f"ws://{REMOTE}:{st.port}"
        async with GenericEnvClient(url, transport="picows") as env:
            assert (await env.step({"message": "via proxy"})).observation[
                "echoed_message"] == "via proxy"
    assert https_proxy_only.requests == [f"CONNECT {REMOTE}:{st.port} HTTP/1.1"]


async def test_a_loopback_url_stays_on_picows(server: EnvServer) -> None:
    """Without a proxy, the picows transport opens picows connections."""
    async with GenericEnvClient(server.url, transport="picows") as env:
        await env.reset()
        assert type(env._driver.connector.conn).__name__ == "PicowsConnection"
