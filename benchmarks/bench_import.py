"""Import time of envlink, A/B between two source trees, interleaved; and where it goes.

Each sample is a fresh interpreter (the same Python for both trees, the tree put
first on ``PYTHONPATH``) timing one statement in-process (``perf_counter`` around
it) and as a whole process (spawn to exit, ``python -c pass`` included). Trees
alternate round by round in a rotating order; figures are the median [range]
over rounds, and the ratio is computed within each round::

    git archive <baseline-commit> src | tar -x -C /tmp/base
    python benchmarks/bench_import.py --baseline /tmp/base/src --rounds 21
    python benchmarks/bench_import.py --baseline /tmp/base/src --first-step

``--first-step`` times, instead of the import alone, what a script pays up to its
first answer: ``import envlink``, an ``EchoEnv`` (the transport), ``.sync()``
(the bridge), connect, ``reset()`` and one ``step()`` against ``envlink serve``
on loopback (started once, from this checkout, for both trees).

Bytecode: an installed envlink (``pip install``) imports from ``.pyc`` files
written at install time, while a checkout run with ``PYTHONDONTWRITEBYTECODE=1``
(as on the development machine) compiles every module from source on every
start. By default both trees are measured as installed: bytecode caching is on,
into a private ``PYTHONPYCACHEPREFIX`` (nothing is written into the trees), and
the untimed warm-up runs fill it. ``--from-source`` measures the other case
(``PYTHONDONTWRITEBYTECODE=1``: every module of a tree without ``__pycache__`` is
compiled at each start; site-packages keeps its own bytecode).

``--importtime N`` also runs ``python -X importtime`` N times per tree and prints
the median cumulative time of the slowest modules (what ``import envlink`` pulls
in, and what a change removed). Not part of the test run; standard library only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parents[1] / "src"

FIRST_STEP = """import envlink
with envlink.EchoEnv("{url}").sync() as env:
    env.reset()
    env.step(envlink.CallToolAction(tool_name="echo_message", arguments={{"message": "hi"}}))"""


#: The environment of every sample (set by main: bytecode caching on or off).
ENV: dict[str, str] = dict(os.environ)


def sample(python: str, src: str, stmt: str) -> tuple[float, float]:
    code = f"import time; t0 = time.perf_counter()\n{stmt}\nprint(time.perf_counter() - t0)"
    env = {**ENV, "PYTHONPATH": src}
    t0 = time.perf_counter()
    out = subprocess.run([python, "-c", code], check=True, cwd="/", env=env,
                         stdout=subprocess.PIPE, text=True).stdout
    return float(out.strip().splitlines()[-1]), time.perf_counter() - t0


def importtime(python: str, src: str, stmt: str) -> dict[str, tuple[int, int]]:
    env = {**ENV, "PYTHONPATH": src}
    err = subprocess.run([python, "-X", "importtime", "-c", stmt], check=True, cwd="/",
                         env=env, stderr=subprocess.PIPE, text=True).stderr
    found: dict[str, tuple[int, int]] = {}
    for line in err.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cum_us, name = line[len("import time:"):].split("|")
        found[name.strip()] = (int(self_us), int(cum_us))
    return found


def med_range(values: Sequence[float], scale: float = 1.0, digits: int = 3) -> str:
    f = f"{{:.{digits}f}}"
    return (f"{f.format(statistics.median(values) * scale)} "
            f"[{f.format(min(values) * scale)}-{f.format(max(values) * scale)}]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the baseline tree's src directory")
    parser.add_argument("--candidate", default=str(HERE), help="default: this checkout's src")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--stmt", default="import envlink")
    parser.add_argument("--first-step", action="store_true",
                        help="time import + connect + reset + step on a local server")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--importtime", type=int, default=0, metavar="N")
    parser.add_argument("--from-source", action="store_true",
                        help="no bytecode cache: compile every module at every start")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    trees = {"baseline": args.baseline, "candidate": args.candidate}
    cache = tempfile.TemporaryDirectory(prefix="bench-import-pycache-")
    if args.from_source:
        ENV["PYTHONDONTWRITEBYTECODE"] = "1"
        ENV.pop("PYTHONPYCACHEPREFIX", None)
    else:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
        ENV["PYTHONPYCACHEPREFIX"] = cache.name
    server = None
    if args.first_step:
        server = subprocess.Popen(
            [args.python, "-m", "envlink", "serve", "--port", "0"], cwd="/",
            env={**os.environ, "PYTHONPATH": args.candidate}, stdout=subprocess.PIPE, text=True)
        assert server.stdout is not None
        url = server.stdout.readline().split()[-1]  # "envlink serve: listening on ws://..."
        args.stmt = FIRST_STEP.format(url=url)
    try:
        run(args, trees)
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        cache.cleanup()


def run(args: argparse.Namespace, trees: dict[str, str]) -> None:

    inproc: dict[str, list[float]] = defaultdict(list)
    whole: dict[str, list[float]] = defaultdict(list)
    names = list(trees)
    for _ in range(2):  # warm the file cache of both trees
        for name in names:
            sample(args.python, trees[name], args.stmt)
    for r in range(args.rounds):
        for name in names[r % 2:] + names[:r % 2]:
            a, b = sample(args.python, trees[name], args.stmt)
            inproc[name].append(a)
            whole[name].append(b)
    print(f"statement: {args.stmt!r}  ({args.rounds} interleaved rounds, fresh interpreter each, "
          f"{'compiled from source each time' if args.from_source else 'bytecode cached'})")
    print(f"load average: {os.getloadavg()[0]:.2f}")
    for name in names:
        print(f"  {name:9s} in-process {med_range(inproc[name])} s   "
              f"whole process {med_range(whole[name])} s")
    ratio = [c / b for c, b in zip(inproc["candidate"], inproc["baseline"], strict=True)]
    wratio = [c / b for c, b in zip(whole["candidate"], whole["baseline"], strict=True)]
    print(f"  candidate / baseline: in-process {med_range(ratio, digits=2)}   "
          f"whole process {med_range(wratio, digits=2)}")

    if args.importtime:
        cum: dict[str, dict[str, list[int]]] = {n: defaultdict(list) for n in names}
        for _ in range(args.importtime):
            for name in names:
                for module, (_, c) in importtime(args.python, trees[name], args.stmt).items():
                    cum[name][module].append(c)
        print(f"\n-X importtime, median cumulative ms over {args.importtime} runs "
              "(- : not imported)")
        med = {n: {m: statistics.median(v) / 1000 for m, v in cum[n].items()} for n in names}
        top = sorted(set(med["baseline"]) | set(med["candidate"]),
                     key=lambda m: -max(med["baseline"].get(m, 0), med["candidate"].get(m, 0)))
        print(f"  {'module':45s} {'baseline':>9s} {'candidate':>9s}")
        for module in top[:args.top]:
            b, c = med["baseline"].get(module), med["candidate"].get(module)
            print(f"  {module:45s} {'-' if b is None else f'{b:.1f}':>9s} "
                  f"{'-' if c is None else f'{c:.1f}':>9s}")
        for name in names:
            print(f"  modules imported, {name}: {len(med[name])}")


if __name__ == "__main__":
    main()
