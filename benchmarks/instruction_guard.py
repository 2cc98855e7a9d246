"""The regression guard: single-session instruction counts against a committed baseline.

Run::

    python3 benchmarks/instruction_guard.py            # count, compare, exit 1 on a regression
    python3 benchmarks/instruction_guard.py --record   # count and write this Python's baseline

Counts, under callgrind, on this interpreter (the one envlink is installed in, as it
is: nothing is installed), against envlink's reference server:

* ``run.py --instructions --pythons 3.X --servers envlink --clients floor,envlink,sdk``
  (100- and 600-step windows): the sync and async step, without and with the SDK, and
  the two ``websockets`` floors;
* ``bench_telemetry.py --instructions --iterations 1000`` for the configurations
  ``no SDK``, ``SDK, merged`` and ``SDK floor``: what envlink's SDK path adds to a
  call, against the SDK's own floor.

Each count is made on each transport (``ARMS``): ``websockets`` on asyncio's loop (the
baseline under ``"pythons"``) and, where picows is installed, ``picows`` with uvloop
for the bridge's loop, what ``envlink[fast]`` runs by default (the baseline under
``"fast"``). Each guarded figure (``GUARDED``) must stay within ``TOLERANCE`` (3 %) of
the baseline recorded for this Python version and transport in
``instruction_baseline.json``: above it
is a regression, below it a stale baseline (an improvement to record, so that a later
regression cannot hide under it). Two counts of the same code agree within about
0.4 %. The floors and the dependency versions are printed beside them, so a failure
caused by a new interpreter or dependency (which moves the floors too) shows as such.
Recording a baseline is a deliberate commit: ``--record``, with the reason in the
commit message and in ``docs/performance.md`` ("The regression guard").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BASELINE = HERE / "instruction_baseline.json"
#: The baseline's dependency versions, as pip constraints (.ci/run installs them).
CONSTRAINTS = HERE / "instruction_constraints.txt"
#: How far a guarded count may move from its baseline, either way.
TOLERANCE = 0.03
#: The guarded figures: a step's instructions (run.py's names) and the SDK path's ratio.
GUARDED = ("envlink async", "envlink sync", "envlink async +SDK", "envlink sync +SDK",
           "SDK path / SDK floor")
#: Printed beside them, not guarded (not envlink's code).
REPORTED = ("floor sync (websockets.sync)", "floor async (websockets.asyncio)",
            "SDK path (k per call)", "SDK floor (k per call)")
#: Whose versions a count depends on.
PACKAGES = ("websockets", "pydantic-core", "opentelemetry-sdk", "opentelemetry-api",
            "picows", "uvloop")
TELEMETRY_CONFIGS = ("no SDK", "SDK, merged (default)", "SDK floor")
#: The transports counted, each with the environment that selects it (envlink's own
#: choices: ENVLINK_TRANSPORT, ENVLINK_LOOP), and where its baseline is kept.
ARMS: dict[str, dict[str, str]] = {
    "websockets": {"ENVLINK_TRANSPORT": "websockets", "ENVLINK_LOOP": "asyncio"},
    "picows": {"ENVLINK_TRANSPORT": "picows", "ENVLINK_LOOP": "uvloop"},
}
_SECTION = {"websockets": None, "picows": "fast"}


def arms_here() -> list[str]:
    """The transports this interpreter can count (picows only where it is installed)."""
    return [arm for arm in ARMS
            if arm != "picows" or importlib.util.find_spec("picows") is not None]


def section(baselines: dict[str, Any], arm: str) -> dict[str, Any]:
    """The part of the baseline file that holds ``arm``'s baselines, by Python version."""
    key = _SECTION[arm]
    held: dict[str, Any] = baselines if key is None else baselines.setdefault(key, {})
    return held.setdefault("pythons", {})  # type: ignore[no-any-return]


def minor() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def versions() -> dict[str, str]:
    found = {"python": sys.version.split()[0]}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:  # pragma: no cover - a package envlink needs
            found[name] = "missing"
    return found


