"""The regression guard: single-session instruction counts, under callgrind, within 3 %
of the committed baseline (``benchmarks/instruction_baseline.json``).

``benchmarks/instruction_guard.py`` counts the sync and async step with and without
the SDK (``run.py --instructions``, envlink's server, 100- and 600-step windows) and
what envlink's SDK path adds to a call against the SDK's floor
(``bench_telemetry.py --instructions``), on this interpreter, and compares them with
the baseline recorded for this Python version: a count more than 3 % above it fails
(a regression), more than 3 % below it fails too (record the new baseline, a
deliberate commit: docs/performance.md, "The regression guard"). Counts only, never
times. Needs valgrind, a C compiler and valgrind's ``callgrind.h``; without them it
reports itself skipped, and ``ENVLINK_REQUIRE_VALGRIND=1`` makes that a failure.
Running Python under valgrind takes minutes, so the test runs when
``ENVLINK_INSTRUCTION_COUNTS=1`` asks for it (``.ci/run`` does, once, on its 3.11)
and reports itself skipped otherwise.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
HEADER = Path("/usr/include/valgrind/callgrind.h")


def _missing() -> str | None:
    if shutil.which("valgrind") is None:
        return "valgrind is not installed"
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler"
    if not HEADER.exists():
        return f"{HEADER} is missing"
    return None


def _require_counts() -> None:
    if os.environ.get("ENVLINK_INSTRUCTION_COUNTS") != "1":
        pytest.skip("slow (Python under valgrind): set ENVLINK_INSTRUCTION_COUNTS=1, "
                    "as .ci/run does")
    missing = _missing()
    if missing is not None:
        if os.environ.get("ENVLINK_REQUIRE_VALGRIND") == "1":
            pytest.fail(f"ENVLINK_REQUIRE_VALGRIND=1 but {missing}")
        pytest.skip(missing)


@pytest.mark.timeout(900)
def test_instruction_counts_are_within_the_committed_baseline(tmp_path: Path) -> None:
    """Every guarded count is within 3 % of this Python's baseline; the windows' profiles
    are readable as documented."""
    _require_counts()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "instruction_guard.py"),
         "--keep", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=850, check=False)
    assert "k instr/step" in proc.stdout, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    res = json.loads((tmp_path / "steps.json").read_text())["instructions"]
    variants = res["pythons"][minor]["variants"]["envlink"]
    short, long_ = res["steps"]
    assert (short, long_) == (100, 600)
    for name in ("floor sync (websockets.sync)", "envlink sync", "envlink async",
                 "envlink sync +SDK"):
        run = variants[name]["runs"][0]
        assert run["long"] > run["short"] > 0, (name, run)
        assert Path(run["profile"]).exists()
    annotate = shutil.which("callgrind_annotate")
    if annotate is not None:  # the profile of a window is readable as documented
        text = subprocess.run([annotate, variants["envlink sync"]["runs"][0]["profile"]],
                              capture_output=True, text=True, timeout=120, check=True).stdout
        assert "PROGRAM TOTALS" in text


def test_the_baseline_covers_the_guarded_figures() -> None:
    """The committed baseline has every guarded figure for the Python CI counts on."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import instruction_guard
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    base = json.loads(instruction_guard.BASELINE.read_text())
    assert "3.11" in base["pythons"]  # .ci/run counts on its .venv, Python 3.11
    for entry in base["pythons"].values():
        assert set(instruction_guard.GUARDED) <= set(entry["figures"]), entry
        assert entry["commit"] and entry["versions"]["python"]


def _guard() -> Any:
    spec = importlib.util.spec_from_file_location(
        "instruction_guard", ROOT / "benchmarks" / "instruction_guard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_constraints_pin_the_baselines_dependency_versions() -> None:
    """The constraints file .ci/run counts with pins every dependency version each
    baseline records, at that version (so CI counts with the baseline's versions, not
    the newest release), and .ci/run installs it for the counting run."""
    pins = {}
    for line in (ROOT / "benchmarks" / "instruction_constraints.txt").read_text().splitlines():
        name, sep, pinned = line.split("#")[0].strip().partition("==")
        if sep:
            pins[name.lower().replace("_", "-")] = pinned
    baselines = json.loads((ROOT / "benchmarks" / "instruction_baseline.json").read_text())
    # The websockets baseline (under "pythons") and the picows one (under "fast"): each
    # records the versions it was counted with, every one pinned at that version.
    sections = [("websockets", baselines["pythons"])]
    sections += [("picows", baselines["fast"]["pythons"])] if "fast" in baselines else []
    assert [arm for arm, _ in sections] == list(_guard().ARMS)
    for arm, pythons in sections:
        for minor, base in pythons.items():
            recorded = {k: v for k, v in base["versions"].items() if k != "python"}
            assert set(recorded) <= set(_guard().PACKAGES), (arm, minor)
            assert {"websockets", "pydantic-core", "opentelemetry-api"} <= set(recorded)
            if arm == "picows":
                assert {"picows", "uvloop"} <= set(recorded), minor
            assert {k: pins.get(k) for k in recorded} == recorded, (arm, minor)
    ci = (ROOT / ".ci" / "run").read_text()
    install = ci.index("-c benchmarks/instruction_constraints.txt")
    assert install < ci.index("tests/test_benchmark_instructions.py")
    # ... with the fast extra, so that the picows baseline is guarded there too.
    assert "'.[fast]'" in ci[install:ci.index("tests/test_benchmark_instructions.py")]


def test_the_guard_names_the_versions_that_differ_from_the_baselines(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A comparison made with other dependency versions than the baseline's says so,
    naming each version and the constraints file that installs the baseline's."""
    guard = _guard()
    now = guard.versions()
    base = {"commit": "abc1234", "figures": {},
            "versions": {**now, "websockets": "0.1", "opentelemetry-sdk": now[
                "opentelemetry-sdk"]}}
    guard.compare({}, base)
    out = capsys.readouterr().out
    assert "NOT the baseline's dependency versions" in out
    assert f"websockets 0.1 -> {now['websockets']}" in out
    assert "benchmarks/instruction_constraints.txt" in out
    assert "opentelemetry-sdk" not in out.partition("versions")[2]
