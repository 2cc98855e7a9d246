"""docs/telemetry.md is the contract: it matches what envlink really emits."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.metrics import (
    Counter,
    Histogram,
    ObservableGauge,
    ObservableUpDownCounter,
    UpDownCounter,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    Gauge as GaugeData,
)
from opentelemetry.sdk.metrics.export import (
    Histogram as HistogramData,
)
from opentelemetry.sdk.metrics.export import (
    Sum,
)

from envlink._telemetry.instruments import Telemetry
from envlink.names import (
    DURATION_BUCKETS,
    METRIC_CALL_DURATION,
    METRIC_CONNECT_DURATION,
    METRIC_NAMES,
    RPC_DURATION_BUCKETS,
)

from .._otel_support import Otel
from .._ports import restartable_port
from .conftest import Episode

pytestmark = pytest.mark.timeout(30)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "telemetry.md"
#: The client's protocol calls (``connect()`` is not one: it has its own rows).
_METHODS = "reset|step|state|disconnect|close"


def _table(heading: str) -> list[list[str]]:
    """Rows (cells) of the first markdown table after ``heading``."""
    lines = DOCS.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert rows, f"no table under {heading!r}"
    return rows[2:]  # header and separator


def _ticks(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _keys(cell: str) -> set[str]:
    """Attribute keys in a cell: the backticked tokens that contain a dot."""
    return {t for t in _ticks(cell) if "." in t}


def _documented_metrics() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for name, instrument, unit, attrs, series, _desc in _table("## Metrics"):
        (metric,) = _ticks(name)
        out[metric] = {"instrument": instrument, "unit": _ticks(unit)[0],
                       "attributes": _keys(attrs), "series": set(_ticks(series))}
    return out


def _documented_spans() -> list[tuple[re.Pattern[str], str, set[str]]]:
    rows = []
    for name, kind, _parent, attrs in _table("## Spans"):
        (pattern,) = _ticks(name)
        regex = re.escape(pattern).replace(re.escape("<method>"), r"(\w+)" if
                                           pattern.startswith("envlink.bridge") else
                                           f"({_METHODS})")
        regex = regex.replace(re.escape("<frame>"), r"\w+")
        rows.append((re.compile(regex + r"\Z"), kind, _keys(attrs)))
    return rows


def _kind_of(metric_data: Any) -> str:
    if isinstance(metric_data, HistogramData):
        return "Histogram"
    if isinstance(metric_data, GaugeData):
        return "Gauge"
    assert isinstance(metric_data, Sum)
    return "Counter" if metric_data.is_monotonic else "UpDownCounter"


class _Inflight:
    """A stand-in for a client's telemetry hook: calls in flight by method."""

    def __init__(self, inflight: dict[str, int]) -> None:
        self.inflight = inflight


class _Breakers:
    """A stand-in for a pool's engine: its endpoints' breaker states."""

    def __init__(self, states: list[tuple[str, int, str]]) -> None:
        self.states = states

    def breaker_states(self) -> list[tuple[str, int, str]]:
        return self.states


_SOURCES: list[Any] = []  # kept alive: telemetry holds its sources weakly


def _record_every_instrument(tel: Telemetry) -> list[str]:
    """Record once into every instrument the Telemetry object created; their names."""
    names = []
    for value in vars(tel).values():
        if isinstance(value, Histogram):
            tel.record(value, 0.001)
        elif isinstance(value, (Counter, UpDownCounter)):
            tel.add(value, 1)
        elif isinstance(value, ObservableUpDownCounter):
            # Observed at collection time from the clients' own counts.
            source = _Inflight({"step": 1})
            _SOURCES.append(source)
            tel.add_inflight_source(source)
        elif isinstance(value, ObservableGauge):
            # Observed at collection time from the pools' breakers.
            breakers = _Breakers([("127.0.0.1", 8000, "open")])
            _SOURCES.append(breakers)
            tel.add_breaker_source(breakers)
        else:
            continue
        names.append(value.name)
    return names


def test_documented_metrics_are_exactly_the_instruments(otel: Otel) -> None:
    """Every instrument envlink creates is documented with its type and unit, and vice versa."""
    created = _record_every_instrument(Telemetry(None, otel.meter_provider))
    emitted = {m.name: m for m in otel.metrics()}
    docs = _documented_metrics()
    assert sorted(created) == sorted(emitted) == sorted(docs) == sorted(METRIC_NAMES)
    for name, doc in docs.items():
        assert emitted[name].unit == doc["unit"], name
        assert _kind_of(emitted[name].data) == doc["instrument"], name


