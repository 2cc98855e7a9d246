"""``envlink demo``: a traced episode against the reference server, on loopback.

Starts the reference echo server on a free 127.0.0.1 port, runs one episode
through the traced sync facade (reset, several ``echo_message`` calls, an
``echo_with_length``, a ``list_tools``, ``state``) and prints what happened: each
call with its latency, the totals, the episode's span tree (sync hop → client
call → server span) and latency percentiles per method. Metrics can be exposed
to Prometheus and everything exported over OTLP at the same time.

Mid-episode (unless ``--no-fault``) the server drops the connection once, through
its fault-injection controls, after applying a step and before answering it. The
client (``on_session_lost="auto"``: resume where the server offers it, as this one
does) re-attaches to the same server-side session and gets that step's answer from
the server's de-duplication cache: the demo checks with the server that no step
was lost or applied twice, says so, and fails (exit status 1) if one was.
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import textwrap
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import FrameType
from typing import IO, Any

from envlink._sansio.policies import SessionLostPolicy
from envlink.names import ATTR_REASON, ATTR_RECOVERY

__all__ = ["DESCRIPTION", "add_arguments", "demo_from_args", "percentile", "run_demo"]

_PROG = "envlink demo"
#: Width of the report's wrapped explanations.
_WIDTH = 92
_ROOT_SPAN = "envlink demo episode"
_KIND = {"SpanKind.INTERNAL": "internal", "SpanKind.CLIENT": "client",
         "SpanKind.SERVER": "server", "SpanKind.PRODUCER": "producer",
         "SpanKind.CONSUMER": "consumer"}


# The client's recovery spans (docs/telemetry.md), and the server's de-duplication mark
# (envlink.server._observe.ATTR_SERVER_DEDUP).
_SPAN_RESUME = "resume"
_SPAN_REPLAY = "replay"
_ATTR_SERVER_DEDUP = "envlink.server.dedup"
#: The client's recovery policy in the demo (the embedded server offers resumption).
_POLICY: SessionLostPolicy = "auto"


class _DemoError(Exception):
    """A failure the demo reports as one line on stderr."""


@dataclass
class _Call:
    label: str
    method: str
    seconds: float
    result: str
    note: str = ""


@dataclass
class _Recovery:
    """What the demo's injected connection drop did, as the client and server saw it."""

    fault_step: int | None  # the step (1-based, of the episode) whose connection dropped
    steps_asked: int  # steps the demo asked for (every step() call)
    journal_steps: int  # steps in the client's episode journal afterwards
    mechanism: str  # the client's recovery mechanism (client.recovery)
    state_step_count: int  # step_count in the server's state() answer
    session_step_count: int  # the server's own count for the session
    steps_applied: int  # steps the server applied (de-duplicated ones excluded)
    sessions_created: int
    resumes: int
    dedup_hits: int
    drops: int


@dataclass
class _Episode:
    calls: list[_Call]
    elapsed: float
    url: str
    recovery: _Recovery
    #: the rollout files written (``--record``), else empty.
    recorded: list[str] = field(default_factory=list)


def percentile(samples: Sequence[float], p: int) -> float:
    """The ``p``-th percentile of ``samples``, linearly interpolated between ranks.

    :func:`statistics.quantiles` with the ``inclusive`` method (the samples are
    the whole population of the demo's calls).

    Args:
        samples: the values (any order, at least one).
        p: the percentile, an integer within 0..100.

    Raises:
        ValueError: ``samples`` is empty or ``p`` is out of range.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not (0 <= p <= 100 and float(p).is_integer()):
        raise ValueError(f"percentile must be an integer within 0..100, got {p}")
    if len(samples) == 1 or p in (0, 100):
        return float(max(samples) if p == 100 else min(samples))
    return statistics.quantiles(samples, n=100, method="inclusive")[int(p) - 1]


DESCRIPTION = ("Start the reference server on a free loopback port, run a traced episode "
               "against it through the sync facade (the server drops the connection once "
               "mid-episode and the client resumes the session), and report latencies, the "
               "recovery and the span tree.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``envlink demo`` to ``parser``."""
    parser.add_argument("--steps", type=int, default=5, metavar="N",
                        help="number of echo_message steps (default: 5)")
    parser.add_argument("--no-fault", action="store_true",
                        help="do not drop the connection mid-episode (by default the server "
                             "drops it once, after applying an echo_message step, and the "
                             "client resumes the session)")
    parser.add_argument("--record", default=None, metavar="DIR",
                        help="record the episode (its recovered step marked) as a JSON line "
                             "in DIR (docs/recording.md); replay it with envlink replay")
    parser.add_argument("--prometheus-port", type=int, default=None, metavar="P",
                        help="expose metrics for Prometheus on 127.0.0.1:P (0: any free port)")
    parser.add_argument("--serve-metrics", action="store_true",
                        help="after the episode, keep serving metrics until Ctrl-C "
                             "(needs --prometheus-port)")
    parser.add_argument("--otlp-endpoint", default=None, metavar="URL",
                        help="also export spans and metrics over OTLP to URL "
                             "(e.g. http://127.0.0.1:4318)")
    parser.add_argument("--otlp-protocol", choices=("http/protobuf", "grpc"), default=None,
                        help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, "
                             "else http/protobuf)")
    parser.add_argument("--json-logs", action="store_true",
                        help="log JSON lines to stderr instead of readable console lines")
    parser.add_argument("--log-level", default="info",
                        choices=("debug", "info", "warning", "error"),
                        help="minimum level of log lines on stderr (default: info)")


