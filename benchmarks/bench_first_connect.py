"""What a script pays up to its first connection, under each ``on_session_lost`` policy.

Each sample is a fresh interpreter timing, in-process (``perf_counter``), ``import
envlink``, a ``GenericEnvClient(url, on_session_lost=POLICY).sync()`` and its
``connect()`` against a server on loopback (started once, from this checkout), and
the connect alone; it also reports whether httpx was imported and which recovery the
client chose. Policies alternate round by round in a rotating order; figures are the
median [range] over rounds, and each policy's ratio to ``"raise"`` is computed within
its round. No figure is asserted: the ratios are what to compare::

    python3 benchmarks/bench_first_connect.py                  # envlink's server
    python3 benchmarks/bench_first_connect.py --server openenv # OpenEnv 0.10's, if .venv-openenv
    python3 benchmarks/bench_first_connect.py --compare-src BASE/src  # before/after, one run

``--server openenv`` runs ``tests/interop/servers/echo_server.py`` in ``.venv-openenv``
(``bash .ci/openenv-venv.sh`` makes it), where ``"auto"`` must create an OpenEnv
detached session (``POST /mcp``) before its first upgrade. Bytecode is cached in a
private ``PYTHONPYCACHEPREFIX`` (filled by untimed warm-up runs), as an installed
envlink runs. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
POLICIES = ("raise", "replay", "resume", "auto")

SAMPLE = """import time
t0 = time.perf_counter()
import envlink
client = envlink.GenericEnvClient({url!r}, on_session_lost={policy!r}).sync()
t1 = time.perf_counter()
client.connect()
t2 = time.perf_counter()
import json, sys
print(json.dumps({{"total": t2 - t0, "connect": t2 - t1, "recovery": client.recovery,
                  "httpx": "httpx" in sys.modules}}))
client.close()
"""


def sample(python: str, env: dict[str, str], url: str, policy: str) -> dict[str, object]:
    out = subprocess.run([python, "-c", SAMPLE.format(url=url, policy=policy)], check=True,
                         cwd="/", env=env, stdout=subprocess.PIPE, text=True, timeout=120).stdout
    result: dict[str, object] = json.loads(out.strip().splitlines()[-1])
    return result


def med_range(values: Sequence[float], scale: float = 1.0, digits: int = 1) -> str:
    f = f"{{:.{digits}f}}"
    return (f"{f.format(statistics.median(values) * scale)} "
            f"[{f.format(min(values) * scale)}-{f.format(max(values) * scale)}]")


def start_server(kind: str, python: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    if kind == "envlink":
        argv = [python, "-m", "envlink", "serve", "--port", "0"]
        pattern = re.compile(r"listening on (\S+)")
    else:
        openenv = ROOT / ".venv-openenv" / "bin" / "python"
        if not openenv.exists():
            raise SystemExit("no .venv-openenv: run `bash .ci/openenv-venv.sh` first")
        argv = [str(openenv), str(ROOT / "tests/interop/servers/echo_server.py"), "--port", "0",
                "--max-sessions", "8"]
        pattern = re.compile(r"listening on (\S+)")
    server = subprocess.Popen(argv, cwd="/", env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
    assert server.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = server.stdout.readline()
        if not line:
            break
        found = pattern.search(line)
        if found:
            return server, found.group(1)
    server.kill()
    raise SystemExit(f"the {kind} server did not say where it listens")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--server", choices=["envlink", "openenv"], default="envlink")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="comma-separated; 'raise' is always measured (the baseline)")
    parser.add_argument("--src", default=str(SRC),
                        help="the envlink source tree the clients import (default: this "
                             "checkout's; e.g. a baseline from `git archive`)")
    parser.add_argument("--compare-src", default=None, metavar="OTHER/src",
                        help="also every policy with clients from this tree, interleaved in "
                             "the same rounds (rows marked [ref]): a before/after in one run")
    parser.add_argument("--json", metavar="PATH", help="also write the figures there")
    args = parser.parse_args()
    policies = ["raise", *[p for p in args.policies.split(",") if p and p != "raise"]]
    cache = tempfile.TemporaryDirectory(prefix="bench-first-connect-pycache-")
    env = {**os.environ, "PYTHONPATH": args.src, "PYTHONPYCACHEPREFIX": cache.name}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    trees = {"": env}
    if args.compare_src:
        trees[" [ref]"] = {**env, "PYTHONPATH": args.compare_src}
    # The server always runs from this checkout: only the clients' tree changes.
    server, url = start_server(args.server, args.python, {**env, "PYTHONPATH": str(SRC)})
    try:
        figures = run(args.python, trees, url, policies, args.rounds)
    finally:
        server.terminate()
        server.wait(10)
        cache.cleanup()
    print(f"clients from {args.src}" + (f"; [ref]: from {args.compare_src}"
                                        if args.compare_src else ""))
    print(f"server: {args.server} at {url}; {args.rounds} interleaved rounds, a fresh "
          f"interpreter per sample; load average {os.getloadavg()[0]:.2f}")
    print(f"  {'policy':14s} {'import + connect, ms':>26s} {'connect, ms':>22s} "
          f"{'/ raise':>18s}  recovery, httpx imported")
    for key, fig in figures.items():
        print(f"  {key:14s} {med_range(fig['total'], 1000):>26s} "
              f"{med_range(fig['connect'], 1000, 2):>22s} "
              f"{med_range(fig['ratio'], digits=2):>18s}  {fig['recovery']}, {fig['httpx']}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


def run(python: str, trees: dict[str, dict[str, str]], url: str, policies: list[str],
        rounds: int) -> dict[str, dict[str, object]]:
    """Every (tree, policy) once per round, in a rotating order; each ratio is to the
    same tree's ``"raise"`` in the same round."""
    variants = [(policy + mark, policy, mark) for mark in trees for policy in policies]
    totals: dict[str, list[float]] = defaultdict(list)
    connects: dict[str, list[float]] = defaultdict(list)
    seen: dict[str, dict[str, object]] = {}
    for _key, policy, mark in variants:  # untimed: fills the bytecode cache
        sample(python, trees[mark], url, policy)
    for r in range(rounds):
        shift = r % len(variants)
        for key, policy, mark in variants[shift:] + variants[:shift]:
            got = sample(python, trees[mark], url, policy)
            totals[key].append(float(got["total"]))  # type: ignore[arg-type]
            connects[key].append(float(got["connect"]))  # type: ignore[arg-type]
            seen[key] = {"recovery": got["recovery"], "httpx": got["httpx"]}
    return {key: {"total": totals[key], "connect": connects[key],
                  "ratio": [t / b for t, b in zip(totals[key], totals["raise" + mark],
                                                  strict=True)],
                  **seen[key]} for key, _policy, mark in variants}


if __name__ == "__main__":
    main()
