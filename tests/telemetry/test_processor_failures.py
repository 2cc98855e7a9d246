"""A span processor that raises never fails a call: telemetry never raises into the caller."""

from __future__ import annotations

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider

from envlink import GenericEnvClient
from envlink.server import ServerThread

pytestmark = pytest.mark.timeout(30)


class Exploding(SpanProcessor):
    """Raises on start or end of every span whose name is in ``names``."""

    def __init__(self, when: str, names: set[str]) -> None:
        self.when = when
        self.names = names
        self.raised = 0

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self.when == "start" and span.name in self.names:
            self.raised += 1
            raise RuntimeError("exporter bug on start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.when == "end" and span.name in self.names:
            self.raised += 1
            raise RuntimeError("exporter bug on end")


@pytest.mark.parametrize("nested", [False, True], ids=["merged", "nested"])
@pytest.mark.parametrize("when", ["start", "end"])
def test_failing_processor_never_fails_a_call(server_thread: ServerThread, when: str,
                                              nested: bool) -> None:
    """Client, connect and bridge spans whose processor raises: every call still returns."""
    processor = Exploding(when, {"step", "connect", "reset", "envlink.bridge step",
                                 "envlink.bridge close"})
    provider = TracerProvider()
    provider.add_span_processor(processor)
    with GenericEnvClient(base_url=server_thread.url,
                          tracer_provider=provider).sync(nested_spans=nested) as env:
        env.reset()
        for i in range(3):
            assert env.step({"message": str(i)}).observation["echoed_message"] == str(i)
        assert env.state()["step_count"] == 3
    # connect, reset, 3 steps and the facade's close; nested: also 3 bridge step spans.
    assert processor.raised >= (9 if nested else 6)
