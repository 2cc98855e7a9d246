"""Each alert fires when its failure really happens, and only then, on a real Prometheus.

One real Prometheus (127.0.0.1, a free port, a temporary data directory) loads the
project's own rules (deploy/prometheus/rules) through :func:`shorten`, which changes
nothing but the range windows and the ``for:`` durations (a test checks that), and
scrapes one process per scenario of tests/ops/alert_scenarios.py, each a real envlink
workload against real reference servers on loopback, each its own scrape job (the
alerts' ``job`` label). Every scenario runs at once; each test polls Prometheus' API
with a deadline:

- an alert scenario's alerts reach ``firing`` (``/api/v1/alerts``) within
  :data:`FIRE_WITHIN_S`;
- once the healthy run has lasted the longest shortened window (plus the longest
  ``for:``), every job has fired exactly the alerts its scenario expects (the
  ``ALERTS`` series over the whole run, and every ``/api/v1/alerts`` answer seen):
  none for ``healthy``, no other alert for any scenario;
- the pool scenario's signals (breaker open and closed, placements off a full
  server, stragglers) show on their dashboard panels' queries while it runs.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from ._live import get, query, read_line, start_prometheus, stop, wait_targets_up
from .conftest import DASHBOARDS, RULES, require_tool

pytestmark = pytest.mark.timeout(300)

SCENARIOS_SCRIPT = Path(__file__).with_name("alert_scenarios.py")
METRICS_PREFIX = "scenario: metrics "

#: The transformation: range windows and ``for:`` durations of the rules, shortened.
#: Monotonic, so every relation between windows (short confirms long, 5m < 30m < 1h < 6h)
#: holds. The 5m window stays 60 s: with the rules' per-second thresholds unchanged,
#: a window that short still tells "one session lost every 40 s" (recovery alert only)
#: from "3 or more a minute" (the loss-rate alert).
WINDOWS = {"5m": "60s", "30m": "70s", "1h": "80s", "6h": "90s"}
FORS = {"2m": "3s", "5m": "5s", "10m": "6s", "15m": "8s"}

#: Each scenario's expected alerts. A total outage burns both the 1-hour and the
#: 6-hour budget (the slow-burn alert's conditions are a subset of the fast one's: in
#: a fleet, Alertmanager inhibits the slow page while the fast one fires).
EXPECTED: dict[str, set[str]] = {
    "healthy": set(),
    "outage": {"EnvlinkErrorBudgetBurnFast", "EnvlinkErrorBudgetBurnSlow"},
    "slow-burn": {"EnvlinkErrorBudgetBurnSlow"},
    "budget": {"EnvlinkRetryBudgetExhausted"},
    "latency": {"EnvlinkCallLatencyHigh"},
    "flapping": {"EnvlinkReconnectStorm"},
    "sessions-lost": {"EnvlinkSessionLossRateHigh"},
    "lost-under-raise": {"EnvlinkSessionRecoveryFailing"},
    "recovery-failing": {"EnvlinkSessionRecoveryFailing"},
}
#: Scenarios whose alerts are not asserted: the pool's signals are checked on panels.
PANEL_SCENARIOS = ("pool",)
#: Bound on an expected alert reaching ``firing``, from the moment every target is up.
FIRE_WITHIN_S = 120.0
_DURATION = re.compile(r"\[(\d+[smhd])\]")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _seconds(duration: str) -> int:
    return int(duration[:-1]) * _SECONDS[duration[-1]]


#: How long the healthy run lasts: the longest shortened window and ``for:``, and a
#: few scrapes more.
HEALTHY_S = max(map(_seconds, WINDOWS.values())) + max(map(_seconds, FORS.values())) + 5


def shorten(rules: dict[str, Any]) -> dict[str, Any]:
    """The rules with shortened range windows and ``for:`` durations; nothing else changed."""
    out = json.loads(json.dumps(rules))
    for group in out["groups"]:
        for rule in group["rules"]:
            rule["expr"] = _DURATION.sub(lambda m: f"[{WINDOWS[m.group(1)]}]", rule["expr"])
            if "for" in rule:
                rule["for"] = FORS[rule["for"]]
    return out


def job_of(scenario: str) -> str:
    return f"envlink-{scenario}"


@dataclass
class Run:
    """Prometheus and the scenarios it scrapes."""

    api: str
    started: float
    tmp: Path
    #: (job, alertname) of every firing alert any /api/v1/alerts answer showed.
    seen_firing: set[tuple[str, str]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self) -> list[dict[str, Any]]:
        """The current alerts, noting the firing ones."""
        alerts: list[dict[str, Any]] = get(f"{self.api}/api/v1/alerts")["data"]["alerts"]
        with self.lock:
            for alert in alerts:
                if alert["state"] == "firing":
                    self.seen_firing.add((alert["labels"].get("job", ""),
                                          alert["labels"]["alertname"]))
        return alerts


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """Every scenario in its own process, and one Prometheus scraping them all."""
    prometheus = require_tool("prometheus")
    promtool = require_tool("promtool")
    tmp = tmp_path_factory.mktemp("alerts")
    rules = tmp / "envlink.rules.short.yml"
    rules.write_text(yaml.safe_dump(shorten(yaml.safe_load(RULES.read_text("utf-8"))),
                                    sort_keys=False), encoding="utf-8")
    checked = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    names = [*EXPECTED, *PANEL_SCENARIOS]
    procs: dict[str, subprocess.Popen[str]] = {}
    readers: list[threading.Thread] = []
    prom: subprocess.Popen[Any] | None = None
    try:
        for name in names:
            procs[name] = subprocess.Popen(
                [sys.executable, str(SCENARIOS_SCRIPT), name, "--armed-by-signal"],
                stdout=subprocess.PIPE, stderr=(tmp / f"{name}.log").open("w"), text=True)
        targets = {}
        for name, proc in procs.items():
            url, reader = read_line(proc.stdout, METRICS_PREFIX, 60)
            readers.append(reader)
            targets[name] = urllib.parse.urlparse(url).netloc
        config = {
            # Scrapes every 2 s (each must answer within that): ten processes share
            # the machine; the rules are evaluated every second.
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": job_of(name),
                                "static_configs": [{"targets": [target]}]}
                               for name, target in targets.items()],
        }
        prom, api = start_prometheus(prometheus, tmp, config)

        def all_running() -> None:
            for name, proc in procs.items():
                assert proc.poll() is None, (name, (tmp / f"{name}.log").read_text())

        wait_targets_up(api, prom, tmp / "prometheus.log", len(procs), 60, all_running)
        for proc in procs.values():  # Prometheus has scraped each: failures may start
            proc.send_signal(signal.SIGUSR1)
        yield Run(api, time.monotonic(), tmp)
        all_running()  # no scenario died on the way (a dead one fires nothing)
    finally:
        if prom is not None:
            stop(prom)
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()  # all at once: each then exits in parallel
        for proc in procs.values():
            stop(proc)
        for reader in readers:
            reader.join(10)
        for proc in procs.values():
            if proc.stdout is not None:
                proc.stdout.close()


def _series(run: Run, job: str) -> list[tuple[str, str]]:
    """The job's envlink series that are not 0, and their values (for failure messages)."""
    return [(r["metric"]["__name__"] + str({k: v for k, v in r["metric"].items()
                                           if k.startswith(("envlink_", "error_", "rpc_m"))}),
             r["value"][1])
            for r in query(run.api, f'{{job="{job}", __name__=~"envlink_.*_total|job:.*"}} > 0')]


