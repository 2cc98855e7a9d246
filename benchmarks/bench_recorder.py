"""Client CPU per step with and without a RolloutRecorder, interleaved.

Run from the repository root (any envlink virtualenv)::

    python benchmarks/bench_recorder.py [--sessions 1] [--steps 4000] [--rounds 7]
        [--episode-steps 100]

Starts envlink's reference server (echo environment) in a process of its own, then,
in this process, runs rounds of ``--steps`` steps per session over ``--sessions``
sessions stepped together on one event loop, alternately without and with a
recorder (the order rotating round by round). Each round opens its clients, resets,
and measures this process's CPU time (every thread: the recorder's writer included)
over the steps, the episodes' resets (every ``--episode-steps`` steps) and, with a
recorder, the flush that puts the last episode on disk. It prints CPU per step for
each variant (median and range over rounds) and the ratio with/without, computed
within each round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4000, help="steps per session per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--episode-steps", type=int, default=100)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
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
