"""``envlink demo``: runs an episode, reports it, exports it; fails in one line."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest

from envlink._cli.demo import percentile

from .conftest import Receiver

pytestmark = pytest.mark.timeout(30)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")
           and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["NO_COLOR"] = "1"
    return env


def _demo(*args: str, timeout: float = 25) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "envlink", "demo", *args],
                          capture_output=True, text=True, timeout=timeout, env=_env())


def test_percentile() -> None:
    """Percentiles interpolate linearly between ranks and reject bad input."""
    assert percentile([3.0], 99) == 3.0
    assert percentile([4.0, 1.0, 2.0, 3.0], 50) == 2.5
    assert percentile([1.0, 2.0], 90) == pytest.approx(1.9)
    assert percentile(list(range(101)), 99) == 99
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"within 0\.\.100"):
        percentile([1.0], 101)


def test_demo_reports_calls_tree_and_percentiles() -> None:
    """`python -m envlink demo` exits 0 and prints calls, totals, span tree, percentiles."""
    result = _demo("--steps", "3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert re.search(r"reset\(\)\s+\d+\.\d+ ms", out)
    assert len(re.findall(r"step echo_message\('hello \d'\)\s+\d+\.\d+ ms\s+-> 'hello \d'",
                          out)) == 3
    assert "step echo_with_length('envlink')" in out
    assert "-> echo_message, echo_with_length" in out  # list_tools
    assert re.search(r"state\(\)\s+\d+\.\d+ ms", out)
    assert "totals: 7 calls, 0 errors" in out
    # sync call (the hop merged into the client's span) -> server span, under the episode
    assert re.search(r"\n    step \[client\] [\d.]+ ms\n"
                     r"      step \[server\] [\d.]+ ms\n", out), out
    assert "envlink.bridge step" not in out
    assert re.search(r"^  envlink demo episode \[internal\]", out, re.M)
    table = out.split("latency by method")[1]
    assert re.search(r"step\s+5\s+[\d.]+ ms\s+[\d.]+ ms\s+[\d.]+ ms", table)
    assert re.search(r"reset\s+1\s", table)


def test_demo_survives_a_dropped_connection_by_resuming() -> None:
    """The demo's mid-episode drop is resumed (same session, no replay, nothing twice)."""
    result = _demo("--steps", "3", "--json-logs")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    # The call that hit the drop says so; every answer is still the right one.
    assert re.search(r"step echo_message\('hello 2'\)\s+[\d.]+ ms\s+-> 'hello 2'  "
                     r"\(connection dropped after the step was applied; session resumed\)",
                     out), out
    recovery = out.split("session recovery (on_session_lost='auto'):\n")[1]
    assert recovery.startswith(
        "  fault:  the server dropped the connection after applying step 2 "
        "(echo_message 'hello 2'), before answering\n"), out
    assert re.match(r"  resume: same session, envlink-resume, 1 try in [\d.]+ ms, no replay; "
                    r"the lost answer came from the server's de-duplication cache\n",
                    recovery.split("\n", 1)[1]), out
    # 3 echo_message + echo_with_length + list_tools, counted by the server's session.
    assert ("  steps:  5 of 5 kept; the server's step_count is 5 (5 asked), "
            "each applied once\n") in recovery
    assert "step_count': 5" in out or "'s..." in out  # state() is printed (maybe cut)
    # The span tree shows the reconnect under the call that hit it: the failed server
    # span, then the resume with its connect, then the step answered from the cache.
    assert re.search(r"\n    step \[client\] [\d.]+ ms\n"
                     r"      step \[server\] [\d.]+ ms error\.type=fault_injected\n"
                     r"      resume \[internal\] [\d.]+ ms envlink\.recovery=envlink-resume\n"
                     r"        connect \[client\] [\d.]+ ms envlink\.reason=resume\n"
                     r"(?:          .*\n)*"
                     r"        step \[server\] [\d.]+ ms envlink\.server\.dedup=true\n", out), out
    assert "replay [internal]" not in out
    assert out.split("what the spans are:")[0].count("resume [internal]") == 1
    # The client's own log says the same: recovered once, by resuming (one info line,
    # no session_lost warning for a session that was not lost to the caller).
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    events = [(r["event"], r.get("recovery"), r["level"]) for r in records
              if r["event"] in ("envlink.session_lost", "envlink.session_recovered")]
    assert events == [("envlink.session_recovered", "envlink-resume", "info")]


def test_demo_explains_its_spans_and_logs_no_expected_absence_as_info() -> None:
    """After the span tree, each kind of span shown is explained (the first connect's
    detached-session question included); the server's lack of detached sessions is a
    debug line, absent at the default level and present at --log-level debug."""
    result = _demo("--steps", "2", "--json-logs")
    assert result.returncode == 0, result.stderr
    legend = result.stdout.split("what the spans are:\n", 1)[1].split("\n\n", 1)[0]
    labels = [line.strip() for line in legend.splitlines() if not line.startswith("      ")]
    assert labels == ["envlink demo episode [internal]", "connect [internal]",
                      "connect [client]", "reset/step/state [client]", "<frame> [server]",
                      "error.type=fault_injected", "resume [internal]",
                      "connect [client] envlink.reason=resume", "envlink.server.dedup=true",
                      "envlink.bridge close [internal]"], legend
    assert "detached session (POST /mcp" in " ".join(legend.split())
    assert all(len(line) <= 100 for line in legend.splitlines())
    assert "detached_sessions_unavailable" not in result.stderr
    debug = _demo("--steps", "1", "--no-fault", "--json-logs", "--log-level", "debug")
    assert debug.returncode == 0, debug.stderr
    records = [json.loads(line) for line in debug.stderr.splitlines() if line.strip()]
    (absent,) = [r for r in records if r["event"] == "envlink.detached_sessions_unavailable"]
    assert absent["level"] == "debug" and absent["status"] == 200


