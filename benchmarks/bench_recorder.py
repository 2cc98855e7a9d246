"""Client CPU per step with and without a RolloutRecorder, interleaved.

Run from the repository root (any envlink virtualenv)::

    python benchmarks/bench_recorder.py [--sessions 1] [--steps 4000] [--rounds 7]
        [--episode-steps 100]
    python benchmarks/bench_recorder.py --instructions [--sessions 200] [--steps 20]
        [--episode-steps 10]

Starts envlink's reference server (echo environment) in a process of its own, then,
in this process, runs rounds of ``--steps`` steps per session over ``--sessions``
sessions stepped together on one event loop, alternately without and with a
recorder (the order rotating round by round). Each round opens its clients, resets,
and measures this process's CPU time (every thread: the recorder's writer included)
over the steps, the episodes' resets (every ``--episode-steps`` steps) and, with a
recorder, the flush that puts the last episode on disk. It prints CPU per step for
each variant (median and range over rounds) and the ratio with/without, computed
within each round.

``--instructions`` counts instead of timing (valgrind's callgrind and a C compiler):
one client process without a recorder and one with, each under callgrind with its
threads apart, counted around the ``--steps`` steps per session (and the last flush)
only. It prints instructions per step of the client's thread and of every other
thread (the recorder's writer), and their ratio: figures that do not move with the
machine's load, where the timed ratio on a shared 2-core machine moves by more than
the recorder's cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
ACTION = {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}


async def one_round(url: str, sessions: int, steps: int, episode_steps: int,
                    recorder: Any) -> float:
    import envlink

    clients = [envlink.GenericEnvClient(url, recorder=recorder) for _ in range(sessions)]
    try:
        await asyncio.gather(*(c.reset() for c in clients))

        async def run(client: envlink.GenericEnvClient) -> None:
            for i in range(1, steps + 1):
                await client.step(ACTION)
                if i % episode_steps == 0:
                    await client.reset()

        start = time.process_time()
        await asyncio.gather(*(run(c) for c in clients))
        if recorder is not None:
            # Every recorded episode ended with the last reset: its writing counts.
            assert recorder.flush(30.0)
        return (time.process_time() - start) / (steps * sessions)
    finally:
        await asyncio.gather(*(c.close() for c in clients))


async def counted_round(url: str, sessions: int, steps: int, episode_steps: int,
                        recorder: Any) -> None:
    """``steps`` steps per session with callgrind counting (``--instructions`` child):
    a warm-up round first, not counted."""
    from _callgrind import MARKS_VAR, Marks

    import envlink

    marks = Marks(os.environ[MARKS_VAR])
    clients = [envlink.GenericEnvClient(url, recorder=recorder) for _ in range(sessions)]

    async def run(client: envlink.GenericEnvClient, count: int) -> None:
        for i in range(1, count + 1):
            await client.step(ACTION)
            if i % episode_steps == 0:
                await client.reset()

    try:
        await asyncio.gather(*(c.reset() for c in clients))
        await asyncio.gather(*(run(c, episode_steps) for c in clients))
        if recorder is not None:
            assert recorder.flush(60.0)
        marks.start()
        await asyncio.gather(*(run(c, steps) for c in clients))
        if recorder is not None:
            assert recorder.flush(60.0)
        marks.stop()
    finally:
        await asyncio.gather(*(c.close() for c in clients))


def instructions(args: argparse.Namespace) -> int:
    """Both variants under callgrind, each a process of its own; per-thread totals."""
    from _callgrind import MARKS_VAR, build_marks, read_total, valgrind_argv

    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    marks = build_marks(HERE / "results" / ".callgrind")
    server = subprocess.Popen(
        [sys.executable, "-m", "envlink.server", "--port", "0", "--env", "echo",
         "--max-sessions", str(max(args.sessions * 2, 16))],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    got: dict[str, tuple[float, float]] = {}
    try:
        assert server.stdout is not None
        url = server.stdout.readline().rsplit(" ", 1)[-1].strip().replace("ws://", "http://")
        with tempfile.TemporaryDirectory() as directory:
            for variant in ("off", "on"):
                dump = Path(directory) / f"{variant}.out"
                subprocess.run(
                    [*valgrind_argv(dump), "--separate-threads=yes", sys.executable,
                     __file__, "--child", variant, "--url", url, "--directory", directory,
                     "--sessions", str(args.sessions), "--steps", str(args.steps),
                     "--episode-steps", str(args.episode_steps)],
                    env={**os.environ, MARKS_VAR: str(marks)}, cwd=ROOT, check=True)
                parts = sorted(Path(directory).glob(f"{variant}.out-*"))
                main_thread = read_total(parts[0])  # -01: the thread that started
                others = sum(read_total(part) for part in parts[1:])
                count = args.sessions * args.steps
                got[variant] = (main_thread / count, others / count)
    finally:
        server.terminate()
        server.wait(10)
    (off_main, off_other), (on_main, on_other) = got["off"], got["on"]
    print(f"instructions per step (callgrind), {args.sessions} session(s), {args.steps} "
          f"steps each, an episode every {args.episode_steps} steps, Python "
          f"{sys.version_info[0]}.{sys.version_info[1]}")
    print(f"  recorder off: client thread {off_main / 1000:7.1f} k, other threads "
          f"{off_other / 1000:6.1f} k")
    print(f"  recorder on : client thread {on_main / 1000:7.1f} k, other threads "
          f"{on_other / 1000:6.1f} k (the writer)")
    print(f"  ratio on/off, every thread: "
          f"{(on_main + on_other) / (off_main + off_other):.3f}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4000, help="steps per session per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--episode-steps", type=int, default=100)
    parser.add_argument("--json", default=None, help="also write the figures here")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions under callgrind instead of timing")
    parser.add_argument("--child", choices=["off", "on"], help=argparse.SUPPRESS)
    parser.add_argument("--url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--directory", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import envlink

        recorder = (envlink.RolloutRecorder(Path(args.directory) / "rollouts")
                    if args.child == "on" else None)
        asyncio.run(counted_round(args.url, args.sessions, args.steps,
                                  args.episode_steps, recorder))
        return 0
    if args.instructions:
        return instructions(args)
    if args.steps % args.episode_steps:
        parser.error("--steps must be a multiple of --episode-steps")
    import envlink

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a socket per session
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))

    server = subprocess.Popen(
        [sys.executable, "-m", "envlink.server", "--port", "0", "--env", "echo",
         "--max-sessions", str(max(args.sessions * 2, 16))],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    samples: dict[str, list[float]] = {"off": [], "on": []}
    ratios: list[float] = []
    try:
        assert server.stdout is not None
        url = server.stdout.readline().rsplit(" ", 1)[-1].strip().replace("ws://", "http://")
        with tempfile.TemporaryDirectory() as directory:
            recorder = envlink.RolloutRecorder(directory)
            # A warm-up round of each, not counted.
            for variant in (None, recorder):
                asyncio.run(one_round(url, args.sessions, min(args.steps, 500),
                                      args.episode_steps, variant))
            for r in range(args.rounds):
                order = ["off", "on"] if r % 2 == 0 else ["on", "off"]
                got = {}
                for name in order:
                    got[name] = asyncio.run(one_round(
                        url, args.sessions, args.steps, args.episode_steps,
                        recorder if name == "on" else None))
                    samples[name].append(got[name])
                ratios.append(got["on"] / got["off"])
            written = recorder.stats
            recorder.close()
    finally:
        server.terminate()
        server.wait(10)
    print(f"{args.sessions} session(s), {args.steps} steps each per round, {args.rounds} "
          f"rounds, an episode every {args.episode_steps} steps, Python "
          f"{sys.version_info[0]}.{sys.version_info[1]}")
    for name, values in samples.items():
        print(f"  recorder {name:3}: client CPU per step {statistics.median(values) * 1e6:7.1f} us"
              f" (range {min(values) * 1e6:.1f}-{max(values) * 1e6:.1f})")
    print(f"  ratio on/off: median {statistics.median(ratios):.3f} "
          f"(range {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"  recorded: {written}")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "sessions": args.sessions, "steps": args.steps, "rounds": args.rounds,
            "cpu_per_step_us": {k: [v * 1e6 for v in vs] for k, vs in samples.items()},
            "ratio": {"median": statistics.median(ratios), "min": min(ratios),
                      "max": max(ratios)}, "recorded": written}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
