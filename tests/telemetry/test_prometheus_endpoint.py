"""The Prometheus endpoint of configure() serves a valid exposition, whatever the order
of flushes and scrapes and however many scrapers there are."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import urllib.request
from collections import Counter

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)

from envlink import CallToolAction, EchoEnv
from envlink.server import ServerThread
from envlink.telemetry import TelemetryHandle, configure

pytestmark = pytest.mark.timeout(60)

_PROMTOOL = shutil.which("promtool")
_REQUIRED = os.environ.get("ENVLINK_REQUIRE_PROMETHEUS") == "1"


def _scrape(url: str, *, openmetrics: bool = False) -> str:
    request = urllib.request.Request(url)
    if openmetrics:
        request.add_header("Accept", "application/openmetrics-text; version=1.0.0")
    with urllib.request.urlopen(request, timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def check_exposition(text: str) -> None:
    """Fail unless ``text`` (Prometheus text format) is a valid exposition.

    One HELP and one TYPE line per family (what promtool rejects first; an empty
    exposition, before anything is recorded, is valid), then ``promtool check
    metrics`` (which exits non-zero on any problem) when promtool is installed.
    """
    helps = Counter(line.split()[2] for line in text.splitlines()
                    if line.startswith("# HELP "))
    types = Counter(line.split()[2] for line in text.splitlines()
                    if line.startswith("# TYPE "))
    assert [n for n, c in helps.items() if c > 1] == []
    assert [n for n, c in types.items() if c > 1] == []
    if _PROMTOOL is not None:
        result = subprocess.run([_PROMTOOL, "check", "metrics"], input=text, text=True,
                                capture_output=True, timeout=30, check=False)
        assert result.returncode == 0, result.stdout + result.stderr


def _require_promtool() -> None:
    if _PROMTOOL is None:
        if _REQUIRED:
            pytest.fail("ENVLINK_REQUIRE_PROMETHEUS=1 but promtool is not installed")
        pytest.skip("promtool is not installed (Debian package 'prometheus'); "
                    "the prometheus_client checks still ran")


def _record(h: TelemetryHandle) -> None:
    from envlink._telemetry.instruments import get_telemetry

    tel = get_telemetry(h.tracer_provider, h.meter_provider)
    tel.record(tel.call_duration, 0.003, {"rpc.method": "step"})
    tel.add(tel.attempts, 1, {"rpc.method": "step"})


def test_scrape_after_flush_lists_each_family_once() -> None:
    """force_flush() then a scrape: one HELP/TYPE per family (it listed them twice)."""
    with configure(prometheus_port=0, set_global=False) as h:
        assert h.prometheus_url is not None
        _record(h)
        assert h.force_flush()
        assert h.force_flush()
        first = _scrape(h.prometheus_url)
        _record(h)
        h.force_flush()
        second = _scrape(h.prometheus_url, openmetrics=True)
    check_exposition(first)
    assert "rpc_client_call_duration_seconds_count" in first
    # The OpenMetrics parser is strict: a family listed twice is an error there.
    families = [f.name for f in parse_openmetrics(second)]
    assert len(families) == len(set(families))
    # Nothing recorded before the flushes is lost: cumulative counts are all there.
    assert 'rpc_client_call_duration_seconds_count{' in first
    (count_line,) = [line for line in second.splitlines()
                     if line.startswith("rpc_client_call_duration_seconds_count{")]
    assert float(count_line.rsplit(" ", 1)[1]) == 2


def test_first_scrape_passes_promtool_after_flush() -> None:
    """promtool check metrics accepts the first scrape after a flush (the demo's case)."""
    _require_promtool()
    with configure(prometheus_port=0, set_global=False) as h:
        assert h.prometheus_url is not None
        _record(h)
        h.force_flush()
        text = _scrape(h.prometheus_url)
    assert _PROMTOOL is not None
    result = subprocess.run([_PROMTOOL, "check", "metrics"], input=text, text=True,
                            capture_output=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_concurrent_scrapes_while_episodes_run() -> None:
    """Several threads scrape at once while episodes run and flushes happen: all valid."""
    scrapes: list[str] = []
    failures: list[BaseException] = []
    done = threading.Event()
    with configure(prometheus_port=0, set_global=False) as h, \
            ServerThread(env="echo") as st:
        url = h.prometheus_url
        assert url is not None

        def scraper() -> None:
            try:
                while not done.is_set():
                    scrapes.append(_scrape(url))
            except BaseException as exc:  # reported below
                failures.append(exc)
                done.set()

        def flusher() -> None:
            try:
                while not done.is_set():
                    h.force_flush()
            except BaseException as exc:
                failures.append(exc)
                done.set()

        threads = [threading.Thread(target=scraper) for _ in range(4)]
        threads.append(threading.Thread(target=flusher))
        for t in threads:
            t.start()
        try:
            for _ in range(2):
                client = EchoEnv(base_url=st.url, tracer_provider=h.tracer_provider,
                                 meter_provider=h.meter_provider)
                with client.sync() as env:
                    env.reset()
                    for i in range(15):
                        env.step(CallToolAction(tool_name="echo_message",
                                                arguments={"message": str(i)}))
        finally:
            done.set()
            for t in threads:
                t.join(30)
        scrapes.append(_scrape(url))
    assert failures == []
    assert len(scrapes) > 4
    for text in scrapes:
        check_exposition(text)
    # The last scrape, after the episodes, has their series.
    assert "rpc_client_call_duration_seconds_count" in scrapes[-1]
    assert "envlink_client_message_size_bytes_count" in scrapes[-1]