def test_demo_no_fault_runs_without_a_drop() -> None:
    """--no-fault: no dropped connection, no resume, every step still counted once."""
    result = _demo("--steps", "2", "--no-fault")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "session resumed" not in out and "resume [internal]" not in out
    assert "error.type" not in out
    assert ("session recovery (on_session_lost='auto'):\n  no fault injected (--no-fault)\n"
            "  steps:  4 of 4 kept; the server's step_count is 4 (4 asked), "
            "each applied once\n") in out


def test_demo_fails_when_the_session_is_not_resumed() -> None:
    """If the client replayed instead of resuming, the demo's check fails it in one line."""
    code = (
        "import sys\n"
        "import envlink._cli.demo as demo\n"
        "demo._POLICY = 'replay'\n"  # a new session, the journal replayed into it
        "sys.exit(demo.run_demo(['--steps', '3']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=25, env=_env())
    assert result.returncode == 1, result.stdout
    lines = [line for line in result.stderr.splitlines()
             if line.startswith("envlink demo: error:")]
    assert lines == ["envlink demo: error: session recovery check failed: 5 steps asked, "
                     "but the steps the server applied is 7; the server created 2 sessions"
                     ], result.stderr


def test_demo_recovery_check_catches_a_step_applied_twice() -> None:
    """The demo's check refuses a server count above the steps asked (a step applied twice)."""
    from envlink._cli.demo import _check, _DemoError, _Recovery

    fine = _Recovery(fault_step=2, steps_asked=5, journal_steps=5, mechanism="envlink-resume",
                     state_step_count=5, session_step_count=5, steps_applied=5,
                     sessions_created=1, resumes=1, dedup_hits=1, drops=1)
    _check(fine)
    twice = dataclasses.replace(fine, state_step_count=6, session_step_count=6,
                                steps_applied=6, dedup_hits=0)
    with pytest.raises(_DemoError, match="state\\(\\) step_count is 6"):
        _check(twice)


def test_demo_json_logs_carry_trace_ids() -> None:
    """--json-logs writes JSON log lines to stderr, with the episode's trace id."""
    result = _demo("--steps", "1", "--json-logs")
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines() if line.strip()]
    (done,) = [r for r in records if r["event"] == "envlink.demo.episode_done"]
    trace = re.search(r"span tree \(trace ([0-9a-f]{32})", result.stdout)
    assert trace
    assert done["trace_id"] == trace.group(1)


def test_demo_exports_over_otlp(otlp_http_receiver: Receiver) -> None:
    """--otlp-endpoint exports the episode's spans (client and server) and metrics."""
    result = _demo("--steps", "2", "--otlp-endpoint", otlp_http_receiver.endpoint)
    assert result.returncode == 0, result.stderr
    names = {s.name for s in otlp_http_receiver.received.spans()}
    assert {"envlink demo episode", "step", "reset"} <= names
    assert "rpc.client.call.duration" in otlp_http_receiver.received.metric_names()
    services = {r.get("service.name") for r in otlp_http_receiver.received.resources()}
    assert services == {"envlink-demo"}


def test_demo_serves_metrics_until_interrupted() -> None:
    """--prometheus-port 0 --serve-metrics serves the episode's metrics until SIGINT."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "envlink", "demo", "--steps", "2", "--prometheus-port", "0",
         "--serve-metrics"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:  # blocks until the demo says where it serves
            match = re.match(r"serving metrics on (http://127\.0\.0\.1:\d+/metrics)", line)
            if match:
                url = match.group(1)
                break
        assert url, proc.stderr.read() if proc.stderr else ""
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        assert 'rpc_client_call_duration_seconds_count{envlink_outcome="ok"' in text
        assert 'service_name="envlink-demo"' in text
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_demo_port_in_use_fails_in_one_line() -> None:
    """A Prometheus port in use: exit 1 and a single line on stderr naming the port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _demo("--prometheus-port", str(port))
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("envlink demo: error: telemetry setup failed: ")
    assert f"127.0.0.1:{port}" in lines[0]


def test_demo_usage_errors() -> None:
    """Bad options exit 2: --serve-metrics without a port, --steps 0."""
    from envlink._cli.demo import run_demo

    assert run_demo(["--serve-metrics"]) == 2
    assert run_demo(["--steps", "0"]) == 2


def test_demo_server_failure_fails_in_one_line() -> None:
    """If the reference server cannot start: exit 1 and one line on stderr saying so."""
    code = (
        "import sys\n"
        "from envlink.server import ServerThread\n"
        "def broken(self, timeout=10.0):\n"
        "    raise OSError(98, 'Address already in use')\n"
        "ServerThread.start = broken\n"
        "from envlink._cli.demo import run_demo\n"
        "sys.exit(run_demo(['--steps', '1']))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=25, env=_env())
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["envlink demo: error: the reference server failed to start: "
                     "[Errno 98] Address already in use"]


def test_readme_shows_what_the_demo_prints() -> None:
    """The README's excerpts of the demo's recovery report and span tree match a real run."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    quickstart = readme.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    excerpts = re.findall(r"```text\n(.*?)\n```", quickstart, re.S)
    assert len(excerpts) == 2
    result = _demo()  # the Quickstart's command: default options
    assert result.returncode == 0, result.stderr
    for excerpt in excerpts:
        # Durations differ from run to run; everything else must be printed as shown.
        pattern = r"[\d.]+ ms".join(map(re.escape, re.split(r"\d+\.\d+ ms", excerpt)))
        assert re.search(pattern, result.stdout), (excerpt, result.stdout)
