"""wss:// is verified by default: an untrusted certificate is refused, a trusted one works."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import pytest
import trustme

from envlink import ConnectError, GenericEnvClient
from envlink.server import EnvServer

pytestmark = pytest.mark.timeout(30)


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def tls_server(ca: trustme.CA) -> AsyncIterator[EnvServer]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    async with EnvServer(env="echo", ssl=context) as srv:
        yield srv


async def test_untrusted_certificate_is_refused_and_not_retried(tls_server: EnvServer) -> None:
    """The default TLS context verifies: a test CA's certificate fails, once, as fatal."""
    assert tls_server.url.startswith("wss://")
    env = GenericEnvClient(tls_server.url)
    with pytest.raises(ConnectError, match="TLS verification failed") as info:
        await env.reset()
    assert info.value.retryable is False
    assert tls_server.connections_opened == 0
    await env.close()


async def test_trusted_certificate_works_over_https_url(tls_server: EnvServer,
                                                        ca: trustme.CA) -> None:
    """With the CA trusted, an https:// base URL reaches the server over wss://."""
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with GenericEnvClient(tls_server.http_url, ssl=context) as env:
        assert env.ws_url.startswith("wss://")
        assert env.base_url == tls_server.http_url.rstrip("/")
        reset = await env.reset()
        assert reset.observation["echoed_message"] == "Echo environment ready!"
