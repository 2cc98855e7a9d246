"""Log correlation: every envlink log line carries the active span's ids."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest
import structlog
from structlog.testing import capture_logs

from envlink._telemetry import logs as _logging
from envlink._telemetry.logs import add_trace_context, get_logger, trace_context

from .._otel_support import Otel

pytestmark = pytest.mark.timeout(30)


def _ids(otel: Otel) -> tuple[str, str, object]:
    tracer = otel.tracer_provider.get_tracer("test")
    cm = tracer.start_as_current_span("work")
    span = cm.__enter__()
    ctx = span.get_span_context()
    return format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"), cm


def test_module_exports() -> None:
    """_logging exports exactly its documented names."""
    assert sorted(_logging.__all__) == sorted([
        "LOGGER_NAME", "EnvlinkLogger", "add_trace_context", "configure_logging",
        "get_logger", "trace_context"])


def test_logger_binds_ids_inside_span(otel: Otel) -> None:
    """A line logged through get_logger() in a span has that span's trace_id/span_id."""
    trace_id, span_id, cm = _ids(otel)
    try:
        with capture_logs() as logs:
            get_logger().info("envlink.connect", attempt=1)
    finally:
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]
    assert logs == [{"event": "envlink.connect", "attempt": 1, "log_level": "info",
                     "trace_id": trace_id, "span_id": span_id}]


def test_logger_adds_nothing_without_span() -> None:
    """Outside any span the event is logged unchanged (no empty or zero ids)."""
    with capture_logs() as logs:
        get_logger().bind(peer="x").warning("envlink.disconnect")
    assert logs == [{"event": "envlink.disconnect", "peer": "x", "log_level": "warning"}]


def test_processor_adds_ids_and_keeps_existing(otel: Otel) -> None:
    """add_trace_context adds the ids in a span, and never overwrites ids already bound."""
    trace_id, span_id, cm = _ids(otel)
    try:
        assert add_trace_context(None, "info", {"event": "e"}) == {
            "event": "e", "trace_id": trace_id, "span_id": span_id}
        assert add_trace_context(None, "info", {"trace_id": "a", "span_id": "b"}) == {
            "trace_id": "a", "span_id": "b"}
        assert trace_context() == {"trace_id": trace_id, "span_id": span_id}
    finally:
        cm.__exit__(None, None, None)  # type: ignore[attr-defined]
    assert add_trace_context(None, "info", {"event": "e"}) == {"event": "e"}
    assert trace_context() == {}


def test_logger_never_raises_from_broken_pipeline() -> None:
    """A processor that raises does not propagate into the library call that logs."""
    def broken(logger: object, name: str, event: dict[str, object]) -> dict[str, object]:
        raise RuntimeError("boom")

    old = structlog.get_config()
    structlog.configure(processors=[broken])
    try:
        get_logger().error("envlink.call_failed")
    finally:
        structlog.configure(**old)


def test_default_structlog_config_lines_carry_ids() -> None:
    """Unconfigured structlog: warnings go to stderr with the span's ids; info is dropped."""
    code = textwrap.dedent("""
        from opentelemetry.sdk.trace import TracerProvider
        from envlink._telemetry.logs import get_logger
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("s") as span:
            ctx = span.get_span_context()
            print("EXPECT", format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
            get_logger().info("envlink.connected")  # dropped: structlog not configured
            get_logger().warning("envlink.session_lost")
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=20, check=True)
    out = proc.stdout.splitlines()
    assert len(out) == 1  # stdout is the application's: envlink printed nothing there
    expect = out[0].split()
    lines = proc.stderr.splitlines()
    assert len(lines) == 1  # the info line was not printed; the warning went to stderr
    assert "envlink.session_lost" in lines[0]
    assert f"trace_id={expect[1]}" in lines[0]
    assert f"span_id={expect[2]}" in lines[0]


@pytest.mark.parametrize("as_json", [True, False])
def test_configure_logging_renders_ids(as_json: bool) -> None:
    """configure_logging() renders JSON or console lines, both with trace ids and level."""
    code = textwrap.dedent(f"""
        import sys
        from opentelemetry.sdk.trace import TracerProvider
        from envlink._telemetry.logs import configure_logging, get_logger
        import structlog
        configure_logging(json={as_json}, level="info", stream=sys.stdout)
        tracer = TracerProvider().get_tracer("t")
        get_logger().debug("envlink.dropped")
        with tracer.start_as_current_span("s") as span:
            ctx = span.get_span_context()
            print("EXPECT", format(ctx.trace_id, "032x"), format(ctx.span_id, "016x"))
            structlog.get_logger("app").info("app.event", n=1)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20, check=True).stdout.splitlines()
    expect = out[0].split()
    assert len(out) == 2  # the debug line was filtered out
    if as_json:
        record = json.loads(out[1])
        assert record["event"] == "app.event"
        assert record["level"] == "info"
        assert record["trace_id"] == expect[1]
        assert record["span_id"] == expect[2]
        assert record["timestamp"].endswith("Z")
    else:
        assert "app.event" in out[1]
        assert f"trace_id={expect[1]}" in out[1]


def test_configure_logging_auto_picks_json_off_terminal() -> None:
    """json=None picks JSON for a non-terminal stream."""
    code = textwrap.dedent("""
        import io, sys
        from envlink._telemetry.logs import configure_logging, get_logger
        buf = io.StringIO()
        configure_logging(stream=buf)
        get_logger().info("envlink.connect", attempt=2)
        sys.stdout.write(buf.getvalue())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=20, check=True).stdout
    record = json.loads(out)
    assert record["event"] == "envlink.connect"
    assert record["attempt"] == 2


def test_configure_logging_rejects_unknown_level() -> None:
    """An unknown level name raises ValueError before anything is configured."""
    before = structlog.get_config()
    with pytest.raises(ValueError, match="unknown log level"):
        _logging.configure_logging(level="loud", stream=io.StringIO())
    assert structlog.get_config() == before
