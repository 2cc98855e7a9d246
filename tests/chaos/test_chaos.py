"""The chaos suite: seeded episodes under injected faults, invariants checked from outside.

Bounded by default (part of every ``pytest`` run); ``--soak`` or ``ENVLINK_CHAOS_SOAK=1``
runs the soak instead (see conftest.py and docs/reliability.md).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ._engine import (
    ChaosConfig,
    Stats,
    format_summary,
    load_async,
    load_threads,
    run_chaos,
)
from ._oracle import Ledger
from ._servers import FAULT_KINDS, IN_PROCESS_KINDS, InProcessServers
from .run_chaos import (
    SOAK_EPISODES,
    SOAK_FAULTS,
    run_workers,
    soak_config,
    soak_enabled,
    soak_shortfalls,
)

#: Bounded mode: every fault kind at least this many times.
BOUNDED_MIN_FAULTS = 3


@pytest.fixture
def bounded(request: pytest.FixtureRequest) -> None:
    """Skip the bounded tests in a soak session (the soak covers them, at scale)."""
    if soak_enabled(request.config):
        pytest.skip("soak mode: the soak test runs instead")


def _assert_clean(report: dict[str, Any]) -> None:
    assert report["violations"] == 0, report["violation_samples"][:5]
    assert report["leaks"] == 0, report["leak_samples"][:5]
    # Every phase ran with a recorder, and its files were checked against the caller.
    recording = report["recording"]
    assert recording["phases"] >= 1 and recording["episodes"] >= 1, recording
    assert (recording["broken_lines"], recording["incomplete"]) == (0, 0), recording


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("bounded")
def test_chaos_in_process_bounded(request: pytest.FixtureRequest, tmp_path: Path,
                                  chaos_seed: int, chaos_report: Callable[[str], Path],
                                  chaos_summary: Callable[[str], None]) -> None:
    """Every face x policy x protocol under every in-process fault kind: no violation, no
    leak, and every episode's recording exactly what its caller got."""
    run = run_chaos(ChaosConfig(seed=chaos_seed, episodes=36, streams=("inprocess",),
                                report=chaos_report("bounded-inprocess"),
                                label="bounded-inprocess", recordings=tmp_path / "rec"))
    chaos_summary(run.summary())
    report = run.report
    _assert_clean(report)
    assert report["recording"]["phases"] == 36
    if not (request.config.getoption("--chaos-report")
            or os.environ.get("ENVLINK_CHAOS_REPORT")):
        assert run.report_path.parent == tmp_path  # never outside pytest's directory
    assert report["episodes"]["total"] == 36
    for face in ("async", "sync", "threads"):
        assert report["episodes"][f"driver:{face}"] == 12
    for kind in IN_PROCESS_KINDS:
        assert report["faults"][kind] >= BOUNDED_MIN_FAULTS, kind


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("bounded")
def test_chaos_kill_9_bounded(tmp_path: Path, chaos_seed: int,
                              chaos_report: Callable[[str], Path],
                              chaos_summary: Callable[[str], None]) -> None:
    """kill -9 of real `envlink serve` processes, with and without --session-store: all clean."""
    run = run_chaos(ChaosConfig(seed=chaos_seed, episodes=0, kill_episodes=12,
                                streams=("kill",), report=chaos_report("bounded-kill"),
                                label="bounded-kill", recordings=tmp_path / "rec"))
    chaos_summary(run.summary())
    report = run.report
    _assert_clean(report)
    assert report["episodes"]["total"] == 12
    for kind in ("kill9", "kill9_store"):
        assert report["faults"][kind] >= 2 * BOUNDED_MIN_FAULTS, kind


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("bounded")
@pytest.mark.parametrize(("policy", "protocol"), [("resume", "ext"), ("replay", "plain")])
def test_load_2000_concurrent_calls_on_one_async_client(
        policy: str, protocol: str, chaos_summary: Callable[[str], None]) -> None:
    """2,000 concurrent steps on one async client under faults: each gets its own answer once."""
    ledger, stats = Ledger(), Stats()
    with InProcessServers(ledger) as servers:
        [segment] = load_async(servers, ledger, calls=2000, policy=policy, protocol=protocol,
                               seed=700_001, stats=stats)
    report = stats.to_dict(ChaosConfig(label=f"load-async-{policy}-{protocol}"))
    chaos_summary(format_summary(report))
    _assert_clean(report)
    assert report["calls"]["step"] == 2000
    assert sum(report["faults"].values()) >= 3, report["faults"]
    answered = [c for c in segment.calls if c.method == "step" and c.ok]
    # Most calls succeed (the faults touch a handful), each with its own bit set.
    assert len(answered) >= 1500
    assert all(c.answer is not None and c.answer["position"] & c.move for c in answered)


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("bounded")
@pytest.mark.parametrize(("policy", "protocol"),
                         [("resume", "ext"), ("replay", "plain"), ("replay", "ext")])
def test_load_8_threads_share_one_sync_client(
        policy: str, protocol: str, chaos_summary: Callable[[str], None]) -> None:
    """8 caller threads on one sync facade, 30 waves, faults in half: no violation, no leak."""
    ledger, stats = Ledger(), Stats()
    with InProcessServers(ledger) as servers:
        load_threads(servers, ledger, waves=30, policy=policy, protocol=protocol,
                     seed=800_000 + len(policy), stats=stats)
    report = stats.to_dict(ChaosConfig(label=f"load-threads-{policy}-{protocol}"))
    chaos_summary(format_summary(report))
    _assert_clean(report)
    assert sum(report["calls"].values()) >= 8 * 30
    assert sum(report["faults"].values()) >= 5, report["faults"]


@pytest.mark.timeout(3600)
def test_chaos_soak(request: pytest.FixtureRequest, chaos_seed: int,
                    chaos_report: Callable[[str], Path],
                    chaos_summary: Callable[[str], None]) -> None:
    """Soak: >= 1,000 episodes and >= 500 injected faults of every kind, with no violation."""
    if not soak_enabled(request.config):
        pytest.skip("soak mode only: pytest tests/chaos --soak (or ENVLINK_CHAOS_SOAK=1)")
    workers = int(os.environ.get("ENVLINK_CHAOS_WORKERS", 3))
    report, path = run_workers(workers=workers, label="soak", report=chaos_report("soak"),
                               **soak_config(chaos_seed))
    chaos_summary(format_summary(report, path))
    _assert_clean(report)
    assert not soak_shortfalls(report)
    assert report["episodes"]["total"] >= SOAK_EPISODES
    assert all(report["faults"][kind] >= SOAK_FAULTS for kind in FAULT_KINDS)
