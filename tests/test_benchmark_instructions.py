"""benchmarks/run.py --instructions works: its quick form counts a client's steps under callgrind.

Counts only, never times; no figure is asserted but that each count is there. Needs
valgrind, a C compiler and valgrind's ``callgrind.h``; without them it reports itself
skipped, and ``ENVLINK_REQUIRE_VALGRIND=1`` makes that a failure. Running Python under
valgrind takes minutes, so the test runs when ``ENVLINK_INSTRUCTION_COUNTS=1`` asks for it
(``.ci/run`` does, once) and reports itself skipped otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(900)

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


def test_quick_instruction_count_of_the_floor_and_envlink(tmp_path: Path) -> None:
    """The quick form counts floor and envlink sync steps, prints them and writes the JSON."""
    if os.environ.get("ENVLINK_INSTRUCTION_COUNTS") != "1":
        pytest.skip("slow (Python under valgrind): set ENVLINK_INSTRUCTION_COUNTS=1, "
                    "as .ci/run does")
    missing = _missing()
    if missing is not None:
        if os.environ.get("ENVLINK_REQUIRE_VALGRIND") == "1":
            pytest.fail(f"ENVLINK_REQUIRE_VALGRIND=1 but {missing}")
        pytest.skip(missing)
    out = tmp_path / "instructions.json"
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--instructions", "--quick",
         "--no-install", "--envlink-python", sys.executable, "--pythons", minor,
         "--servers", "envlink", "--clients", "floor,envlink", "--jobs", "2",
         "--json", str(out), "--callgrind-dir", str(tmp_path / "callgrind")],
        cwd=ROOT, capture_output=True, text=True, timeout=850, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "k instr/step" in proc.stdout
    res = json.loads(out.read_text())["instructions"]
    variants = res["pythons"][minor]["variants"]["envlink"]
    short, long_ = res["steps"]
    assert long_ > short
    for name in ("floor sync (websockets.sync)", "envlink sync", "envlink async"):
        run = variants[name]["runs"][0]
        assert run["long"] > run["short"] > 0, (name, run)
        assert variants[name]["per_step"] > 0
        assert Path(run["profile"]).exists()
    annotate = shutil.which("callgrind_annotate")
    if annotate is not None:  # the profile of a window is readable as documented
        text = subprocess.run([annotate, variants["envlink sync"]["runs"][0]["profile"]],
                              capture_output=True, text=True, timeout=120, check=True).stdout
        assert "PROGRAM TOTALS" in text
    assert "envlink sync / openenv sync" not in proc.stdout  # no OpenEnv client was counted