def _logs(run: Run, scenario: str) -> str:
    return (run.tmp / f"{scenario}.log").read_text(encoding="utf-8")[-3000:]


def test_shortened_rules_differ_only_in_windows_and_for_durations() -> None:
    """The suite's rules are the project's rules with every window and for: shorter,
    the mapping monotonic, and everything else (expressions, labels, annotations) equal."""
    original = yaml.safe_load(RULES.read_text("utf-8"))
    short = shorten(original)
    assert sorted(WINDOWS, key=_seconds) == sorted(WINDOWS, key=lambda d: _seconds(WINDOWS[d]))
    assert sorted(FORS, key=_seconds) == sorted(FORS, key=lambda d: _seconds(FORS[d]))
    count = 0
    for group, short_group in zip(original["groups"], short["groups"], strict=True):
        assert group["name"] == short_group["name"]
        for rule, short_rule in zip(group["rules"], short_group["rules"], strict=True):
            assert rule.keys() == short_rule.keys()
            for key in rule.keys() - {"expr", "for"}:
                assert rule[key] == short_rule[key], key
            assert _DURATION.sub("[W]", rule["expr"]) == _DURATION.sub("[W]", short_rule["expr"])
            long_w = _DURATION.findall(rule["expr"])
            short_w = _DURATION.findall(short_rule["expr"])
            assert len(long_w) == len(short_w)
            assert all(_seconds(s) < _seconds(o) for o, s in zip(long_w, short_w, strict=True))
            if "for" in rule:
                assert _seconds(short_rule["for"]) < _seconds(rule["for"])
            count += 1
    alerts = {r["alert"] for g in original["groups"] for r in g["rules"] if "alert" in r}
    assert count == 20 and len(alerts) == 7
    # Every alert is some scenario's expected one.
    assert set().union(*EXPECTED.values()) == alerts


