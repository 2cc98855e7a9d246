"""What encoding a step's request costs, and what refusing sets and bytes would add.

Run::

    python3 benchmarks/bench_encode.py [--calls 10000] [--base OTHER/src]

Counts instructions per call under callgrind (needs valgrind and a C compiler: a
window of ``--calls`` calls and one of three times as many, a process each;
``PYTHONHASHSEED=0``), for the benchmark's action (``_driver.ACTION``):

* ``encode_call``: envlink's ``encode_call("step", action, request_id)``, as the
  client writes every request (pydantic-core's serialiser; a set or bytes is written
  as a list or a string, and only what the serialiser refuses is named, on its
  failure path);
* ``json C encoder, default= hook``: the alternative measured and not kept: the same
  frame written by json's C encoder (``c_make_encoder``, made once) with a
  ``default=`` hook, which sets and bytes do reach, so they could be refused before
  sending.

``--base``: ``encode_call`` of another tree as well (its ``src``), in the same run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

_CHILD = r"""
import gc, json, os, sys
sys.path.insert(0, sys.argv[3])
from _callgrind import MARKS_VAR, Marks
from _driver import ACTION
variant, calls = sys.argv[1], int(sys.argv[2])
if variant == "encode_call":
    from envlink._sansio.protocol import encode_call

    def call(i):
        return encode_call("step", ACTION, "r-1")
else:
    from json.encoder import c_make_encoder, encode_basestring_ascii

    def refuse(value):
        raise TypeError(f"{type(value).__name__} has no JSON form")

    encoder = c_make_encoder(None, refuse, encode_basestring_ascii, None, ":", ",",
                             False, False, False)

    def call(i):
        return "".join(encoder({"type": "step", "data": ACTION, "id": "r-1"}, 0))
for i in range(300):
    call(i)
marks = Marks(os.environ[MARKS_VAR])
gc.collect()
marks.start()
for i in range(calls):
    call(i)
marks.stop()
"""

VARIANTS = ("encode_call", "json C encoder, default= hook")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--base", default=None, help="another tree's src: its encode_call too")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE))
    from _callgrind import MARKS_VAR, build_marks, read_total, valgrind_argv

    marks = build_marks(HERE / "results" / ".callgrind")
    jobs = [(name, variant, str(ROOT / "src")) for name, variant in (
        ("encode_call", "encode_call"), ("json C encoder, default= hook", "c"))]
    if args.base:
        jobs.insert(1, ("encode_call, base tree", "encode_call", args.base))
    print(f"instructions per call (callgrind; windows of {args.calls} and "
          f"{3 * args.calls} calls, a process each), Python "
          f"{sys.version_info[0]}.{sys.version_info[1]}")
    per_call: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, variant, src in jobs:
            totals = []
            for n in (args.calls, 3 * args.calls):
                dump = Path(tmp) / f"callgrind.{len(per_call)}.{n}"
                subprocess.run([*valgrind_argv(dump), sys.executable, "-c", _CHILD, variant,
                                str(n), str(HERE)], check=True, cwd="/",
                               env={**os.environ, "PYTHONPATH": src, MARKS_VAR: str(marks),
                                    "PYTHONHASHSEED": "0"})
                totals.append(read_total(dump))
            per_call[name] = (totals[1] - totals[0]) / (2 * args.calls)
            print(f"  {name:<32}{per_call[name] / 1000:7.1f} k", flush=True)
    extra = per_call["json C encoder, default= hook"] - per_call["encode_call"]
    print(f"  the C encoder with a hook adds {extra / 1000:+.1f} k per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
