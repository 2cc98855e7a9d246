"""Counting a client's instructions with callgrind, around its steps only.

The client process runs under ``valgrind --tool=callgrind --instr-atstart=no``:
start-up, imports and warm-up run uninstrumented (fast, and not counted). Around
its one measured window the process calls a tiny C library through ``ctypes``
that issues callgrind's client requests (``callgrind.h``): start
instrumentation, run the steps, stop instrumentation. Instrumentation is global,
so every thread of the process is counted (the bridge's loop thread, the SDK's
export thread); the dump callgrind writes when the process exits holds the
window alone, every thread merged, and ``callgrind_annotate`` reads it.
(A client request's own dump would hold the calling thread only, which is why
each window is a process of its own.)

The per-step figure is the difference of a long and a short window, each in a
process of its own, divided by the difference of their steps, so that the
constant cost of a window (the requests themselves, the loop around the steps,
the first step after instrumentation starts) cancels.

Used by ``run.py --instructions`` (which builds the library once and hands its
path to the driver processes in ``ENVLINK_CALLGRIND_MARKS``) and by ``_driver.py``.
Needs only the standard library.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["MARKS_VAR", "Marks", "build_marks", "read_events", "read_total", "valgrind_argv"]

#: Environment variable naming the compiled marks library.
MARKS_VAR = "ENVLINK_CALLGRIND_MARKS"

_SOURCE = r"""
#include <valgrind/callgrind.h>

void envlink_marks_start(void) {
    CALLGRIND_START_INSTRUMENTATION;
}

void envlink_marks_stop(void) {
    CALLGRIND_STOP_INSTRUMENTATION;
}

int envlink_marks_running(void) {
    return RUNNING_ON_VALGRIND;
}
"""


def build_marks(cache: Path) -> Path:
    """Compile the marks library into ``cache`` (once per source) and return its path.

    Raises:
        SystemExit: no C compiler, or valgrind's headers are missing.
    """
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise SystemExit("--instructions needs a C compiler (cc) for callgrind's client "
                         "requests")
    digest = hashlib.sha256(_SOURCE.encode()).hexdigest()[:12]
    out = cache / f"envlink-marks-{digest}.so"
    if out.exists():
        return out
    cache.mkdir(parents=True, exist_ok=True)
    src = cache / f"envlink-marks-{digest}.c"
    src.write_text(_SOURCE)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    proc = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(tmp), str(src)],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise SystemExit("could not build the callgrind marks library (is valgrind's "
                         f"callgrind.h installed?):\n{proc.stdout}")
    tmp.replace(out)
    return out


class Marks:
    """The client side: start and stop counting around a window of steps."""

    def __init__(self, path: str) -> None:
        lib = ctypes.CDLL(path)
        self._start = lib.envlink_marks_start
        self._start.restype = None
        self._stop = lib.envlink_marks_stop
        self._stop.restype = None
        self.on_valgrind = bool(lib.envlink_marks_running())

    def start(self) -> None:
        self._start()

    def stop(self) -> None:
        self._stop()


def valgrind_argv(dump: Path, *, cache_sim: bool = False) -> list[str]:
    """The valgrind command line that goes before a client's ``python ...``.

    ``cache_sim``: also simulate the caches (first-level and last-level misses of
    instruction fetches, reads and writes: ``I1mr``, ``D1mr``, ``DLmr``, ...).
    """
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--fair-sched=yes",
            "--quiet", f"--callgrind-out-file={dump}",
            *(["--cache-sim=yes"] if cache_sim else [])]


_TOTALS = re.compile(r"^totals: (\d+)", re.M)


def read_total(dump: Path) -> int:
    """Instructions in a dump (every thread, as ``--separate-threads=no`` merges them).

    Raises:
        RuntimeError: the file holds no totals line.
    """
    match = _TOTALS.search(dump.read_text(errors="replace"))
    if match is None:
        raise RuntimeError(f"{dump}: no totals line")
    return int(match.group(1))


_EVENTS = re.compile(r"^events: (.+)$", re.M)
_EVENT_TOTALS = re.compile(r"^totals: ([\d ]+)$", re.M)


def read_events(dump: Path) -> dict[str, int]:
    """Every event's total in a dump (``Ir`` alone, or with the cache simulator's).

    Raises:
        RuntimeError: the file holds no events or totals line.
    """
    text = dump.read_text(errors="replace")
    names, totals = _EVENTS.search(text), _EVENT_TOTALS.search(text)
    if names is None or totals is None:
        raise RuntimeError(f"{dump}: no events or totals line")
    return dict(zip(names.group(1).split(), map(int, totals.group(1).split()), strict=False))
