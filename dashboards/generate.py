"""Generate envlink's Grafana dashboards, and the copies the Kubernetes pack mounts.

    python dashboards/generate.py          # write dashboards/*.json and the k8s copies
                                           # (dashboards, rules, compose configuration)
    python dashboards/generate.py --check  # exit 1 if any written file is out of date

The dashboards query the Prometheus series of envlink's telemetry contract
(docs/telemetry.md) and the recording rules in deploy/prometheus/rules/. Panels
follow the Thanos gRPC-client and Linkerd dashboards: rate, success ratio, latency
quantiles. Template variables: ``datasource``, ``job`` (the service: Prometheus'
``job`` label, which the OpenTelemetry Collector sets from ``service.name``) and
``instance``; the drill-down adds ``method``. Only the standard library is used,
so the output is reproducible anywhere; tests/ops checks it against Grafana's
published schema (``@grafana/schema``) and evaluates every query on a live
Prometheus.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = ROOT / "dashboards"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "envlink.rules.yml"
#: Files the Kubernetes pack mounts (kustomize only reads below its own directory).
K8S_FILES = ROOT / "deploy" / "k8s" / "telemetry" / "files"
COMPOSE = ROOT / "deploy" / "compose"
#: Configuration the compose stack and the Kubernetes pack share (copied to K8S_FILES).
COMPOSE_SHARED = (
    COMPOSE / "otel-collector.yaml",
    COMPOSE / "tempo.yaml",
    COMPOSE / "grafana" / "provisioning" / "datasources" / "datasources.yaml",
    COMPOSE / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml",
)

SCHEMA_VERSION = 41  # Grafana 11.6
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'job=~"$job", instance=~"$instance"'
RI = "$__rate_interval"

CALLS = "rpc_client_call_duration_seconds"
ERR = 'envlink_outcome=~"error|timeout"'
#: Failed connect()s: rpc.method "connect" on envlink.client.errors.
CONNECT_FAILED = 'rpc_method="connect"'


class _Ids:
    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


def target(expr: str, legend: str, ref: str = "A", *, instant: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {"datasource": DS, "refId": ref, "expr": expr,
                           "legendFormat": legend, "range": not instant, "instant": instant}
    return out


def panel(ids: _Ids, title: str, description: str, unit: str, targets: list[dict[str, Any]],
          pos: tuple[int, int, int, int], *, kind: str = "timeseries",
          stack: bool = False, min_zero: bool = True,
          max_value: float | None = None) -> dict[str, Any]:
    x, y, w, h = pos
    defaults: dict[str, Any] = {"unit": unit}
    if min_zero:
        defaults["min"] = 0
    if max_value is not None:
        defaults["max"] = max_value
    options: dict[str, Any]
    if kind == "timeseries":
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                              "showPoints": "never", "spanNulls": True,
                              "stacking": {"mode": "normal" if stack else "none",
                                           "group": "A"}}
        options = {"legend": {"displayMode": "table", "placement": "bottom",
                              "showLegend": True, "calcs": ["mean", "max", "lastNotNull"]},
                   "tooltip": {"mode": "multi", "sort": "desc"}}
    else:  # stat
        options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                   "colorMode": "value", "graphMode": "area", "justifyMode": "auto",
                   "orientation": "auto", "textMode": "auto"}
    refs = "ABCDEFGH"
    return {
        "id": ids.next(), "type": kind, "title": title, "description": description,
        "datasource": DS, "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [dict(t, refId=refs[i]) for i, t in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
    }


def row(ids: _Ids, title: str, y: int) -> dict[str, Any]:
    return {"id": ids.next(), "type": "row", "title": title, "collapsed": False,
            "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []}


def query_var(name: str, label: str, query: str, *, include_all: bool = True) -> dict[str, Any]:
    return {
        "type": "query", "name": name, "label": label, "datasource": DS,
        "query": {"query": query, "refId": f"{name}-variable"},
        "refresh": 2, "sort": 1, "multi": True,
        "includeAll": include_all, "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "hide": 0,
    }


def templating(*, method: bool = False) -> dict[str, Any]:
    variables: list[dict[str, Any]] = [
        {"type": "datasource", "name": "datasource", "label": "Data source",
         "query": "prometheus", "current": {"selected": True, "text": "Prometheus",
                                            "value": "prometheus"},
         "refresh": 1, "hide": 0},
        query_var("job", "Service", f"label_values({CALLS}_count, job)"),
        query_var("instance", "Instance",
                  f'label_values({CALLS}_count{{job=~"$job"}}, instance)'),
    ]
    if method:
        variables.append(query_var(
            "method", "Method",
            f'label_values({CALLS}_count{{{SEL}}}, rpc_method)'))
    return {"list": variables}


def quantiles(metric: str, by: str, sel: str, legend: str) -> list[dict[str, Any]]:
    return [target(f"histogram_quantile({q}, sum by ({by}, le) "
                   f"(rate({metric}_bucket{{{sel}}}[{RI}])))", f"p{int(q * 100)} {legend}")
            for q in (0.5, 0.95, 0.99)]


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]],
              *, method: bool = False, links: list[dict[str, Any]] | None = None
              ) -> dict[str, Any]:
    return {
        "uid": uid, "title": title, "description": description,
        "tags": ["envlink", "openenv", "rpc"], "editable": True, "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION, "version": 1, "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"}, "timezone": "browser",
        "fiscalYearStartMonth": 0, "liveNow": False,
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": links or [],
        "templating": templating(method=method),
        "panels": panels,
    }


def pool_panels(ids: _Ids, y: int) -> list[dict[str, Any]]:
    """The EnvPool row: sessions, breakers, placements, batch latency, stragglers."""
    s = SEL
    ep = "server_address, server_port"
    where = "{{server_address}}:{{server_port}}"
    return [
        row(ids, "EnvPool", y),
        panel(ids, "Pool sessions by endpoint and state",
              "EnvPool sessions on each endpoint (envlink.pool.sessions), by state: "
              "placing, active, recovering, lost (a lost session counts where it was "
              "lost until it is placed again).", "short",
              [target(f"sum by ({ep}, envlink_pool_session_state) "
                      f"(envlink_pool_sessions{{{s}}})",
                      f"{where} {{{{envlink_pool_session_state}}}}")],
              (0, y + 1, 8, 8), stack=True),
        panel(ids, "Breaker transitions by endpoint and state",
              "Circuit-breaker transitions of EnvPool endpoints "
              "(envlink.pool.breaker.transitions), by the new state: open (the "
              "endpoint failed breaker_threshold connections in a row), half_open "
              "(one probe let through), closed (the probe succeeded).", "ops",
              [target(f"sum by ({ep}, envlink_breaker_state) (rate("
                      f"envlink_pool_breaker_transitions_total{{{s}}}[{RI}]))",
                      f"{where} {{{{envlink_breaker_state}}}}")],
              (8, y + 1, 8, 8), stack=True),
        panel(ids, "Placements by endpoint and result",
              "Attempts to open an EnvPool session on an endpoint "
              "(envlink.pool.placements), by result: placed, capacity_reached, "
              "unreachable.", "ops",
              [target(f"sum by ({ep}, envlink_placement_result) (rate("
                      f"envlink_pool_placements_total{{{s}}}[{RI}]))",
                      f"{where} {{{{envlink_placement_result}}}}")],
              (16, y + 1, 8, 8), stack=True),
        panel(ids, "Pool batch duration p50 / p95 / p99 by method",
              "Quantiles of envlink.pool.batch.duration: a whole batch reset or step "
              "(its slowest session, placement and recovery included), or the wait "
              "of a ready-first receive (recv).", "s",
              quantiles("envlink_pool_batch_duration_seconds", "rpc_method", s,
                        "{{rpc_method}}"), (0, y + 9, 8, 8)),
        panel(ids, "Pool stragglers",
              "Sessions still in flight when a ready-first receive "
              "(step_recv(min_ready=...)) returned (envlink.pool.stragglers), per "
              "second.", "ops",
              [target(f"sum by (rpc_method) (rate(envlink_pool_stragglers_total"
                      f"{{{s}}}[{RI}]))", "{{rpc_method}}")], (8, y + 9, 8, 8)),
        panel(ids, "Breaker state by endpoint",
              "The current state of each EnvPool endpoint's circuit breaker "
              "(envlink.pool.breaker.state): a state set, 1 for the state it is in "
              "and 0 for the others, summed over pools and instances (the count of "
              "breakers in each state). An open breaker past its reset timeout reads "
              "half_open.", "short",
              [target(f"sum by ({ep}, envlink_breaker_state) "
                      f"(envlink_pool_breaker_state{{{s}}})",
                      f"{where} {{{{envlink_breaker_state}}}}")],
              (16, y + 9, 8, 8), stack=True),
    ]


def overview() -> dict[str, Any]:
    ids = _Ids()
    s = SEL
    p: list[dict[str, Any]] = [row(ids, "Calls", 0)]
    p.append(panel(ids, "Call rate by method",
                   "Protocol calls per second (rpc.client.call.duration count), by rpc.method.",
                   "reqps", [target(f"sum by (rpc_method) (rate({CALLS}_count{{{s}}}[{RI}]))",
                                    "{{rpc_method}}")], (0, 1, 8, 8), stack=True))
    p.append(panel(ids, "Success ratio",
                   "Share of operations that ended ok: protocol calls (not error or "
                   "timeout; cancelled calls are the caller's choice and left out) and "
                   "failed connect()s, which stand for the calls a client that cannot "
                   "connect never makes (a total outage reads 0 %, as the SLO rules "
                   "count it).", "percentunit",
                   [target(f"(sum(rate({CALLS}_count{{{s}, envlink_outcome=\"ok\"}}[{RI}])) "
                           f"or vector(0)) / ((sum(rate({CALLS}_count{{{s}, "
                           f"envlink_outcome!=\"cancelled\"}}[{RI}])) or vector(0)) + "
                           f"(sum(rate(envlink_client_errors_total{{{s}, "
                           f"{CONNECT_FAILED}}}[{RI}])) or vector(0)))",
                           "success")],
                   (8, 1, 4, 8), kind="stat", max_value=1))
    p.append(panel(ids, "Error ratio by error.type",
                   "Failed calls (error or timeout) per call, by error.type.", "percentunit",
                   [target(f"sum by (error_type) (rate({CALLS}_count{{{s}, {ERR}}}[{RI}])) / "
                           f"ignoring (error_type) group_left sum(rate({CALLS}_count{{{s}}}"
                           f"[{RI}]))", "{{error_type}}")], (12, 1, 12, 8), stack=True))
    p.append(panel(ids, "Call latency p50 / p95 / p99 by method",
                   "Quantiles of rpc.client.call.duration (caller's view: queueing, "
                   "connecting, retries and recovery included).", "s",
                   quantiles(CALLS, "rpc_method", s, "{{rpc_method}}"), (0, 9, 12, 8)))
    p.append(panel(ids, "SLO: error ratio and p99 (recorded)",
                   "The recording rules the alerts use: error ratio over 5m and 1h per "
                   "service, and p99 latency over 5m per method.", "percentunit",
                   [target('job:envlink_rpc_errors:ratio_rate5m{job=~"$job"}',
                           "error ratio 5m {{job}}"),
                    target('job:envlink_rpc_errors:ratio_rate1h{job=~"$job"}',
                           "error ratio 1h {{job}}")], (12, 9, 6, 8)))
    p.append(panel(ids, "p99 latency by method (recorded)",
                   "job_method:envlink_rpc_call_duration_seconds:p99_rate5m, which the "
                   "latency alert compares with its SLO.", "s",
                   [target('job_method:envlink_rpc_call_duration_seconds:p99_rate5m'
                           '{job=~"$job"}', "{{job}} {{rpc_method}}")], (18, 9, 6, 8)))
    p.append(row(ids, "Connections, retries and recovery", 17))
    p.append(panel(ids, "Reconnects by reason",
                   "Connections reopened after a lost or failed one "
                   "(envlink.client.reconnects), by envlink.reason.", "ops",
                   [target(f"sum by (envlink_reason) (rate(envlink_client_reconnects_total"
                           f"{{{s}}}[{RI}]))", "{{envlink_reason}}")], (0, 18, 8, 8),
                   stack=True))
    p.append(panel(ids, "Retries by method",
                   "Exchanges retried transparently (envlink.client.attempts with "
                   "envlink.retry=true), and their share of all attempts.", "ops",
                   [target(f"sum by (rpc_method) (rate(envlink_client_attempts_total"
                           f"{{{s}, envlink_retry=\"true\"}}[{RI}]))", "{{rpc_method}}")],
                   (8, 18, 8, 8), stack=True))
    p.append(panel(ids, "Retry budget refusals",
                   "Calls and connect()s (rpc.method connect) failed because the shared "
                   "retry budget refused a reconnect (error.type retry_budget_exhausted): "
                   "retries are being throttled.",
                   "ops",
                   [target(f"sum by (rpc_method) (rate(envlink_client_errors_total"
                           f"{{{s}, error_type=\"retry_budget_exhausted\"}}[{RI}]))",
                           "{{rpc_method}}")], (16, 18, 8, 8)))
    p.append(panel(ids, "Session recoveries by policy and result",
                   "Sessions lost mid-episode (envlink.session.recoveries), by the "
                   "on_session_lost policy and the recovery's result.", "ops",
                   [target(f"sum by (envlink_recovery_policy, envlink_recovery_result) "
                           f"(rate(envlink_session_recoveries_total{{{s}}}[{RI}]))",
                           "{{envlink_recovery_policy}} {{envlink_recovery_result}}")],
                   (0, 26, 8, 8), stack=True))
    p.append(panel(ids, "Connection attempts by outcome",
                   "WebSocket opening handshakes (envlink.client.connect.duration count), "
                   "by outcome and error.type.", "ops",
                   [target(f"sum by (envlink_outcome, error_type) (rate("
                           f"envlink_client_connect_duration_seconds_count{{{s}}}[{RI}]))",
                           "{{envlink_outcome}} {{error_type}}")], (8, 26, 8, 8), stack=True))
    p.append(panel(ids, "In-flight calls",
                   "Protocol calls queued or running (envlink.client.inflight).", "short",
                   [target(f"sum by (rpc_method) (envlink_client_inflight{{{s}}})",
                           "{{rpc_method}}")], (16, 26, 8, 8), stack=True))
    p.append(row(ids, "Sync bridge and messages", 34))
    p.append(panel(ids, "Bridge wait p50 / p99",
                   "Time a sync call waited for the bridge's event loop to start it "
                   "(envlink.bridge.wait.duration): a saturated loop shows here first.", "s",
                   [t for t in quantiles("envlink_bridge_wait_duration_seconds", "rpc_method",
                                         s, "{{rpc_method}}") if "0.95" not in t["expr"]],
                   (0, 35, 12, 8)))
    p.append(panel(ids, "Message size p50 / p99 by direction",
                   "Size of WebSocket messages (envlink.client.message.size).", "bytes",
                   [t for t in quantiles("envlink_client_message_size_bytes",
                                         "envlink_direction", s, "{{envlink_direction}}")
                    if "0.95" not in t["expr"]], (12, 35, 12, 8)))
    p.extend(pool_panels(ids, 43))
    return dashboard(
        "envlink-overview", "envlink / Overview",
        "envlink clients: call rate, errors, latency, reconnects, retries, session "
        "recovery, bridge wait, message sizes and EnvPool sessions, breakers, "
        "placements and batches (docs/operations.md).", p,
        links=[{"title": "Drill-down", "type": "link", "url": "/d/envlink-drilldown",
                "includeVars": True, "keepTime": True, "icon": "dashboard",
                "targetBlank": False, "asDropdown": False, "tags": [], "tooltip": ""}])


def drilldown() -> dict[str, Any]:
    ids = _Ids()
    s = SEL + ', rpc_method=~"$method"'
    p: list[dict[str, Any]] = [row(ids, "Per instance", 0)]
    p.append(panel(ids, "Call rate by instance and method",
                   "Calls per second of each instance of the selected services.", "reqps",
                   [target(f"sum by (instance, rpc_method) (rate({CALLS}_count{{{s}}}"
                           f"[{RI}]))", "{{instance}} {{rpc_method}}")], (0, 1, 12, 8)))
    p.append(panel(ids, "Success ratio by instance",
                   "Share of calls that ended ok, per instance.", "percentunit",
                   [target(f"sum by (instance) (rate({CALLS}_count{{{s}, "
                           f"envlink_outcome=\"ok\"}}[{RI}])) / sum by (instance) (rate("
                           f"{CALLS}_count{{{s}, envlink_outcome!=\"cancelled\"}}[{RI}]))",
                           "{{instance}}")], (12, 1, 12, 8), max_value=1))
    p.append(panel(ids, "Latency p50 / p95 / p99 by instance",
                   "Quantiles of rpc.client.call.duration per instance.", "s",
                   quantiles(CALLS, "instance", s, "{{instance}}"), (0, 9, 12, 8)))
    p.append(panel(ids, "Latency p99 by server endpoint",
                   "p99 per server.address:server.port: one slow server of several "
                   "stands out here.", "s",
                   [target(f"histogram_quantile(0.99, sum by (server_address, server_port, "
                           f"le) (rate({CALLS}_bucket{{{s}}}[{RI}])))",
                           "{{server_address}}:{{server_port}}")], (12, 9, 12, 8)))
    p.append(row(ids, "Errors", 17))
    p.append(panel(ids, "Errors by error.type and server status",
                   "Failed calls per second by error.type and rpc.response.status_code "
                   "(the server's error code, when the server answered).", "ops",
                   [target(f"sum by (error_type, rpc_response_status_code) (rate("
                           f"{CALLS}_count{{{s}, {ERR}}}[{RI}]))",
                           "{{error_type}} {{rpc_response_status_code}}")], (0, 18, 12, 8),
                   stack=True))
    p.append(panel(ids, "Errors by instance",
                   "envlink.client.errors per instance and error.type.", "ops",
                   [target(f"sum by (instance, error_type) (rate(envlink_client_errors_total"
                           f"{{{s}}}[{RI}]))", "{{instance}} {{error_type}}")],
                   (12, 18, 12, 8), stack=True))
    p.append(row(ids, "Connections", 26))
    p.append(panel(ids, "Connect latency p50 / p99 by reason",
                   "Duration of connection attempts (envlink.client.connect.duration) by "
                   "envlink.reason.", "s",
                   [t for t in quantiles("envlink_client_connect_duration_seconds",
                                         "envlink_reason", SEL, "{{envlink_reason}}")
                    if "0.95" not in t["expr"]], (0, 27, 12, 8)))
    p.append(panel(ids, "Failed connection attempts by error.type",
                   "Connection attempts that failed, per instance and error.type "
                   "(handshake_rejected: the server refused the upgrade).", "ops",
                   [target(f"sum by (instance, error_type) (rate("
                           f"envlink_client_connect_duration_seconds_count{{{SEL}, "
                           f"envlink_outcome!=\"ok\"}}[{RI}]))",
                           "{{instance}} {{error_type}}")], (12, 27, 12, 8), stack=True))
    p.append(panel(ids, "Reconnects and session recoveries by instance",
                   "Reconnects by reason and recoveries by result, per instance.", "ops",
                   [target(f"sum by (instance, envlink_reason) (rate("
                           f"envlink_client_reconnects_total{{{SEL}}}[{RI}]))",
                           "reconnect {{instance}} {{envlink_reason}}"),
                    target(f"sum by (instance, envlink_recovery_result) (rate("
                           f"envlink_session_recoveries_total{{{SEL}}}[{RI}]))",
                           "recovery {{instance}} {{envlink_recovery_result}}")],
                   (0, 35, 12, 8)))
    p.append(panel(ids, "Bridge wait p99 by method",
                   "Time sync calls waited for the bridge's event loop to start them "
                   "(envlink.bridge.wait.duration): the loop thread's saturation. A sync "
                   "call's whole duration is its rpc.client.call.duration plus this wait.", "s",
                   [target(f"histogram_quantile(0.99, sum by (instance, rpc_method, le) "
                           f"(rate(envlink_bridge_wait_duration_seconds_bucket{{{s}}}"
                           f"[{RI}])))", "{{instance}} {{rpc_method}}")], (12, 35, 12, 8)))
    return dashboard(
        "envlink-drilldown", "envlink / Drill-down",
        "One service and its instances: per-instance rate, success and latency, errors "
        "by type and server status, connection attempts (docs/operations.md).", p,
        method=True,
        links=[{"title": "Overview", "type": "link", "url": "/d/envlink-overview",
                "includeVars": True, "keepTime": True, "icon": "dashboard",
                "targetBlank": False, "asDropdown": False, "tags": [], "tooltip": ""}])


def render() -> dict[Path, str]:
    """Every generated file and its content."""
    out: dict[Path, str] = {}
    for name, board in (("envlink-overview.json", overview()),
                        ("envlink-drilldown.json", drilldown())):
        text = json.dumps(board, indent=2, sort_keys=False) + "\n"
        out[DASHBOARDS / name] = text
        out[K8S_FILES / name] = text
    out[K8S_FILES / RULES.name] = RULES.read_text(encoding="utf-8")
    for source in COMPOSE_SHARED:
        out[K8S_FILES / source.name] = source.read_text(encoding="utf-8")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if a generated file differs from what is committed")
    args = parser.parse_args(argv)
    stale = []
    for path, text in render().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            stale.append(path)
            if not args.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if args.check and stale:
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)}", file=sys.stderr)
        print("run: python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
