"""Memory kept per step of one long episode, by recovery policy: this tree and another.

Run from the repository root (any envlink virtualenv)::

    python benchmarks/bench_journal.py [--base /path/to/other/checkout/src]
        [--policies raise,replay] [--warmup 2000] [--steps 20000]
    python benchmarks/bench_journal.py --record-frames 10000 [--base OTHER/src]

Starts envlink's reference server (echo environment), then, for each tree and policy,
a fresh client process that resets once, takes ``--warmup`` steps, and then measures
``--steps`` more steps of the same episode under ``tracemalloc``: the memory and the
allocated blocks still held at the end, per step (``max_journal_steps`` is raised
above the episode's length, so that the journal keeps every step it would keep).
Counts of bytes and blocks, not time: they do not depend on how busy the machine is.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import asyncio, gc, sys, tracemalloc
import envlink
policy, url, warmup, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
ACTION = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}

async def main():
    env = envlink.GenericEnvClient(url, on_session_lost=policy,
                                   max_journal_steps=warmup + steps + 1)
    try:
        await env.reset()
        for _ in range(warmup):
            await env.step(ACTION)
        gc.collect()
        tracemalloc.start()
        mem0, blocks0 = tracemalloc.get_traced_memory()[0], sys.getallocatedblocks()
        for _ in range(steps):
            await env.step(ACTION)
        gc.collect()
        mem1, blocks1 = tracemalloc.get_traced_memory()[0], sys.getallocatedblocks()
        tracemalloc.stop()
        kept = env.journal.step_count
    finally:
        await env.close()
    print((mem1 - mem0) / steps, (blocks1 - blocks0) / steps, kept)

asyncio.run(main())
"""


_COUNT_CHILD = r"""
import gc, json, os, sys
sys.path.insert(0, sys.argv[2])
from _callgrind import MARKS_VAR, Marks
from envlink._sansio.journal import EpisodeJournal
calls = int(sys.argv[1])
action = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}
# Fresh frames per call, as from the wire: a step's request and its observation.
sent = [json.dumps({"type": "step", "data": action, "id": f"r-{i}"}) for i in range(calls)]
received = [json.dumps({"type": "observation", "id": f"r-{i}", "data": {
    "observation": {"echoed_message": "hello", "step": i}, "reward": 0.0, "done": False}})
    for i in range(calls)]
journal = EpisodeJournal(max_steps=10 * calls + 1000)
for i in range(300):
    journal.record_frames(sent[i], received[i])
marks = Marks(os.environ[MARKS_VAR])
gc.collect()
marks.start()
record = journal.record_frames
for i in range(calls):
    record(sent[i], received[i])
marks.stop()
"""


def _record_frames_instructions(trees: dict[str, str], calls: int) -> int:
    """``--record-frames``: instructions per ``EpisodeJournal.record_frames`` call under
    callgrind (a window of ``calls`` and one of three times as many, a process each,
    into one journal: the collections the kept entries cause included)."""
    import tempfile

    here = Path(__file__).resolve().parent
    sys.path.insert(0, str(here))
    from _callgrind import MARKS_VAR, build_marks, read_total, valgrind_argv

    marks = build_marks(here / "results" / ".callgrind")
    print(f"EpisodeJournal.record_frames, instructions per call (callgrind; windows of "
          f"{calls} and {3 * calls} calls, a process each), Python "
          f"{sys.version_info[0]}.{sys.version_info[1]}")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src in trees.items():
            totals = []
            for n in (calls, 3 * calls):
                dump = Path(tmp) / f"callgrind.{name}.{n}"
                subprocess.run([*valgrind_argv(dump), sys.executable, "-c", _COUNT_CHILD,
                                str(n), str(here)], check=True, cwd="/",
                               env={**os.environ, "PYTHONPATH": src, MARKS_VAR: str(marks),
                                    "PYTHONHASHSEED": "0"})
                totals.append(read_total(dump))
            per_call = (totals[1] - totals[0]) / (2 * calls)
            print(f"  {name:5} {per_call / 1000:6.2f} k instructions per record_frames "
                  f"({src})", flush=True)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default=None, help="another tree's src directory")
    parser.add_argument("--policies", default="raise,replay")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--record-frames", type=int, default=None, metavar="CALLS",
                        help="instead: count EpisodeJournal.record_frames under callgrind "
                             "(windows of CALLS and 3 x CALLS calls; needs valgrind)")
    args = parser.parse_args()
    if args.record_frames is not None:
        trees = {"this": str(ROOT / "src")}
        if args.base:
            trees["base"] = args.base
        return _record_frames_instructions(trees, args.record_frames)
    server = subprocess.Popen([sys.executable, "-m", "envlink.server", "--port", "0",
                               "--env", "echo"], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
    trees = {"this": str(ROOT / "src")}
    if args.base:
        trees["base"] = args.base
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        url = line.rsplit(" ", 1)[-1].strip().replace("ws://", "http://")
        print(f"one session, {args.steps} steps after {args.warmup} warm-up steps, "
              f"Python {sys.version_info[0]}.{sys.version_info[1]}")
        for policy in args.policies.split(","):
            for name, src in trees.items():
                out = subprocess.run(
                    [sys.executable, "-c", _CHILD, policy, url, str(args.warmup),
                     str(args.steps)], env={**os.environ, "PYTHONPATH": src},
                    capture_output=True, text=True, cwd="/", check=True)
                per_step, blocks, kept = out.stdout.split()[-3:]
                print(f"  {policy:7} {name:5} {float(per_step):8.1f} B/step "
                      f"{float(blocks):6.2f} blocks/step  (journal: {kept} steps)")
    finally:
        server.terminate()
        server.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
