"""The client's own CPU per step, without the network: A/B of two source trees.

Run (from the repository root)::

    python3 benchmarks/bench_core.py [--rounds 7] [--steps 20000]
        [--mode async|sync|both] [--base /path/to/other/checkout/src]

Each round runs, in a fresh subprocess per tree, ``--steps`` sequential echo
steps of ``GenericEnvClient`` over an in-process connection that answers at once
(the answer is ready when ``recv`` is awaited: no socket, no event-loop
iteration for the answer). What is left is envlink's own per-step work:
deadline, queue turn, hooks (no SDK), encoding, decoding, journal, result. The
trees run interleaved (A B A B ...), so that a noisy machine shifts both alike;
the table gives the median CPU per step and the range, and the median of the
per-round ratios (this tree / base).

``--mode sync`` runs ``.sync()`` steps: the bridge hop (two cross-thread
wake-ups, the loop iterations of the hand-off) on top of the same work.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import asyncio, json, sys, time
from typing import Any

from envlink import GenericEnvClient
from envlink._sansio.protocol import Extensions

ACTION = {"type": "call_tool", "tool_name": "echo_message",
          "arguments": {"message": "hello"}}
OBS = json.dumps({"observation": {"echoed_message": "hello", "done": False,
                                  "reward": 0.0, "metadata": {}},
                  "reward": 0.0, "done": False, "metadata": {}})
HEAD, TAIL = '{"type":"observation","data":' + OBS + ',"id":"', '"}'


class Conn:
    def __init__(self) -> None:
        self.extensions = Extensions(version="1", session_token="t", session_id="s")
        self.answer = ""

    @property
    def is_open(self) -> bool:
        return True

    async def send(self, text: str) -> None:
        # The request id is the envelope's last string field before "type".
        start = text.index('"id":"') + 6
        self.answer = HEAD + text[start:text.index('"', start)] + TAIL

    async def recv(self) -> str:
        return self.answer

    async def probe(self, timeout: float) -> bool:
        return True

    async def take_buffered(self) -> None:
        return None

    async def close(self, timeout: float | None) -> None:
        pass

    def abort(self) -> None:
        pass


class Transport:
    async def connect(self, endpoint: Any, options: Any, *, headers: Any, timeout: Any,
                      offer_extensions: bool = True) -> Conn:
        return Conn()


mode, steps = sys.argv[1], int(sys.argv[2])
client = GenericEnvClient(base_url="http://bench.invalid", transport=Transport())
if mode == "async":
    async def main() -> float:
        await client.reset()
        for _ in range(2000):
            await client.step(ACTION)
        t0 = time.process_time()
        for _ in range(steps):
            await client.step(ACTION)
        cpu = time.process_time() - t0
        await client.close()
        return cpu
    cpu = asyncio.run(main())
else:
    env = client.sync()
    env.reset()
    for _ in range(2000):
        env.step(ACTION)
    t0 = time.process_time()
    for _ in range(steps):
        env.step(ACTION)
    cpu = time.process_time() - t0
    env.close()
print(json.dumps({"cpu_us": cpu / steps * 1e6}))
"""


def _one(src: str, mode: str, steps: int) -> float:
    env = dict(os.environ, PYTHONPATH=src)
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, str(steps)], env=env,
                         capture_output=True, text=True, check=True, cwd="/")
    return float(json.loads(out.stdout.strip().splitlines()[-1])["cpu_us"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--mode", choices=["async", "sync", "both"], default="both")
    parser.add_argument("--base", default=None,
                        help="the other tree's src directory (default: this tree only)")
    args = parser.parse_args()
    trees = {"this": str(ROOT / "src")}
    if args.base:
        trees["base"] = args.base
    modes = ["async", "sync"] if args.mode == "both" else [args.mode]
    for mode in modes:
        samples: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, src in trees.items():
                samples[name].append(_one(src, mode, args.steps))
        print(f"{mode}: client CPU per step (us), {args.rounds} rounds of {args.steps} steps")
        for name, values in samples.items():
            print(f"  {name:5} {statistics.median(values):7.1f} "
                  f"[{min(values):.1f}-{max(values):.1f}]")
        if "base" in samples:
            ratios: list[Any] = [a / b for a, b in zip(samples["this"], samples["base"],
                                                       strict=True)]
            print(f"  this/base {statistics.median(ratios):.3f} "
                  f"[{min(ratios):.3f}-{max(ratios):.3f}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
