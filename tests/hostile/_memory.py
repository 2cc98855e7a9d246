"""Peak memory of a process, read from the kernel (``VmHWM``), never a timing."""

from __future__ import annotations

import resource
import sys

__all__ = ["MIB", "peak_rss", "self_peak_rss"]

MIB = 1024 * 1024


def peak_rss(pid: int) -> int:
    """The peak resident set size of process ``pid`` in bytes (Linux ``/proc``)."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for process {pid}")


def self_peak_rss() -> int:
    """This process's peak resident set size in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