def test_documented_prometheus_series_match_the_exporter() -> None:
    """The Prometheus series in the docs are those the OTel Prometheus exporter renders."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    mp = MeterProvider(metric_readers=[PrometheusMetricReader(registry=registry)])
    try:
        _record_every_instrument(Telemetry(None, mp))
        text = generate_latest(registry).decode()
    finally:
        mp.shutdown()
    series = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
              if line and not line.startswith("#")}
    series.discard("target_info")
    documented = set().union(*(d["series"] for d in _documented_metrics().values()))
    assert series == documented


def test_emitted_metrics_are_documented(scripted_episode: Episode) -> None:
    """Metrics of a real episode: documented names, units, types and attribute keys only."""
    docs = _documented_metrics()
    seen = set()
    for metric in scripted_episode.metrics:
        assert metric.name in docs, f"undocumented metric {metric.name}"
        doc = docs[metric.name]
        assert metric.unit == doc["unit"]
        assert _kind_of(metric.data) == doc["instrument"]
        keys = set().union(*(set(p.attributes) for p in metric.data.data_points))
        assert keys <= doc["attributes"], (metric.name, keys - doc["attributes"])
        seen.add(metric.name)
    # The episode (retries, errors, recovery, the sync facade) exercises every metric.
    assert seen == set(docs)


def test_emitted_spans_are_documented(scripted_episode: Episode) -> None:
    """Spans of a real episode: each matches a documented (name, kind) with documented keys."""
    rows = _documented_spans()
    used = set()
    for span in scripted_episode.spans:
        keys = set(span.attributes or {})
        candidates = [i for i, (regex, kind, _attrs) in enumerate(rows)
                      if regex.match(span.name) and kind == span.kind.name]
        assert candidates, f"undocumented span {span.name!r} ({span.kind.name})"
        fitting = [i for i in candidates if keys <= rows[i][2]]
        assert fitting, (span.name, keys - set().union(*(rows[i][2] for i in candidates)))
        used.update(fitting)
    assert used == set(range(len(rows))), "a documented span was never emitted"


def test_emitted_span_events_are_documented(scripted_episode: Episode) -> None:
    """Span events of a real episode are documented, with documented attribute keys."""
    docs = {_ticks(name)[0]: _keys(attrs)
            for name, _on, attrs in _table("### Span events")}
    seen = set()
    for span in scripted_episode.spans:
        for event in span.events:
            assert event.name in docs, f"undocumented span event {event.name!r}"
            assert set(event.attributes or {}) <= docs[event.name], event.name
            seen.add(event.name)
    assert seen | set(_SPAN_EVENTS_NOT_PROVOKED) == set(docs)


#: Documented span events the scripted episode does not provoke, and why.
_SPAN_EVENTS_NOT_PROVOKED = {
    "envlink.attach_wait": "needs a server that keeps a session's old socket attached "
                           "(tests/interop/test_stock_resume.py provokes it on OpenEnv's)",
}


#: Documented log events the scripted episode does not provoke, and why.
_NOT_PROVOKED = {
    "envlink.replay_diverged": "needs a non-deterministic environment",
    "envlink.stale_answer_dropped": "needs a late answer to a timed-out call",
    "envlink.connection_discarded": "needs a timed-out call or an out-of-step frame",
    "envlink.peer_unresponsive": "needs a stalled peer after a kept timeout",
    "envlink.unattributable_frame": "needs a late corrupt answer to a timed-out call",
    "envlink.session_release_failed": "needs a server that refuses to end a session",
    "envlink.unknown_step_settled": "needs a step cut by a deadline after it was sent",
    "envlink.recovery_fallback": "needs on_session_lost='auto' and a session the server no "
                                 "longer has (tests/interop/test_stock_resume.py provokes it)",
    "envlink.attach_wait": _SPAN_EVENTS_NOT_PROVOKED["envlink.attach_wait"],
    "envlink.provider_stop_failed": "needs a provider whose stop fails "
                                    "(tests/launch/test_provider_cleanup.py)",
    "envlink.session_lost": "needs a session lost to its caller; the episode's are all "
                            "recovered (tests/pool/test_pool_recovery.py provokes it)",
}


def test_emitted_log_events_are_documented(scripted_episode: Episode) -> None:
    """Log events of a real episode: documented names, levels and keys; trace ids when in a span."""
    docs = {_ticks(name)[0]: (level, set(_ticks(keys)))
            for name, level, keys, _when in _table("## Log events")}
    seen = set()
    for event in scripted_episode.logs:
        name = event["event"]
        assert name in docs, f"undocumented log event {name!r}"
        level, keys = docs[name]
        assert event["log_level"] == level, name
        extra = set(event) - {"event", "log_level", "trace_id", "span_id"}
        assert extra <= keys, (name, extra - keys)
        seen.add(name)
    assert seen | set(_NOT_PROVOKED) == set(docs)
    # Every event of the episode was logged inside a span: all carry the ids.
    assert all(re.fullmatch(r"[0-9a-f]{32}", e.get("trace_id", "")) and
               re.fullmatch(r"[0-9a-f]{16}", e.get("span_id", ""))
               for e in scripted_episode.logs)


#: The semantic conventions' advisory buckets for rpc.client.call.duration (semconv 1.40).
_SEMCONV_RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5,
                        7.5, 10)


def _metric(episode: Episode, name: str) -> Any:
    (metric,) = [m for m in episode.metrics if m.name == name]
    return metric


def test_call_duration_follows_the_rpc_conventions(scripted_episode: Episode) -> None:
    """rpc.client.call.duration: semconv buckets, server.address/port, status of failures."""
    metric = _metric(scripted_episode, METRIC_CALL_DURATION)
    points = metric.data.data_points
    assert tuple(RPC_DURATION_BUCKETS) == _SEMCONV_RPC_BUCKETS
    for point in points:
        assert tuple(point.explicit_bounds) == _SEMCONV_RPC_BUCKETS
        attrs = point.attributes
        assert attrs["rpc.system.name"] == "openenv"
        assert attrs["server.address"] == "127.0.0.1"
        # The server's port, or the dead endpoint's the scripted EnvPool tries first.
        assert attrs["server.port"] in {scripted_episode.server_port,
                                        *scripted_episode.dead_ports}
        assert attrs["rpc.method"] != "connect", "connecting is not an RPC method"
        assert ("error.type" in attrs) == (attrs["envlink.outcome"] != "ok")
    failed = [p.attributes for p in points if p.attributes["envlink.outcome"] == "error"]
    # The injected error frame: error.type and the server's status code.
    assert {"error.type": "server_error", "rpc.response.status_code": "EXECUTION_ERROR"}.items() \
        <= next(a for a in failed if "rpc.response.status_code" in a).items()
    # The documented bucket lists are the constants.
    text = DOCS.read_text(encoding="utf-8")
    assert ", ".join(f"{b:g}" for b in RPC_DURATION_BUCKETS) in " ".join(text.split())
    assert ", ".join(f"{b:g}" for b in DURATION_BUCKETS) in " ".join(text.split())


def test_connection_attempts_have_their_own_histogram(scripted_episode: Episode) -> None:
    """Connection attempts, ok and failed (a refused upgrade), go to the connect histogram."""
    metric = _metric(scripted_episode, METRIC_CONNECT_DURATION)
    outcomes = {(p.attributes["envlink.reason"], p.attributes["envlink.outcome"],
                 p.attributes.get("error.type")) for p in metric.data.data_points}
    assert ("connect", "ok", None) in outcomes
    assert any(outcome == "error" and etype == "handshake_rejected"
               for _reason, outcome, etype in outcomes), outcomes
    assert {"replay", "resume"} <= {reason for reason, _o, _e in outcomes}
    # Connect attempt spans are not RPC spans.
    for span in scripted_episode.spans:
        if span.name == "connect":
            assert not any(k.startswith("rpc.") for k in (span.attributes or {})), span


def test_a_failed_connect_is_counted_as_an_error() -> None:
    """A connect() that fails (server down; upgrades refused until the retry budget runs
    out) counts in envlink.client.errors as rpc.method="connect", and records no call."""
    import socket

    from envlink import EchoEnv, EnvlinkError, ReconnectPolicy, RetryBudget
    from envlink.names import METRIC_ERRORS, RPC_METHOD_CONNECT
    from envlink.server import ServerThread

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    fast = ReconnectPolicy(max_attempts=3, initial_delay=0.01, max_delay=0.02)
    with Otel.capture() as otel, ServerThread(env="echo") as refusing:
        # As the README shows: the sync client connects on entry.
        with pytest.raises(EnvlinkError), EchoEnv(
                base_url=down, reconnect=fast, tracer_provider=otel.tracer_provider,
                meter_provider=otel.meter_provider).sync() as env:
            env.reset()

        def refuse(server: Any) -> None:
            server.faults.refuse = 10

        refusing.call(refuse)
        budget = ReconnectPolicy(max_attempts=5, initial_delay=0.01, max_delay=0.02,
                                 budget=RetryBudget(max_tokens=2.0, token_ratio=0.1))
        with pytest.raises(EnvlinkError), EchoEnv(
                base_url=refusing.url, reconnect=budget, tracer_provider=otel.tracer_provider,
                meter_provider=otel.meter_provider).sync() as env:
            env.reset()
        errors = {(p.attributes["rpc.method"], p.attributes["error.type"]): p.value
                  for p in otel.points(METRIC_ERRORS)}
        assert errors == {(RPC_METHOD_CONNECT, "connect_error"): 1,
                          (RPC_METHOD_CONNECT, "retry_budget_exhausted"): 1}
        assert otel.points(METRIC_CALL_DURATION) == []
        # The attempts keep what each of them met: the refused upgrade is on the connect
        # histogram as handshake_rejected.
        attempts = {p.attributes.get("error.type") for p in otel.points(METRIC_CONNECT_DURATION)}
        assert {"connect_error", "handshake_rejected"} <= attempts


def test_a_connection_lost_between_calls_is_reopened_as_a_reconnect() -> None:
    """A server restarted while its client is between episodes: the next call reopens the
    connection, counted in envlink.client.reconnects (reason retry); nothing fails."""
    from envlink import EchoEnv, ReconnectPolicy
    from envlink.names import METRIC_ERRORS, METRIC_RECONNECTS, METRIC_RECOVERIES
    from envlink.server import ServerThread

    port = restartable_port()
    fast = ReconnectPolicy(max_attempts=20, initial_delay=0.01, max_delay=0.05)
    server = ServerThread(env="echo", port=port)
    server.start()
    try:
        with Otel.capture() as otel, EchoEnv(
                base_url=f"http://127.0.0.1:{port}", reconnect=fast,
                meter_provider=otel.meter_provider).sync() as env:
            for _ in range(2):
                env.reset()
                server.stop()
                server = ServerThread(env="echo", port=port)
                server.start()
            env.reset()
            reconnects = {p.attributes["envlink.reason"]: p.value
                          for p in otel.points(METRIC_RECONNECTS)}
            assert reconnects == {"retry": 2}
            assert otel.points(METRIC_ERRORS) == []
            assert otel.points(METRIC_RECOVERIES) == []
    finally:
        server.stop()


def test_failed_spans_record_an_exception_event(scripted_episode: Episode) -> None:
    """Every span envlink marks failed has ERROR status, error.type and an exception event."""
    failed = [s for s in scripted_episode.spans if "error.type" in (s.attributes or {})]
    assert failed
    for span in failed:
        assert span.status.status_code.name == "ERROR", span.name
        events = [e for e in span.events if e.name == "exception"]
        assert events, f"{span.name}: no exception event"
        assert {"exception.type", "exception.message"} <= set(events[0].attributes or {})


def test_the_names_module_is_the_documented_list() -> None:
    """envlink.names lists exactly the documented metrics, log events and span events,
    and envlink.telemetry re-exports it rather than keeping a copy."""
    import envlink._telemetry.instruments
    import envlink.telemetry
    from envlink import names

    assert set(names.METRIC_NAMES) == set(_documented_metrics())
    logs = {_ticks(name)[0] for name, _level, _keys, _when in _table("## Log events")}
    assert set(names.LOG_EVENTS) == logs
    span_events = {_ticks(name)[0] for name, _on, _attrs in _table("### Span events")}
    assert set(names.SPAN_EVENTS) == span_events
    for module in (envlink.telemetry, envlink._telemetry.instruments):
        assert set(names.__all__) <= set(module.__all__)
        for name in names.__all__:
            assert getattr(module, name) is getattr(names, name)
