"""Credentials and resume tokens never reach logs, spans or error messages."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from structlog.testing import capture_logs

from envlink import ConnectError, GenericEnvClient, HandshakeRejectedError, ReconnectPolicy
from envlink.server import EnvServer

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(30)

SECRET = "Bearer s3cr3t-t0ken"
PASSWORD = "hunter2pw"


def everything_in(spans: Any, logs: list[dict[str, Any]], errors: list[BaseException]) -> str:
    parts: list[str] = []
    for span in spans:
        parts.append(span.name)
        parts.extend(f"{k}={v}" for k, v in (span.attributes or {}).items())
        for event in span.events:
            parts.extend(f"{k}={v}" for k, v in (event.attributes or {}).items())
        parts.append(str(span.status.description))
    parts.extend(repr(entry) for entry in logs)
    for exc in errors:
        while exc is not None:
            parts.append(repr(exc))
            parts.append(str(exc))
            exc = exc.__cause__  # type: ignore[assignment]
    return "\n".join(parts)


async def test_no_secret_anywhere(server: EnvServer, otel: Otel) -> None:
    """Authorization headers, URL passwords and resume tokens appear in no span, log or error."""
    provider = otel.tracer_provider
    errors: list[BaseException] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    with capture_logs() as logs:
        env = GenericEnvClient(f"ws://alice:{PASSWORD}@127.0.0.1:{server.port}",
                               headers={"Authorization": SECRET}, tracer_provider=provider,
                               on_session_lost="resume")
        await env.reset()
        token = env._resume_token
        assert token
        await env.step({"message": "x"})
        server.faults.drop_after = 3
        await env.step({"message": "resumed"})
        await env.close()
        server.faults.refuse = 1
        server.faults.refuse_status = 401
        denied = GenericEnvClient(f"http://bob:{PASSWORD}@127.0.0.1:{server.port}",
                                  headers={"Authorization": SECRET}, tracer_provider=provider)
        with pytest.raises(HandshakeRejectedError) as info:
            await denied.reset()
        errors.append(info.value)
        unreachable = GenericEnvClient(f"ws://carol:{PASSWORD}@127.0.0.1:{dead_port}",
                                       reconnect=ReconnectPolicy(max_attempts=2),
                                       tracer_provider=provider)
        with pytest.raises(ConnectError) as info2:
            await unreachable.reset()
        errors.append(info2.value)
    text = everything_in(otel.spans(), logs, errors)
    assert server.resumes == 1
    # The haystack is real: spans, log events and errors were all captured.
    assert "rpc.method=step" in text and "envlink.session_recovered" in text
    assert "HTTP 401" in text and f"127.0.0.1:{dead_port}" in text
    assert "s3cr3t" not in text
    assert PASSWORD not in text
    assert "alice" not in text and "carol" not in text
    assert token not in text


async def test_the_handshake_headers_are_not_kept(server: EnvServer) -> None:
    """After the upgrade, the connection keeps neither the request's headers (the
    Authorization header) nor the response's (the session token), once read."""
    env = GenericEnvClient(f"ws://127.0.0.1:{server.port}", headers={"Authorization": SECRET},
                           on_session_lost="resume")
    try:
        await env.reset()
        assert env._resume_token  # read from the response before it was emptied
        conn = env._driver.connector.conn
        assert conn is not None
        ws = conn._ws  # type: ignore[attr-defined]
        # websockets drops the request; picows keeps it (a read-only field), emptied.
        assert ws.request is None or len(ws.request.headers) == 0
        assert ws.response is not None
        assert getattr(ws.response, "status_code", getattr(ws.response, "status", 0)) == 101
        assert len(ws.response.headers) == 0
        await env.step({"message": "x"})
    finally:
        await env.close()