def count(work: Path, jobs: int, arm: str = "websockets") -> dict[str, float]:
    """Every figure of ``GUARDED`` and ``REPORTED``, counted now on this interpreter,
    with the transport ``arm``."""
    env = {**os.environ, **ARMS[arm]}
    steps_json = work / "steps.json"
    run = subprocess.run(
        [sys.executable, str(HERE / "run.py"), "--instructions", "--no-install",
         "--envlink-python", sys.executable, "--pythons", minor(), "--servers", "envlink",
         "--clients", "floor,envlink,sdk", "--jobs", str(jobs), "--json", str(steps_json),
         "--callgrind-dir", str(work / "callgrind")],
        cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    if run.returncode != 0:
        raise SystemExit(f"run.py --instructions failed:\n{run.stderr[-4000:]}")
    print(run.stdout.strip(), flush=True)
    res = json.loads(steps_json.read_text())["instructions"]
    variants = res["pythons"][minor()]["variants"]["envlink"]
    figures = {name: entry["per_step"] / 1000 for name, entry in variants.items()}
    tel_json = work / "telemetry.json"
    only = [arg for config in TELEMETRY_CONFIGS for arg in ("--only", config)]
    tel = subprocess.run(
        [sys.executable, str(HERE / "bench_telemetry.py"), "--instructions", "--iterations",
         "1000", *only, "--json", str(tel_json)],
        cwd=ROOT, capture_output=True, text=True, check=False, env=env)
    if tel.returncode != 0:
        raise SystemExit(f"bench_telemetry.py --instructions failed:\n{tel.stderr[-4000:]}")
    print(tel.stdout.strip(), flush=True)
    counted = json.loads(tel_json.read_text())
    figures["SDK path / SDK floor"] = counted["sdk_path_over_floor"]
    figures["SDK path (k per call)"] = counted["sdk_path"] / 1000
    figures["SDK floor (k per call)"] = counted["sdk_floor"] / 1000
    return figures


def compare(figures: dict[str, float], base: dict[str, Any], arm: str = "websockets"
            ) -> list[str]:
    """Print each figure against its baseline; return the guarded ones out of bounds."""
    recorded = base["figures"]
    print(f"\ninstruction guard, Python {minor()}, {arm}: now against the baseline recorded at "
          f"{base.get('commit', '?')} (guarded within {TOLERANCE:.0%} either way)")
    print(f"  {'figure':<36}{'baseline':>10}{'now':>10}{'change':>9}")
    failures = []
    for name in (*GUARDED, *REPORTED):
        if name not in figures or name not in recorded:
            if name in GUARDED:
                failures.append(f"{arm} {name}: not counted or not in the baseline")
            continue
        was, now = recorded[name], figures[name]
        change = now / was - 1
        mark = ""
        if name in GUARDED and abs(change) > TOLERANCE:
            mark = "  REGRESSION" if change > 0 else "  below: record the new baseline"
            failures.append(f"{arm} {name}: {was:.3f} -> {now:.3f} ({change:+.2%})")
        print(f"  {name:<36}{was:>10.3f}{now:>10.3f}{change:>+8.2%}{mark}")
    moved = {k: (v, versions()[k]) for k, v in base.get("versions", {}).items()
             if versions().get(k) != v}
    if moved:
        print("  NOT the baseline's dependency versions (install them with pip's "
              f"-c {CONSTRAINTS.relative_to(ROOT)}): " + ", ".join(
                  f"{k} {a} -> {b}" for k, (a, b) in moved.items()))
    return failures


def _head() -> str:
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=ROOT, capture_output=True, text=True,
                              check=False).stdout.strip()

    changed = git("status", "--porcelain", "--", "src")
    return git("rev-parse", "--short", "HEAD") + ("+changes" if changed else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--record", action="store_true",
                        help="write the counts as this Python's baseline instead of comparing")
    parser.add_argument("--baseline", default=str(BASELINE),
                        help="the baseline file (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=2, help="client processes counted at once")
    parser.add_argument("--keep", default=None, metavar="DIR",
                        help="keep the counts' JSON and callgrind profiles in DIR")
    parser.add_argument("--commit", default=None,
                        help="--record: the commit the counted tree is (default: git's HEAD, "
                             "marked '+changes' when src/ has uncommitted changes)")
    parser.add_argument("--transport", action="append", choices=sorted(ARMS), default=None,
                        help="count this transport only (repeatable; default: each one "
                             "installed)")
    args = parser.parse_args(argv)
    path = Path(args.baseline)
    baselines: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    arms = args.transport or arms_here()
    if not args.record:
        if minor() not in section(baselines, "websockets"):
            raise SystemExit(f"{path} has no baseline for Python {minor()}: record one with "
                             "--record (a deliberate commit; see docs/performance.md)")
        for arm in [a for a in arms if minor() not in section(baselines, a)]:
            # The websockets baseline is required; another transport's is guarded from
            # the commit that records it.
            print(f"{path} has no {arm} baseline for Python {minor()}: {arm} not guarded")
            arms.remove(arm)
    failures: list[str] = []
    for arm in arms:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(args.keep) if args.keep else Path(tmp)
            if arm != "websockets":
                work = work / arm
            work.mkdir(parents=True, exist_ok=True)
            figures = count(work, args.jobs, arm)
        if args.record:
            held = section(baselines, arm)
            held[minor()] = {
                "commit": args.commit or _head(), "versions": versions(),
                "figures": {k: round(v, 3) for k, v in figures.items()
                            if k in GUARDED or k in REPORTED}}
            ordered = dict(sorted(held.items()))
            held.clear()
            held.update(ordered)
            path.write_text(json.dumps(baselines, indent=2) + "\n")
            print(f"\n{arm} baseline for Python {minor()} written to {path}")
            continue
        failures += compare(figures, section(baselines, arm)[minor()], arm)
    if args.record:
        return 0
    if failures:
        print("\nNOT within the baseline:\n  " + "\n  ".join(failures))
        return 1
    print("\nevery guarded figure is within the baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
