"""Every dashboard query and every recording rule returns data on a real Prometheus.

A real Prometheus server (127.0.0.1, a free port, a temporary data directory, the
rules of deploy/prometheus) scrapes the demo workload (deploy/workload), a separate
process that runs episodes through envlink with faults injected, so error, retry,
reconnect, recovery and retry-budget series exist, and an EnvPool kept across cycles
over a steady server and one that flaps (up one cycle, down the next) and with a
straggler, so placement, breaker (every transition, and the state gauge) and
straggler series exist. The test
waits, with a bound and by polling Prometheus' API, for the target to be up and the
series to appear; then each query of each dashboard panel and template variable, and
each recording rule, must return at least one sample with a number (not NaN).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from ._live import get, has_number, query, read_line, start_prometheus, stop, wait_targets_up
from .conftest import DASHBOARDS, RULES, WORKLOAD, require_tool

pytestmark = pytest.mark.timeout(180)

#: What Grafana would substitute for $__rate_interval with a 1 s scrape interval is 4 s;
#: a wider window keeps the test independent of scheduling hiccups on a busy machine.
RATE_INTERVAL = "15s"
#: The workload's line announcing its scrape endpoint (deploy/workload/workload.py).
METRICS_PREFIX = "workload: metrics "
#: Bound on waiting for the first scrapes and rule evaluations.
WAIT_S = 90.0


@dataclass
class Stack:
    api: str
    metrics_url: str
    job: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The workload, and a Prometheus scraping it every second with envlink's rules."""
    prometheus = require_tool("prometheus")
    tmp = tmp_path_factory.mktemp("prometheus")
    workload = subprocess.Popen(
        [sys.executable, str(WORKLOAD), "--prometheus-port", "0", "--pause", "0.1",
         "--service-name", "envlink-workload"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    prom: subprocess.Popen[Any] | None = None
    reader: threading.Thread | None = None
    try:
        metrics_url, reader = read_line(workload.stdout, METRICS_PREFIX, 60)
        target = urllib.parse.urlparse(metrics_url).netloc
        job = "envlink-workload"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(RULES)],
            "scrape_configs": [{"job_name": job, "static_configs": [{"targets": [target]}]}],
        }
        prom, api = start_prometheus(prometheus, tmp, config)

        def workload_runs() -> None:
            assert workload.poll() is None, "the workload exited"

        wait_targets_up(api, prom, tmp / "prometheus.log", 1, WAIT_S, workload_runs)
        yield Stack(api, metrics_url, job)
    finally:
        if prom is not None:
            stop(prom)
        stop(workload)
        if reader is not None:
            reader.join(10)  # the workload has exited: its output ends
        assert workload.stdout is not None
        workload.stdout.close()


def _dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text(encoding="utf-8"))
            for p in sorted(DASHBOARDS.glob("*.json"))}


def _substitute(expr: str) -> str:
    """Template variables as Grafana sends them with "All" selected."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    return re.sub(r"\$(job|instance|method)\b", ".*", expr)


def _panel_queries() -> list[tuple[str, str]]:
    out = []
    for name, board in _dashboards().items():
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((f"{name} / {panel['title']} / {target['refId']}",
                            _substitute(target["expr"])))
    return out


def _recording_rules() -> list[str]:
    rules = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]


def _wait_for_data(api: str, queries: list[tuple[str, str]]) -> dict[str, str]:
    """Poll (bounded) until every query has a number; the ones that never did, and why."""
    pending = dict(queries)
    deadline = time.monotonic() + WAIT_S
    while pending and time.monotonic() < deadline:
        for label, expr in list(pending.items()):
            if has_number(query(api, expr)):
                del pending[label]
        if pending:
            time.sleep(0.5)  # polling interval, not synchronisation
    return {label: f"{expr} -> {query(api, expr)!r}" for label, expr in pending.items()}


def test_every_dashboard_panel_query_returns_data(stack: Stack) -> None:
    """Each query of each panel of each dashboard returns a number from real scrapes."""
    queries = _panel_queries()
    assert len(queries) >= 25
    missing = _wait_for_data(stack.api, queries)
    assert missing == {}
    print(f"\n{len(queries)} dashboard panel queries returned data")


def test_every_template_variable_resolves(stack: Stack) -> None:
    """The variables' label_values() queries return values (the workload's job)."""
    checked = 0
    for name, board in _dashboards().items():
        for var in board["templating"]["list"]:
            if var["type"] != "query":
                continue
            match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
            assert match, (name, var["name"])
            selector, label = _substitute(match.group(1)), match.group(2)
            values = get(f"{stack.api}/api/v1/label/{label}/values?"
                          + urllib.parse.urlencode({"match[]": selector}))["data"]
            assert values, (name, var["name"], selector)
            if label == "job":
                assert stack.job in values
            checked += 1
    assert checked == 5


def test_every_recording_rule_returns_data(stack: Stack) -> None:
    """Each recording rule, evaluated by Prometheus, has produced a number."""
    records = _recording_rules()
    assert len(records) >= 10
    missing = _wait_for_data(stack.api, [(r, r) for r in records])
    assert missing == {}
    rules = get(f"{stack.api}/api/v1/rules")["data"]["groups"]
    health = {r["name"]: (r["health"], r.get("lastError", "")) for g in rules
              for r in g["rules"]}
    assert all(h == "ok" for h, _err in health.values()), health
    print(f"\n{len(records)} recording rules returned data; {len(health)} rules healthy")


def test_scrape_endpoint_passes_promtool(stack: Stack) -> None:
    """The workload's scrape endpoint, with every fault and pool series in it, passes promtool."""
    promtool = require_tool("promtool")
    with urllib.request.urlopen(stack.metrics_url, timeout=10) as response:
        text = response.read().decode()
    for series in ("envlink_client_errors_total", "envlink_client_reconnects_total",
                   "envlink_session_recoveries_total", 'envlink_retry="true"',
                   'error_type="retry_budget_exhausted"', 'envlink_recovery_result="failed"',
                   'envlink_placement_result="unreachable"', 'envlink_breaker_state="open"',
                   "envlink_pool_stragglers_total", "envlink_pool_sessions",
                   "envlink_pool_breaker_state"):
        assert series in text, series
    result = subprocess.run([promtool, "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_kept_pools_breaker_goes_through_every_state(stack: Stack) -> None:
    """The flapping endpoint's breaker opens, half-opens and closes; the gauge saw 1 and 0."""
    window = "[5m]"
    queries = [(f"transitions to {state}",
                f'max(envlink_pool_breaker_transitions_total{{envlink_breaker_state="{state}"}})'
                " > 0") for state in ("open", "half_open", "closed")]
    # The same endpoint's gauge was 1 for closed at some scrape and 0 at another.
    queries += [
        ("gauge closed at 1", "max_over_time(envlink_pool_breaker_state"
                              f'{{envlink_breaker_state="closed"}}{window}) == 1'),
        ("gauge closed at 0 on an endpoint that was closed too",
         f'min_over_time(envlink_pool_breaker_state{{envlink_breaker_state="closed"}}{window})'
         f' == 0 and max_over_time(envlink_pool_breaker_state'
         f'{{envlink_breaker_state="closed"}}{window}) == 1'),
    ]
    missing = _wait_for_data(stack.api, queries)
    assert missing == {}
