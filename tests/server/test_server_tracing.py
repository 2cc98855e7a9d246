"""Trace context: server spans are children of the client's traceparent."""

from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from envlink.server import EnvServer

from .._otel_support import Otel
from ._server_support import RESET, STATE, open_ws, rpc, step

pytestmark = pytest.mark.timeout(15)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
UPGRADE_TP = f"00-{TRACE_ID}-{PARENT_ID}-01"
MSG_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
MSG_PARENT_ID = "b7ad6b7169203331"
MESSAGE_TP = f"00-{MSG_TRACE_ID}-{MSG_PARENT_ID}-01"


async def test_span_parent_is_upgrade_traceparent(traced_server: EnvServer, otel: Otel) -> None:
    """Each request records a SERVER span named for its method, child of the upgrade's context."""
    headers = {"traceparent": UPGRADE_TP, "tracestate": "vendor=1",
               "Authorization": "Bearer secret"}
    async with open_ws(traced_server, headers=headers) as ws:
        await rpc(ws, RESET)
        await rpc(ws, step({"message": "hi"}))
        await rpc(ws, STATE)
    await traced_server.wait_for_disconnect(1)
    spans = otel.exporter.get_finished_spans()
    assert [s.name for s in spans] == ["reset", "step", "state"]
    session_id = (await traced_server.wait_for_connection(1)).session_id
    for span in spans:
        assert span.kind is SpanKind.SERVER
        assert span.parent is not None
        assert span.parent.is_remote
        assert format(span.parent.span_id, "016x") == PARENT_ID
        assert format(span.context.trace_id, "032x") == TRACE_ID
        assert span.context.trace_state.get("vendor") == "1"
        assert span.attributes is not None
        assert span.attributes["rpc.system.name"] == "openenv"
        assert span.attributes["rpc.method"] == span.name
        assert span.attributes["envlink.session.id"] == session_id
        assert span.status.status_code is StatusCode.UNSET
        assert "secret" not in str(dict(span.attributes))


async def test_message_traceparent_wins(traced_server: EnvServer, otel: Otel) -> None:
    """In extension mode a per-message traceparent overrides the upgrade header."""
    async with open_ws(traced_server, extensions=True, headers={"traceparent": UPGRADE_TP}) as ws:
        await rpc(ws, {**STATE, "id": "1", "traceparent": MESSAGE_TP})
        await rpc(ws, {**STATE, "id": "2"})
    await traced_server.wait_for_disconnect(1)
    first, second = otel.exporter.get_finished_spans()
    assert first.parent is not None
    assert format(first.parent.span_id, "016x") == MSG_PARENT_ID
    assert format(first.context.trace_id, "032x") == MSG_TRACE_ID
    assert second.parent is not None
    assert format(second.parent.span_id, "016x") == PARENT_ID


async def test_error_answer_marks_span(traced_server: EnvServer, otel: Otel) -> None:
    """An error answer sets error.type to its code and ERROR status."""
    async with open_ws(traced_server) as ws:
        await rpc(ws, step({"bad": 1}))
    await traced_server.wait_for_disconnect(1)
    (span,) = otel.exporter.get_finished_spans()
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes is not None
    assert span.attributes["error.type"] == "VALIDATION_ERROR"


async def test_no_traceparent_gives_root_spans(traced_server: EnvServer, otel: Otel) -> None:
    """Without trace context the server spans are roots."""
    async with open_ws(traced_server) as ws:
        await rpc(ws, STATE)
    await traced_server.wait_for_disconnect(1)
    (span,) = otel.exporter.get_finished_spans()
    assert span.parent is None