@pytest.mark.parametrize("scenario", [s for s, alerts in EXPECTED.items() if alerts])
def test_the_scenarios_alerts_fire(run: Run, scenario: str) -> None:
    """The scenario's failure, produced for real, makes its alert(s) reach firing."""
    job = job_of(scenario)
    deadline = run.started + FIRE_WITHIN_S
    while True:
        alerts = run.alerts()
        firing = {a["labels"]["alertname"] for a in alerts
                  if a["labels"].get("job") == job and a["state"] == "firing"}
        if EXPECTED[scenario] <= firing:
            break
        mine = [(a["labels"]["alertname"], a["state"]) for a in alerts
                if a["labels"].get("job") == job]
        assert time.monotonic() < deadline, (
            f"{scenario}: {sorted(EXPECTED[scenario] - firing)} not firing within "
            f"{FIRE_WITHIN_S} s; alerts of {job}: {mine}; its series: "
            f"{_series(run, job)}\n{_logs(run, scenario)}")
        time.sleep(0.5)  # polling interval, not synchronisation


def test_recovery_failures_of_both_kinds_were_recorded(run: Run) -> None:
    """The recovery-failing scenario's alert stands on both failures: a resume refused
    (the restarted server has no such session) and a replay that diverged."""
    job = job_of("recovery-failing")
    wanted = {("resume", "failed"), ("replay", "diverged")}
    deadline = run.started + FIRE_WITHIN_S
    while True:
        seen = {(r["metric"]["envlink_recovery_policy"], r["metric"]["envlink_recovery_result"])
                for r in query(run.api, f'envlink_session_recoveries_total{{job="{job}"}} > 0')}
        if wanted <= seen:
            break
        assert time.monotonic() < deadline, (seen, _logs(run, "recovery-failing"))
        time.sleep(0.5)  # polling interval, not synchronisation


def _panel_expr(title: str, job: str) -> str:
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text(encoding="utf-8"))["panels"]:
            if panel["title"] == title:
                (target,) = panel["targets"]
                expr: str = target["expr"]
                return (expr.replace("$__rate_interval", "15s").replace("$job", job)
                        .replace("$instance", ".*"))
    raise AssertionError(f"no panel {title!r}")


def test_pool_signals_show_on_their_panels(run: Run) -> None:
    """While the pool scenario runs, its panels show a breaker opening and closing again,
    placements refused by the full server and placed elsewhere, and stragglers."""
    job = job_of("pool")
    wanted = {
        ("Breaker transitions by endpoint and state", "envlink_breaker_state", "open"),
        ("Breaker transitions by endpoint and state", "envlink_breaker_state", "closed"),
        ("Placements by endpoint and result", "envlink_placement_result", "capacity_reached"),
        ("Placements by endpoint and result", "envlink_placement_result", "placed"),
        ("Pool stragglers", "rpc_method", "step"),
    }
    seen: set[tuple[str, str, str]] = set()
    full_endpoints: set[str] = set()
    placed_endpoints: set[str] = set()
    deadline = run.started + FIRE_WITHIN_S
    while not wanted <= seen or not placed_endpoints - full_endpoints:
        assert time.monotonic() < deadline, (sorted(wanted - seen), _logs(run, "pool"))
        for title, label, value in wanted:
            for r in query(run.api, _panel_expr(title, job)):
                if r["metric"].get(label) == value and float(r["value"][1]) > 0:
                    seen.add((title, label, value))
                    endpoint = r["metric"].get("server_port", "")
                    if value == "capacity_reached":
                        full_endpoints.add(endpoint)
                    elif value == "placed":
                        placed_endpoints.add(endpoint)
        time.sleep(0.5)  # polling interval, not synchronisation


def test_each_alert_fires_in_its_scenario_only_and_a_healthy_run_fires_none(run: Run) -> None:
    """Over a run as long as the longest shortened window, every job fired exactly its
    scenario's alerts: the healthy one none, no scenario another scenario's."""
    while time.monotonic() < run.started + HEALTHY_S:
        run.alerts()
        time.sleep(0.5)  # polling interval, not synchronisation
    run.alerts()
    elapsed = int(time.monotonic() - run.started) + 10
    fired = {(r["metric"]["job"], r["metric"]["alertname"]) for r in query(
        run.api, f'max_over_time(ALERTS{{alertstate="firing"}}[{elapsed}s])')}
    fired |= run.seen_firing
    # The healthy run had data all along: its ratio was recorded, and 0.
    (healthy,) = query(run.api, 'job:envlink_rpc_errors:ratio_rate6h{job="envlink-healthy"}')
    assert float(healthy["value"][1]) == 0
    got = {scenario: {name for job, name in fired if job == job_of(scenario)}
           for scenario in EXPECTED}
    assert got == EXPECTED
    pool = sorted(name for job, name in fired if job == job_of("pool"))
    print(f"\nalerts fired per scenario: {got}; pool scenario (not asserted): {pool}")
