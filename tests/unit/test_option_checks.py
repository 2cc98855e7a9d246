"""Connection options are checked when built: headers, ssl=, TLS with a non-TLS URL."""

from __future__ import annotations

import ssl

import pytest

from envlink import ConnectionOptions, GenericEnvClient

pytestmark = pytest.mark.timeout(10)


@pytest.mark.parametrize("pair", [("X-Api-Key", "k\r\nX-Injected: 1"), ("X-A", "a\nb"),
                                  ("X-A", "a\0b"), ("Bad Name", "v"), ("X:Y", "v"), ("", "v")])
def test_headers_with_cr_lf_or_a_bad_name_are_refused(pair: tuple[str, str]) -> None:
    """A header that could inject another (CR/LF/NUL, or a name that is no token) is a
    ValueError when the options are built, for the WebSocket and POST /mcp alike."""
    with pytest.raises(ValueError, match="header"):
        ConnectionOptions(headers=(pair,))
    with pytest.raises(ValueError, match="header"):
        GenericEnvClient("http://127.0.0.1:9", headers=dict([pair]))


@pytest.mark.parametrize("value", ["yes", True, 1, object()])
def test_ssl_must_be_a_context(value: object) -> None:
    """ssl="yes" (or another non-context) is a TypeError at once, not an AttributeError later."""
    with pytest.raises(TypeError, match="SSLContext"):
        ConnectionOptions(ssl=value)


def test_a_tls_context_with_a_plain_url_is_refused() -> None:
    """An SSLContext with http:// or ws:// is a ValueError: Authorization would go in clear."""
    context = ssl.create_default_context()
    with pytest.raises(ValueError, match="not TLS"):
        GenericEnvClient("http://127.0.0.1:9", ssl=context)
    with pytest.raises(ValueError, match="not TLS"):
        GenericEnvClient("ws://127.0.0.1:9", options=ConnectionOptions(ssl=context))
    GenericEnvClient("https://127.0.0.1:9", ssl=context)  # accepted with TLS