def run_demo(argv: list[str] | None = None) -> int:
    """Run ``envlink demo`` with command-line arguments ``argv``.

    Args:
        argv: arguments after ``demo`` (default: ``sys.argv[1:]``).

    Returns:
        0 on success, 1 on failure (with a one-line reason on stderr), 2 on a
        usage error.
    """
    parser = argparse.ArgumentParser(prog="envlink demo", description=DESCRIPTION)
    add_arguments(parser)
    try:
        return demo_from_args(parser.parse_args(sys.argv[1:] if argv is None else argv),
                              parser)
    except SystemExit as exc:  # --help, or a usage error reported on stderr
        return exc.code if isinstance(exc.code, int) else 2


def demo_from_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Run the demo with parsed arguments; ``parser`` reports usage errors (exit status 2).

    Returns:
        0 on success, 1 on failure (with a one-line reason on stderr).
    """
    if args.steps < 1:
        parser.error("--steps must be at least 1")
    if args.serve_metrics and args.prometheus_port is None:
        parser.error("--serve-metrics needs --prometheus-port")
    try:
        _run(args, sys.stdout)
    except KeyboardInterrupt:
        sys.stderr.write(f"{_PROG}: interrupted\n")
        return 130
    except _DemoError as exc:
        sys.stderr.write(f"{_PROG}: error: {exc}\n")
        return 1
    except Exception as exc:  # any other failure: one line, not a traceback
        sys.stderr.write(f"{_PROG}: error: {type(exc).__name__}: {_one_line(exc)}\n")
        return 1
    return 0


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def _run(args: argparse.Namespace, out: IO[str]) -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from envlink._telemetry.logs import configure_logging
    from envlink.telemetry import configure

    configure_logging(json=args.json_logs, level=args.log_level)
    spans = InMemorySpanExporter()
    try:
        handle = configure(
            service_name="envlink-demo",
            span_exporters=[SimpleSpanProcessor(spans)],
            otlp_endpoint=args.otlp_endpoint,
            otlp_protocol=args.otlp_protocol,
            prometheus_port=args.prometheus_port,
            set_global=False,
        )
    except (ImportError, ValueError, OSError) as exc:
        raise _DemoError(f"telemetry setup failed: {_one_line(exc)}") from exc
    try:
        episode = _episode(args.steps, handle.tracer_provider, handle.meter_provider,
                           fault=not args.no_fault, record=args.record)
        handle.force_flush(5.0)
        _report(out, episode, spans.get_finished_spans())
        if handle.prometheus_url is not None:
            out.write(f"\nmetrics: {handle.prometheus_url}\n")
        if args.otlp_endpoint:
            out.write(f"OTLP: exporting to {args.otlp_endpoint} "
                      f"({args.otlp_protocol or 'default protocol'})\n")
        out.flush()
        if args.serve_metrics:
            out.write(f"serving metrics on {handle.prometheus_url}; press Ctrl-C to stop\n")
            out.flush()
            _wait_for_interrupt()
    finally:
        handle.shutdown(timeout_s=10.0)


def _wait_for_interrupt() -> None:
    """Block until Ctrl-C (SIGINT) or SIGTERM."""
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    try:
        while not stop.wait(3600):
            pass
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _episode(steps: int, tracer_provider: Any, meter_provider: Any, *,
             fault: bool = True, record: str | None = None) -> _Episode:
    from opentelemetry.trace import SpanKind

    from envlink import CallToolAction, EchoEnv, ListToolsAction, RolloutRecorder
    from envlink._telemetry.logs import get_logger

    try:
        from envlink.server import EnvServer, ServerThread
    except ImportError as exc:  # pragma: no cover - the server ships with envlink
        raise _DemoError(f"the reference server is not available: {exc}") from exc

    log = get_logger("envlink.demo")
    tracer = tracer_provider.get_tracer("envlink.demo")
    calls: list[_Call] = []
    # The echo_message step whose connection the server drops (after applying it).
    fault_at = (steps + 1) // 2 if fault else None
    try:
        server = ServerThread(env="echo", tracer_provider=tracer_provider)
        server.__enter__()
    except Exception as exc:
        raise _DemoError(f"the reference server failed to start: {_one_line(exc)}") from exc
    try:
        url: str = server.url
        recorder = None if record is None else RolloutRecorder(record)
        client = EchoEnv(base_url=url, on_session_lost=_POLICY,
                         tracer_provider=tracer_provider, meter_provider=meter_provider,
                         recorder=recorder)

        def arm_drop() -> None:
            """Have the server drop this client's connection at its next request, once,
            after applying it and before answering (fault injection, one-shot)."""
            session_id = client.session_id

            def arm(srv: EnvServer) -> bool:
                for handle in srv.connections:
                    if handle.session_id == session_id:
                        handle.faults.drop_mode = "after_apply"
                        handle.faults.drop_after = handle.requests + 1
                        return True
                return False

            if not server.call(arm, timeout=10.0):
                raise _DemoError("could not find the demo's connection on the server")

        started = time.perf_counter()
        with tracer.start_as_current_span(_ROOT_SPAN, kind=SpanKind.INTERNAL), \
                client.sync() as env:

            def timed(label: str, method: str, fn: Callable[[], Any],
                      show: Callable[[Any], str], note: str = "") -> Any:
                t0 = time.perf_counter()
                value = fn()
                calls.append(_Call(label, method, time.perf_counter() - t0, show(value), note))
                return value

            timed("reset()", "reset", env.reset, lambda r: _short(r.observation))
            def step(action: Any) -> Callable[[], Any]:
                return lambda: env.step(action)

            for i in range(steps):
                message = f"hello {i + 1}"
                note = ""
                if i + 1 == fault_at:
                    arm_drop()
                    note = "(connection dropped after the step was applied; session resumed)"
                timed(f"step echo_message({message!r})", "step",
                      step(CallToolAction(tool_name="echo_message",
                                          arguments={"message": message})),
                      lambda r: repr(r.observation.result), note)
            timed("step echo_with_length('envlink')", "step",
                  step(CallToolAction(tool_name="echo_with_length",
                                      arguments={"message": "envlink"})),
                  lambda r: _short(r.observation.result))
            timed("step list_tools()", "step", step(ListToolsAction()),
                  lambda r: ", ".join(t.get("name", "?") for t in r.observation.tools or []))
            state = timed("state()", "state", env.state, _short)
            session_id = client.session_id
            counts = server.call(lambda srv: (
                srv.session(session_id).step_count if session_id else -1,
                srv.steps_applied, srv.counter("session.created"), srv.resumes,
                srv.dedup_hits, srv.counter("drop")), timeout=10.0)
            recovery = _Recovery(
                fault_step=fault_at, steps_asked=steps + 2,
                journal_steps=client.journal.step_count, mechanism=client.recovery,
                state_step_count=int(state["step_count"]), session_step_count=counts[0],
                steps_applied=counts[1], sessions_created=counts[2], resumes=counts[3],
                dedup_hits=counts[4], drops=counts[5])
            log.info("envlink.demo.episode_done", calls=len(calls), resumes=recovery.resumes)
        elapsed = time.perf_counter() - started
        recorded: list[str] = []
        if recorder is not None:  # the client is closed: its episode ended as "close"
            recorder.close()
            recorded = [str(f) for f in recorder.files]
            log.info("envlink.demo.recorded", files=recorded)
    finally:
        server.__exit__(None, None, None)
    _check(recovery)
    return _Episode(calls, elapsed, url, recovery, recorded)


def _check(r: _Recovery) -> None:
    """Fail the demo unless every step asked was applied exactly once, in one session."""
    counts = {"the server's state() step_count": r.state_step_count,
              "the server's count for the session": r.session_step_count,
              "the steps the server applied": r.steps_applied,
              "the client's journal": r.journal_steps}
    wrong = [f"{name} is {n}" for name, n in counts.items() if n != r.steps_asked]
    if r.sessions_created != 1:
        wrong.append(f"the server created {r.sessions_created} sessions")
    if r.fault_step is not None and (r.drops != 1 or r.resumes != 1):
        wrong.append(f"{r.drops} connection drops and {r.resumes} resumes (expected 1 each)")
    if wrong:
        raise _DemoError(f"session recovery check failed: {r.steps_asked} steps asked, but "
                        + "; ".join(wrong))


def _short(value: Any, limit: int = 60) -> str:
    if hasattr(value, "model_dump"):
        value = {k: v for k, v in value.model_dump().items() if v is not None}
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _report(out: IO[str], episode: _Episode, spans: Sequence[Any]) -> None:
    calls = episode.calls
    out.write(f"envlink demo: echo environment at {episode.url}\n\n")
    out.write("calls (through the sync facade):\n")
    width = max(len(c.label) for c in calls)
    for c in calls:
        note = f"  {c.note}" if c.note else ""
        out.write(f"  {c.label:<{width}}  {_ms(c.seconds):>10}  -> {c.result}{note}\n")
    total = sum(c.seconds for c in calls)
    out.write(f"\ntotals: {len(calls)} calls, 0 errors, {_ms(total)} in calls, "
              f"{_ms(episode.elapsed)} wall (including connect)\n")

    roots = [s for s in spans if s.name == _ROOT_SPAN]
    tree = ([s for s in spans if s.context.trace_id == roots[-1].context.trace_id]
            if roots else [])
    _report_recovery(out, episode.recovery, tree)
    if episode.recorded:
        out.write("\nrecorded (envlink rollouts / envlink replay read it):\n")
        for name in episode.recorded:
            out.write(f"  {name}\n")
    if roots:
        trace_id = roots[-1].context.trace_id
        out.write(f"\nspan tree (trace {trace_id:032x}, {len(tree)} spans):\n")
        for line in _span_tree(tree):
            out.write(f"  {line}\n")
        legend = _span_legend(tree, episode.recovery.mechanism)
        if legend:
            out.write("\nwhat the spans are:\n")
            for label, text in legend:
                out.write(f"  {label}\n")
                for line in textwrap.wrap(text, width=_WIDTH - 6):
                    out.write(f"      {line}\n")

    by_method: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s.kind.name == "CLIENT" and s.name in ("reset", "step", "state"):
            by_method[s.name].append((s.end_time - s.start_time) / 1e9)
    if by_method:
        out.write("\nclient call latency by method (from the recorded spans):\n")
        out.write(f"  {'method':<8}{'n':>4}{'p50':>12}{'p90':>12}{'p99':>12}\n")
        for method in ("reset", "step", "state"):
            samples = by_method.get(method)
            if samples:
                out.write(f"  {method:<8}{len(samples):>4}"
                          + "".join(f"{_ms(percentile(samples, p)):>12}" for p in (50, 90, 99))
                          + "\n")


def _report_recovery(out: IO[str], r: _Recovery, tree: Sequence[Any]) -> None:
    """Two lines: what the dropped connection did, and that every step counted once."""
    out.write(f"\nsession recovery (on_session_lost={_POLICY!r}):\n")
    if r.fault_step is None:
        out.write("  no fault injected (--no-fault)\n")
    else:
        resumes = [s for s in tree if s.name == _SPAN_RESUME and s.kind.name == "INTERNAL"]
        replays = sum(1 for s in tree if s.name == _SPAN_REPLAY and s.kind.name == "INTERNAL")
        took = sum((s.end_time - s.start_time) / 1e9 for s in resumes)
        cache = ("; the lost answer came from the server's de-duplication cache"
                 if r.dedup_hits else "")
        out.write(f"  fault:  the server dropped the connection after applying step "
                  f"{r.fault_step} (echo_message 'hello {r.fault_step}'), before answering\n")
        out.write(f"  resume: same session, {r.mechanism}, {len(resumes)} "
                  f"{'try' if len(resumes) == 1 else 'tries'} in {_ms(took)}, "
                  f"{'no replay' if not replays else f'{replays} replays'}{cache}\n")
    once = "each applied once" if r.steps_applied == r.steps_asked else (
        f"{r.steps_applied} applied")
    out.write(f"  steps:  {r.journal_steps} of {r.steps_asked} kept; the server's "
              f"step_count is {r.state_step_count} ({r.steps_asked} asked), {once}\n")


def _span_legend(spans: Sequence[Any], mechanism: str) -> list[tuple[str, str]]:
    """One line for each kind of span the tree shows, in the order a reader meets them."""
    present = {(s.name, s.kind.name) for s in spans}
    attrs = [s.attributes or {} for s in spans]
    methods = [m for m in ("reset", "step", "state") if (m, "CLIENT") in present]
    detached = ("asks the server for an OpenEnv detached session (POST /mcp; this server "
                "has none, and its envlink extensions resume instead), then opens the "
                "WebSocket" if mechanism == "envlink-resume" else
                "asks the server for an OpenEnv detached session (POST /mcp), then opens "
                "the WebSocket")
    notes: list[tuple[bool, str, str]] = [
        ((_ROOT_SPAN, "INTERNAL") in present, f"{_ROOT_SPAN} [internal]",
         "the demo's own span around the episode: every span below is inside it"),
        (("connect", "INTERNAL") in present, "connect [internal]",
         "`with client.sync()` opening the session before the first call (retries "
         "included)"),
        (("connect", "CLIENT") in present, "connect [client]",
         f"one connection attempt; under on_session_lost={_POLICY!r} it first {detached}"),
        (bool(methods), f"{'/'.join(methods)} [client]",
         "one call as the caller sees it: from the sync facade to the answer, queueing "
         "and any recovery included"),
        (any(k == "SERVER" for _, k in present), "<frame> [server]",
         "the server handling that request, joined to the call by the trace context "
         "the frame carries"),
        (any("error.type" in a and a.get("error.type") == "fault_injected" for a in attrs),
         "error.type=fault_injected",
         "the request whose connection the demo had the server drop, after applying it"),
        ((_SPAN_RESUME, "INTERNAL") in present, f"{_SPAN_RESUME} [internal]",
         "re-attaching to the same server session after the drop (envlink.recovery: how)"),
        (any(a.get(ATTR_REASON) == "resume" for a in attrs),
         f"connect [client] {ATTR_REASON}=resume",
         "the resume's new connection; the episode's last frame (close) travels on it "
         "later, hence the server's close span under it"),
        (any(a.get(_ATTR_SERVER_DEDUP) for a in attrs), f"{_ATTR_SERVER_DEDUP}=true",
         "the interrupted step answered again from the server's de-duplication cache, "
         "not applied twice"),
        ((_SPAN_REPLAY, "INTERNAL") in present, f"{_SPAN_REPLAY} [internal]",
         "a new session, the episode's journal replayed into it and checked"),
        (("envlink.bridge close", "INTERNAL") in present, "envlink.bridge close [internal]",
         "the sync facade's close() (leaving the `with` block): it sends the close frame"),
    ]
    return [(label, text) for shown, label, text in notes if shown]


def _span_tree(spans: Sequence[Any]) -> list[str]:
    ids = {s.context.span_id for s in spans}
    children: dict[int | None, list[Any]] = defaultdict(list)
    for s in spans:
        parent = s.parent.span_id if s.parent is not None and s.parent.span_id in ids else None
        children[parent].append(s)
    lines: list[str] = []

    def walk(parent: int | None, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s.start_time):
            kind = _KIND.get(str(s.kind), str(s.kind))
            extra = ""
            attrs = s.attributes or {}
            if "error.type" in attrs:
                extra = f" error.type={attrs['error.type']}"
            if ATTR_RECOVERY in attrs:
                extra += f" {ATTR_RECOVERY}={attrs[ATTR_RECOVERY]}"
            if attrs.get(ATTR_REASON, "connect") != "connect":
                extra += f" {ATTR_REASON}={attrs[ATTR_REASON]}"
            if attrs.get(_ATTR_SERVER_DEDUP):
                extra += f" {_ATTR_SERVER_DEDUP}=true"
            lines.append(f"{'  ' * depth}{s.name} [{kind}] "
                         f"{_ms((s.end_time - s.start_time) / 1e9)}{extra}")
            walk(s.context.span_id, depth + 1)

    walk(None, 0)
    return lines
