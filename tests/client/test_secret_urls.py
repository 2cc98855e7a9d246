"""Secrets in URLs and headers never reach what envlink shows: logs at DEBUG (the
websockets loggers included), spans, errors, ``base_url``/``ws_url``, reprs, pool views
and pool events."""

from __future__ import annotations

import logging
import socket
from typing import Any

import pytest
from structlog.testing import capture_logs

from envlink import ConnectError, ConnectionOptions, EnvPool, GenericEnvClient, ReconnectPolicy
from envlink._config import redact_text, redact_url
from envlink.server import EnvServer

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(40)

QTOKEN = "q7t0kenVALUE"
PASSWORD = "pw5ecretVALUE"
HEADER = "Bearer h3aderVALUE"
COOKIE = "sid=c00kieVALUE"


def _dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shown(spans: Any, logs: list[dict[str, Any]], records: list[logging.LogRecord],
           errors: list[BaseException], extra: list[str]) -> str:
    parts = list(extra)
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            parts.extend(f"{k}={v}" for k, v in (event.attributes or {}).items())
        parts.append(str(span.status.description))
    parts.extend(repr(entry) for entry in logs)
    parts.extend(record.getMessage() for record in records)
    for exc in errors:
        cause: BaseException | None = exc
        while cause is not None:
            parts += [repr(cause), str(cause)]
            cause = cause.__cause__ or cause.__context__
    return "\n".join(parts)


def test_redaction_rules() -> None:
    """Userinfo goes, sensitive query values go, other values and URLs in text stay."""
    assert redact_url("wss://u:p@h:1/ws?token=T&x=1&api_key=K&sig=S") == \
        "wss://h:1/ws?token=REDACTED&x=1&api_key=REDACTED&sig=REDACTED"
    assert redact_url("http://h/ws?page=2") == "http://h/ws?page=2"
    assert redact_text("failed: http://a:b@h/x?password=p now") == \
        "failed: http://h/x?password=REDACTED now"


def test_a_url_that_cannot_be_parsed_never_shows_its_credentials() -> None:
    """A malformed URL that may carry userinfo or a query is hidden whole, in the options'
    repr too; a plain string without either is left as it is."""
    from envlink import ConnectionOptions

    assert redact_url("http://user:s3cret@[::1/x") == "<unparsable URL>"
    assert redact_url("http://[::1/x?token=s3cret") == "<unparsable URL>"
    assert redact_url("not a url") == "not a url"
    shown = repr(ConnectionOptions(proxy="http://user:s3cret@[proxy:3128"))
    assert "s3cret" not in shown and "<unparsable URL>" in shown
    assert "s3cret" not in repr(ConnectionOptions(proxy="http://user:s3cret@proxy:3128"))


async def test_no_query_token_header_or_resume_token_is_shown(
        server: EnvServer, otel: Otel, caplog: pytest.LogCaptureFixture) -> None:
    """A token in the query, Authorization, Cookie, the resume token: in nothing shown."""
    caplog.set_level(logging.DEBUG)
    errors: list[BaseException] = []
    extra: list[str] = []
    with capture_logs() as logs:
        env = GenericEnvClient(f"ws://alice:{PASSWORD}@127.0.0.1:{server.port}/?token={QTOKEN}",
                               headers={"Authorization": HEADER, "Cookie": COOKIE},
                               tracer_provider=otel.tracer_provider, on_session_lost="resume")
        extra += [env.base_url, env.ws_url, repr(env._options), repr(env)]
        await env.reset()
        token = env._resume_token
        assert token
        server.faults.drop_after = 1
        await env.step({"message": "resumed across a drop"})
        await env.close()
        dead = GenericEnvClient(f"http://bob:{PASSWORD}@127.0.0.1:{_dead_port()}?token={QTOKEN}",
                                headers={"Authorization": HEADER},
                                tracer_provider=otel.tracer_provider,
                                reconnect=ReconnectPolicy(max_attempts=1))
        with pytest.raises(ConnectError) as info:
            await dead.reset()
        errors.append(info.value)
        await dead.close()
    shown = _shown(otel.spans(), logs, caplog.records, errors, extra)
    # DEBUG was captured (the transport's own log: websockets' or picows')
    assert any(r.name in ("websockets.client", "picows.client") for r in caplog.records)
    for secret in (QTOKEN, PASSWORD, HEADER, "h3aderVALUE", "c00kieVALUE", token):
        assert secret not in shown, secret


def test_connection_options_repr_hides_header_values() -> None:
    """repr(ConnectionOptions) names the headers but shows none of their values."""
    options = ConnectionOptions(headers=(("Authorization", HEADER), ("X-Api-Key", "k3yVALUE")),
                                proxy=f"http://u:{PASSWORD}@proxy:3128")
    text = repr(options)
    assert "Authorization" in text and "X-Api-Key" in text
    assert "h3aderVALUE" not in text and "k3yVALUE" not in text and PASSWORD not in text


async def test_pool_views_and_events_show_no_password(server: EnvServer) -> None:
    """breaker_changed, session_moved and view().to_dict() carry no userinfo or token."""
    dead = f"ws://alice:{PASSWORD}@127.0.0.1:{_dead_port()}/?token={QTOKEN}"
    live = f"ws://carol:{PASSWORD}@127.0.0.1:{server.port}/?key={QTOKEN}"
    with capture_logs() as logs:
        async with EnvPool([dead, live], 2, breaker_threshold=1,
                           breaker_reset_timeout=60) as pool:
            assert (await pool.reset()).ok
            view = pool.view().to_dict()
            assert view["endpoints"][0]["breaker"] == "open"
    events = [e for e in logs if "breaker" in str(e.get("event"))]
    assert events, logs
    shown = repr(view) + repr(logs)
    assert PASSWORD not in shown and QTOKEN not in shown
