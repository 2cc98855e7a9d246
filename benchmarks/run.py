"""envlink's benchmarks in one command: a table on stdout, the figures in JSON.

Run from the repository root with any Python >= 3.10 (this script needs only the
standard library)::

    python3 benchmarks/run.py            # full run, about 10 minutes on 2 busy cores
    python3 benchmarks/run.py --quick    # fewer rounds and steps, about 3 minutes

It creates (or updates) two virtualenvs and runs every client in the one it
belongs to:

* ``.venv-bench``: envlink from this checkout (editable) with its ``otlp`` and
  ``prometheus`` extras, and anyio (for the bridge comparison);
* ``.venv-openenv``: the real ``openenv==0.10.*``, made by ``.ci/openenv-venv.sh``
  (the interop suite's virtualenv).

Sections:

1. **bridge**: a no-op call through envlink's bridge against
   ``asyncio.run_coroutine_threadsafe(...).result()`` and anyio's blocking
   portal, telemetry off and on (``bench_bridge.py``);
2. **steps**: sequential steps (p50, p99, steps/s, client CPU per step), sync
   and async, telemetry off and on, against the floor (a bare
   ``websockets.sync.client`` / ``websockets.asyncio.client`` doing the same
   JSON exchange), on envlink's reference server and on a real OpenEnv server;
3. **envlink vs OpenEnv's client** (0.10, in its own virtualenv) on the same two
   servers: the same runs as section 2, side by side;
4. **telemetry cost per call** on the sync step: no SDK; SDK with a batch span
   processor and a dropping exporter plus an in-memory metric reader (also with
   the exemplar filter off); the Prometheus reader; OTLP/HTTP to a local
   receiver (a separate process that decodes the protobuf);
5. **scale**: the client pinned to one core, echo servers one per other core; 10,
   100 and 1,000 sessions on one event loop (OpenEnv's client modules alone and its
   stock import, envlink, envlink with the SDK always on and 1 % sampled), and 8, 64
   and 256 threads each owning a sync client: steps/s, client CPU per step, p50/p99,
   memory per idle session, each server's busy share, ratios to OpenEnv's client in
   the same round (``--only scale-count``: the same client under ``callgrind
   --cache-sim=yes``, instructions and cache misses per step; ``--python 3.X``: on
   another interpreter); ``--only scale --transports``: OpenEnv's client (where its
   virtualenv has it), envlink on websockets and on picows, and the bare websockets
   and picows exchanges, each on asyncio's loop and on uvloop, in one run;
6. **import time** of ``import envlink`` and of OpenEnv's client, both from bytecode;
7. **fleet** (``--only fleet``): 8 processes x 32 sessions against two servers of 64,
   without and with ``FleetLimits``, against the 4 processes that fit
   (``bench_fleet.py``; ``--quick``: 4 x 8 against one server of 16).

Every client is its own process (so its CPU time is its own: the bridge's loop
thread and the SDK's export threads count, the server does not), and the
servers are processes too. Variants are interleaved round by round in a
rotating order; each figure is the median over rounds with its range, and each
ratio is computed within a round against a baseline of the same round, then
summarised the same way. Absolute figures depend on the machine and on how busy
it is; the ratios are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import select
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DRIVER = HERE / "_driver.py"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from tests.interop._interop_support import ServerProcess, openenv_server  # noqa: E402

REPLY_DEADLINE = 600.0
LOG_DIR = ROOT / "benchmarks" / "results" / "logs"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ virtualenvs


def _pip_quiet(python: str, *args: str) -> None:
    proc = subprocess.run([python, "-m", "pip", "install", "-q", *args], cwd=ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if proc.returncode != 0:
        lines = [ln for ln in proc.stdout.splitlines() if "WARNING: Location" not in ln]
        raise SystemExit(f"pip install {' '.join(args)} failed:\n" + "\n".join(lines[-30:]))


def envlink_venv(path: Path, base_python: str) -> str:
    """``.venv-bench``: envlink (editable) with its exporters, and anyio."""
    python = path / "bin" / "python"
    if not python.exists():
        log(f"creating {path}")
        subprocess.run([base_python, "-m", "venv", str(path)], check=True)
    log(f"installing envlink[fast,otlp,prometheus] and anyio into {path}")
    _pip_quiet(str(python), "-e", ".[fast,otlp,prometheus]", "anyio")
    return str(python)


def openenv_venv(path: Path, base_python: str) -> str:
    """``.venv-openenv`` through ``.ci/openenv-venv.sh`` (shared with the interop suite)."""
    log(f"creating/updating {path} with .ci/openenv-venv.sh")
    proc = subprocess.run(["bash", str(ROOT / ".ci" / "openenv-venv.sh")], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "OPENENV_VENV": str(path),
                               "ENVLINK_PYTHON": base_python})
    if proc.returncode != 0:
        raise SystemExit(".ci/openenv-venv.sh failed")
    return proc.stdout.strip().splitlines()[-1]


# ------------------------------------------------------------------ processes


class Driver:
    """A ``_driver.py`` process: one client, commands in, JSON lines out."""

    def __init__(self, name: str, python: str, argv: Sequence[str], *,
                 prefix: Sequence[str] = (), env: dict[str, str] | None = None,
                 deadline: float = REPLY_DEADLINE) -> None:
        self.name = name
        self.deadline = deadline
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        self.stderr_path = LOG_DIR / ("driver-" + re.sub(r"[^A-Za-z0-9.+-]+", "_", name)
                                      + ".stderr")
        self._stderr = open(self.stderr_path, "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([*prefix, python, str(DRIVER), *argv], cwd=ROOT,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self._stderr,
                                     env=None if env is None else {**os.environ, **env})
        self.ready = self._reply()

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], self.deadline)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            err = self.stderr_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"driver {self.name!r} gave no answer\n{err}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return self._reply()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.write(b'{"op": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=self.deadline)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._stderr.close()


def envlink_server(python: str, *, max_sessions: int, name: str,
                   cpu: int | None = None) -> ServerProcess:
    argv = [python, "-m", "envlink.server", "--port", "0", "--env", "echo",
            "--max-sessions", str(max_sessions)]
    if cpu is not None:  # pinned to one core from its start (its threads too)
        argv = ["taskset", "-c", str(cpu), *argv]
    return ServerProcess(argv, name=name, log_dir=LOG_DIR)


# ------------------------------------------------------------------ statistics


def med_range(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(stat: dict[str, float] | None, digits: int = 0, width: int = 0) -> str:
    if stat is None:
        return "-".rjust(width)
    f = f"{{:.{digits}f}}"
    text = f"{f.format(stat['median'])} [{f.format(stat['min'])}-{f.format(stat['max'])}]"
    return text.rjust(width)


def interleave(names: Sequence[str], rounds: int, run: Callable[[str], dict[str, Any]],
               ) -> dict[str, list[dict[str, Any]]]:
    """Run every variant once per round, in an order rotating by round."""
    out: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(rounds):
        order = list(names[r % len(names):]) + list(names[:r % len(names)])
        for name in order:
            out[name].append(run(name))
        log(f"  round {r + 1}/{rounds} done")
    return out


def summarise(samples: dict[str, list[dict[str, Any]]], baselines: dict[str, str],
              ) -> dict[str, dict[str, Any]]:
    """Median/range per metric, and per-round ratios against named baselines."""
    metrics = ("p50_us", "p99_us", "steps_per_s", "cpu_us_per_step")
    out: dict[str, dict[str, Any]] = {}
    for name, rows in samples.items():
        entry: dict[str, Any] = {m: med_range([row[m] for row in rows]) for m in metrics}
        for label, base in baselines.items():
            if base not in samples or base == name:
                continue
            brows = samples[base]
            for m in ("p50_us", "cpu_us_per_step"):
                entry[f"{m}_x_{label}"] = med_range(
                    [row[m] / b[m] for row, b in zip(rows, brows, strict=True)])
            entry[f"cpu_us_added_vs_{label}"] = med_range(
                [row["cpu_us_per_step"] - b["cpu_us_per_step"]
                 for row, b in zip(rows, brows, strict=True)])
        out[name] = entry
    return out


# ------------------------------------------------------------------ sections


def section_recorder(python: str, quick: bool) -> dict[str, Any]:
    """A RolloutRecorder's cost: client CPU per step with and without, interleaved, at
    one session and at 1,000 stepped together (bench_recorder.py)."""
    log("section: recorder")
    result: dict[str, Any] = {}
    for sessions, steps in ((1, 2000 if quick else 4000), (1000, 10 if quick else 30)):
        out_json = LOG_DIR / f"recorder-{sessions}.json"
        subprocess.run([python, str(HERE / "bench_recorder.py"), "--sessions", str(sessions),
                        "--steps", str(steps), "--rounds", "3" if quick else "5",
                        "--episode-steps", "100" if sessions == 1 else "10",
                        "--json", str(out_json)], cwd=ROOT, check=True, stdout=sys.stderr)
        result[str(sessions)] = json.loads(out_json.read_text())
    return result


def section_fleet(python: str, quick: bool) -> dict[str, Any]:
    """The fleet's shared limits: 8 processes x 32 sessions (EnvPool, 4 episodes of 10
    steps) against two servers of 64 sessions, without and with FleetLimits, against the
    4 processes that fit (bench_fleet.py; --quick: 4 x 8 against one server of 16)."""
    log("section: fleet")
    out_json = LOG_DIR / "fleet.json"
    subprocess.run([python, str(HERE / "bench_fleet.py"), *(["--quick"] if quick else []),
                    "--json", str(out_json)], cwd=ROOT, check=True, stdout=sys.stderr)
    rows = json.loads(out_json.read_text())["rows"]
    for r in rows:
        print(f"fleet, {r['variant']} ({r['processes']} processes): "
              f"{r['vs_fit']['median']:.2f}x the steps/s of those that fit, "
              f"{r['refused']} refused session opens, slowest/median "
              f"{r['slowest_over_median']:.2f}")
    return {"rows": rows}


def section_bridge(python: str, quick: bool) -> dict[str, Any]:
    log("section 1: bridge")
    out_json = LOG_DIR / "bridge.json"
    rounds, calls = (7, 1000) if quick else (11, 2000)
    subprocess.run([python, str(HERE / "bench_bridge.py"), "--rounds", str(rounds),
                    "--calls", str(calls), "--json", str(out_json)],
                   cwd=ROOT, check=True, stdout=sys.stderr)
    result: dict[str, Any] = json.loads(out_json.read_text())
    return result


STEP_VARIANTS: dict[str, tuple[str, str, str]] = {
    # name: (client, mode, telemetry)
    "floor sync (websockets.sync)": ("floor", "sync", "off"),
    "floor async (websockets.asyncio)": ("floor", "async", "off"),
    "openenv sync": ("openenv", "sync", "off"),
    "openenv async": ("openenv", "async", "off"),
    "envlink sync": ("envlink", "sync", "off"),
    "envlink async": ("envlink", "async", "off"),
    "envlink sync +SDK": ("envlink", "sync", "sdk"),
    "envlink async +SDK": ("envlink", "async", "sdk"),
}
TELEMETRY_VARIANTS: dict[str, tuple[str, str, str]] = {
    "envlink sync +SDK, nested spans": ("envlink", "sync", "sdk-nested"),
    "envlink sync +SDK, SDK-default exemplars": ("envlink", "sync", "sdk-exemplars"),
    "envlink sync +SDK, traces sampled 1/10": ("envlink", "sync", "sdk-sampled"),
    "envlink sync +Prometheus": ("envlink", "sync", "prometheus"),
    "envlink sync +OTLP/HTTP": ("envlink", "sync", "otlp"),
}


def section_steps(server_kind: str, pythons: dict[str, str], quick: bool,
                  ) -> dict[str, Any]:
    log(f"sections 2-4: steps on the {server_kind} server")
    variants = dict(STEP_VARIANTS)
    if server_kind == "envlink":
        variants.update(TELEMETRY_VARIANTS)
    rounds, steps = (3, 200) if quick else (5, 600)
    if server_kind == "openenv":
        server = openenv_server("echo", pythons["openenv"], LOG_DIR,
                                max_sessions=len(variants) + 2, name="openenv-echo")
    else:
        server = envlink_server(pythons["envlink"], max_sessions=64, name="envlink-echo")
    receiver: ServerProcess | None = None
    drivers: dict[str, Driver] = {}
    try:
        server.start()
        url = server.base_url
        otlp: list[str] = []
        if any(tel == "otlp" for _, _, tel in variants.values()):
            receiver = ServerProcess(
                [pythons["envlink"], str(ROOT / "tests" / "telemetry" / "_otlp_receiver.py")],
                name="otlp-receiver", log_dir=LOG_DIR)
            receiver.start()
            otlp = ["--otlp-endpoint", receiver.base_url]
        for name, (client, mode, tel) in variants.items():
            python = pythons["openenv"] if client == "openenv" else pythons["envlink"]
            drivers[name] = Driver(f"{server_kind}-{name}", python,
                                   ["--client", client, "--mode", mode, "--telemetry", tel,
                                    "--url", url, *(otlp if tel == "otlp" else [])])
        samples = interleave(list(variants), rounds, lambda n: drivers[n].ask(op="steps", n=steps))
    finally:
        for d in drivers.values():
            d.stop()
        if receiver is not None:
            receiver.stop()
        server.stop()
    baselines = {"floor": "floor sync (websockets.sync)", "openenv_sync": "openenv sync",
                 "openenv_async": "openenv async", "envlink_sync_nosdk": "envlink sync",
                 "envlink_async_nosdk": "envlink async"}
    return {"rounds": rounds, "steps_per_round": steps,
            "variants": summarise(samples, baselines), "raw": samples}


SCALE_LEVELS = (10, 100, 1000)
THREAD_LEVELS = (8, 64, 256)
#: name: (client, telemetry). The first is the baseline of every ratio.
SCALE_VARIANTS: dict[str, tuple[str, str]] = {
    "openenv": ("openenv", "off"),  # OpenEnv's client modules alone (the strict comparison)
    "openenv, stock import": ("openenv-stock", "off"),  # from openenv.core import ...
    "envlink": ("envlink", "off"),
    "envlink +SDK": ("envlink", "sdk"),
    "envlink +SDK, 1% sampled": ("envlink", "sdk-sampled-1pct"),
}
THREAD_VARIANTS: dict[str, tuple[str, str]] = {
    "openenv": ("openenv", "off"),
    "envlink": ("envlink", "off"),
}


def scale_cores() -> tuple[int, list[int]]:
    """The client's core and the servers' cores: one each on 2 cores, else one per core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return cores[0], cores
    return cores[0], cores[1:]


def _scale_entry(rows: list[dict[str, Any]]) -> dict[str, Any]:
    entry: dict[str, Any] = {m: med_range([r[m] for r in rows])
                             for m in ("steps_per_s", "cpu_us_per_step", "p50_us", "p99_us",
                                       "server_cpu_us_per_step")}
    for m in ("gc_per_kstep", "blocks_kept_per_step"):
        if m in rows[0]:
            entry[m] = med_range([r[m] for r in rows])
    # Each server's share of one core while the client stepped: well below 1, the
    # client sets the pace (the servers wait for it).
    entry["server_busy"] = [med_range(list(b)) for b in zip(*(r["server_busy"] for r in rows),
                                                          strict=True)]
    idle = [r["idle_bytes_per_session"] for r in rows if "idle_bytes_per_session" in r]
    entry["idle_kib_per_session"] = idle[0] / 1024 if idle else None
    return entry


def _ratios(samples: dict[str, list[dict[str, Any]]], base: str) -> dict[str, dict[str, Any]]:
    """Per variant, per round: CPU per step and steps/s against ``base`` in that round."""
    out: dict[str, dict[str, Any]] = {}
    for name, rows in samples.items():
        if name == base:
            continue
        pairs = list(zip(rows, samples[base], strict=True))
        out[name] = {
            "cpu_x": med_range([a["cpu_us_per_step"] / b["cpu_us_per_step"] for a, b in pairs]),
            "steps_per_s_x": med_range([a["steps_per_s"] / b["steps_per_s"] for a, b in pairs]),
        }
    return out


def section_scale(pythons: dict[str, str], quick: bool,
                  compare_src: str | None = None) -> dict[str, Any]:
    """Sessions on one loop, and threads each owning a sync client, client-bound.

    The client is pinned to one core and the servers to the others (one server per
    core), so the servers can keep up with the one core the client has: each
    server's busy share is reported to show it.
    """
    log("section 5: scale (sessions on one event loop; threads with sync clients)")
    rounds = 3 if quick else 5
    total_steps = 3000 if quick else 10000
    client_core, server_cores = scale_cores()
    # Every variant keeps its sessions open between its rounds.
    variant_count = len(SCALE_VARIANTS) + (3 if compare_src else 0)
    servers = [envlink_server(pythons["envlink"],
                              max_sessions=variant_count * max(SCALE_LEVELS) + 50,
                              name=f"envlink-scale-{core}", cpu=core)
               for core in server_cores]
    drivers: dict[str, Driver] = {}
    results: dict[str, Any] = {"rounds": rounds, "steps_per_run": total_steps,
                               "client_core": client_core, "server_cores": server_cores,
                               "levels": {}, "threads": {}}
    try:
        for srv in servers:
            srv.start()
        pids = [srv.proc.pid for srv in servers if srv.proc is not None]
        urls = ",".join(srv.base_url for srv in servers)
        pin = ["--cpu", str(client_core)]
        variants: dict[str, tuple[str, str, dict[str, str] | None]] = {
            name: (client, tel, None) for name, (client, tel) in SCALE_VARIANTS.items()}
        if compare_src:  # envlink's rows again, with envlink imported from another tree
            for name, (client, tel) in SCALE_VARIANTS.items():
                if client == "envlink":
                    variants[f"{name} [ref]"] = (client, tel, {"PYTHONPATH": compare_src})
        for name, (client, tel, env) in variants.items():
            python = pythons["envlink" if client == "envlink" else "openenv"]
            drivers[name] = Driver(f"scale-{_slug(name)}", python,
                                   ["--client", client, "--mode", "scale", "--telemetry", tel,
                                    "--url", urls, *pin], env=env)
        for level in SCALE_LEVELS:
            per = max(2, total_steps // level)
            log(f"  {level} sessions, {per} steps each")
            samples = interleave(list(drivers), rounds,
                                 lambda c, level=level, per=per: drivers[c].ask(  # type: ignore[misc]
                                     op="scale", sessions=level, steps=per, server_pids=pids))
            level_out: dict[str, Any] = {n: _scale_entry(rows) for n, rows in samples.items()}
            level_out["ratios"] = _ratios(samples, "openenv")
            sdk, sampled, plain = (samples["envlink +SDK"], samples["envlink +SDK, 1% sampled"],
                                   samples["envlink"])
            level_out["sdk_cpu_x_envlink"] = med_range(
                [a["cpu_us_per_step"] / b["cpu_us_per_step"]
                 for a, b in zip(sdk, plain, strict=True)])
            level_out["sampled_cpu_x_envlink"] = med_range(
                [a["cpu_us_per_step"] / b["cpu_us_per_step"]
                 for a, b in zip(sampled, plain, strict=True)])
            if compare_src:
                ref = {n: samples[f"{n} [ref]"] for n in
                       ("envlink", "envlink +SDK", "envlink +SDK, 1% sampled")}
                level_out["ref_sdk_cpu_x_envlink"] = med_range(
                    [a["cpu_us_per_step"] / b["cpu_us_per_step"]
                     for a, b in zip(ref["envlink +SDK"], ref["envlink"], strict=True)])
                level_out["ref_sampled_cpu_x_envlink"] = med_range(
                    [a["cpu_us_per_step"] / b["cpu_us_per_step"] for a, b in
                     zip(ref["envlink +SDK, 1% sampled"], ref["envlink"], strict=True)])
            results["levels"][str(level)] = level_out
        for d in drivers.values():
            d.stop()
        drivers = {}
        for name, (client, _tel) in THREAD_VARIANTS.items():
            python = pythons["envlink" if client == "envlink" else "openenv"]
            drivers[name] = Driver(f"threads-{name}", python,
                                   ["--client", client, "--mode", "threads", "--url", urls, *pin])
        for threads in THREAD_LEVELS:
            per = max(2, (total_steps // 2) // threads)
            log(f"  {threads} threads with a sync client each, {per} steps each")
            samples = interleave(list(drivers), rounds,
                                 lambda c, t=threads, per=per: drivers[c].ask(  # type: ignore[misc]
                                     op="run", threads=t, steps=per, server_pids=pids))
            t_out: dict[str, Any] = {n: _scale_entry(rows) for n, rows in samples.items()}
            t_out["ratios"] = _ratios(samples, "openenv")
            results["threads"][str(threads)] = t_out
    finally:
        for d in drivers.values():
            d.stop()
        for srv in servers:
            srv.stop()
    return results


#: ``--only scale --transports``: each client on each loop, in one interleaved run.
#: name: (driver --client, its python: envlink's or OpenEnv's, ENVLINK_TRANSPORT, --loop).
TRANSPORT_ARMS: dict[str, tuple[str, str, str | None, str]] = {
    "openenv": ("openenv", "openenv", None, "asyncio"),
    "openenv, uvloop": ("openenv", "openenv", None, "uvloop"),
    "envlink websockets": ("envlink", "envlink", "websockets", "asyncio"),
    "envlink websockets, uvloop": ("envlink", "envlink", "websockets", "uvloop"),
    "envlink picows": ("envlink", "envlink", "picows", "asyncio"),
    "envlink picows, uvloop": ("envlink", "envlink", "picows", "uvloop"),
    "floor websockets": ("floor", "envlink", None, "asyncio"),
    "floor websockets, uvloop": ("floor", "envlink", None, "uvloop"),
    "floor picows": ("floor-picows", "envlink", None, "asyncio"),
    "floor picows, uvloop": ("floor-picows", "envlink", None, "uvloop"),
}


def _imports(python: str, *modules: str) -> bool:
    if not Path(python).exists():
        return False
    code = "; ".join(f"import {m}" for m in modules)
    return subprocess.run([python, "-c", code], capture_output=True, check=False,
                          cwd=ROOT).returncode == 0


def section_scale_transports(pythons: dict[str, str], quick: bool) -> dict[str, Any]:
    """Client CPU per step at 10, 100 and 1,000 sessions on one loop, steps/s and memory
    per idle session, for every arm of :data:`TRANSPORT_ARMS` in one interleaved run.

    OpenEnv's client is measured when its virtualenv has it (else its arms are left out
    and the ratios are against envlink on websockets); the uvloop arms need uvloop in
    the arm's virtualenv, picows's need picows.
    """
    log("section 5t: scale by transport and loop")
    rounds = 3 if quick else 5
    total_steps = 3000 if quick else 10000
    client_core, server_cores = scale_cores()
    missing: list[str] = []
    arms: dict[str, tuple[str, str, str | None, str]] = {}
    for name, arm in TRANSPORT_ARMS.items():
        client, which, transport, loop = arm
        needs = ["openenv"] if which == "openenv" else ["envlink"]
        if loop == "uvloop":
            needs.append("uvloop")
        if transport == "picows" or client == "floor-picows":
            needs.append("picows")
        if _imports(pythons[which], *needs):
            arms[name] = arm
        else:
            missing.append(f"{name} ({', '.join(needs)} not importable by {pythons[which]})")
    base = "openenv" if "openenv" in arms else "envlink websockets"
    servers = [envlink_server(pythons["envlink"],
                              max_sessions=len(arms) * max(SCALE_LEVELS) + 50,
                              name=f"envlink-scale-{core}", cpu=core)
               for core in server_cores]
    drivers: dict[str, Driver] = {}
    results: dict[str, Any] = {"rounds": rounds, "steps_per_run": total_steps,
                               "client_core": client_core, "server_cores": server_cores,
                               "baseline": base, "arms": list(arms), "missing": missing,
                               "levels": {}}
    try:
        for srv in servers:
            srv.start()
        pids = [srv.proc.pid for srv in servers if srv.proc is not None]
        urls = ",".join(srv.base_url for srv in servers)
        for name, (client, which, transport, loop) in arms.items():
            env = {"ENVLINK_TRANSPORT": transport} if transport else None
            drivers[name] = Driver(f"scale-t-{_slug(name)}", pythons[which],
                                   ["--client", client, "--mode", "scale", "--loop", loop,
                                    "--url", urls, "--cpu", str(client_core)], env=env)
        for level in SCALE_LEVELS:
            per = max(2, total_steps // level)
            log(f"  {level} sessions, {per} steps each")
            samples = interleave(list(drivers), rounds,
                                 lambda c, level=level, per=per: drivers[c].ask(  # type: ignore[misc]
                                     op="scale", sessions=level, steps=per, server_pids=pids))
            level_out: dict[str, Any] = {n: _scale_entry(rows) for n, rows in samples.items()}
            level_out["ratios"] = _ratios(samples, base)
            results["levels"][str(level)] = level_out
    finally:
        for d in drivers.values():
            d.stop()
        for srv in servers:
            srv.stop()
    return results


def section_scale_count(pythons: dict[str, str], quick: bool, repeats: int) -> dict[str, Any]:
    """Instructions and simulated cache misses per step of a client stepping many sessions.

    The client runs under ``callgrind --cache-sim=yes``, about fifty times slower than
    on its own, so the server has every answer ready when the client's loop looks;
    past the first round the sessions still interleave as their answers arrive, so
    two runs differ by several per cent (``docs/performance.md``: where the
    instructions and cache misses go, not small differences). Two windows (K1 and
    K2 rounds of all sessions), each a process; per step = (N2 - N1) / ((K2 - K1) *
    sessions).
    """
    import shutil

    from _callgrind import MARKS_VAR, build_marks, read_events, valgrind_argv

    if shutil.which("valgrind") is None:
        raise SystemExit("--scale-count needs valgrind (Debian: apt-get install valgrind)")
    log("section 5b: scale, counted under callgrind with the cache simulator")
    marks = build_marks(ROOT / "benchmarks" / "results" / ".callgrind")
    sessions = 100 if quick else 1000
    windows = (1, 2) if quick else (1, 3)
    client_core, server_cores = scale_cores()
    server = envlink_server(pythons["envlink"], max_sessions=2 * sessions + 10,
                            name="envlink-scale-count", cpu=server_cores[0])
    out: dict[str, Any] = {"sessions": sessions, "windows": list(windows), "repeats": repeats,
                           "variants": {}}
    try:
        server.start(deadline=600.0)
        for rep in range(repeats):
            for name in ("openenv", "envlink"):
                python = pythons["envlink" if name == "envlink" else "openenv"]
                counts = []
                for k in windows:
                    dump = (HERE / "results" / "callgrind" / "scale" /
                            f"{name}-{sessions}-r{rep + 1}" / f"callgrind.out.{k}")
                    dump.parent.mkdir(parents=True, exist_ok=True)
                    dump.unlink(missing_ok=True)
                    driver = Driver(f"scale-count-{name}-{k}", python,
                                    ["--client", name, "--mode", "scale", "--url",
                                     server.base_url, "--cpu", str(client_core)],
                                    prefix=valgrind_argv(dump, cache_sim=True),
                                    env={MARKS_VAR: str(marks), "PYTHONHASHSEED": "0",
                                         "PYTHONWARNINGS": "ignore"},
                                    deadline=INSTR_DEADLINE)
                    try:
                        reply = driver.ask(op="count", sessions=sessions, steps=k)
                    finally:
                        driver.stop()
                    if not reply.get("on_valgrind"):
                        raise RuntimeError(f"{name}: the client did not run under valgrind")
                    counts.append(read_events(dump))
                per = {ev: (counts[1][ev] - counts[0][ev]) / ((windows[1] - windows[0]) * sessions)
                       for ev in counts[0]}
                log(f"  {name} run {rep + 1}: {per.get('Ir', 0) / 1000:.1f} k instructions/step")
                out["variants"].setdefault(name, []).append(per)
    finally:
        server.stop()
    for name, runs in out["variants"].items():
        out.setdefault("per_step", {})[name] = {
            ev: {"median": statistics.median(r[ev] for r in runs),
                 "spread": (max(r[ev] for r in runs) - min(r[ev] for r in runs))
                 / max(1.0, min(r[ev] for r in runs))}
            for ev in runs[0]}
    if {"openenv", "envlink"} <= set(out.get("per_step", {})):
        e, o = out["per_step"]["envlink"], out["per_step"]["openenv"]
        out["envlink_x_openenv"] = {ev: e[ev]["median"] / o[ev]["median"]
                                    for ev in e if o[ev]["median"]}
    return out


IMPORTS = {
    "python -c pass": ("envlink", "pass"),
    "import envlink": ("envlink", "import envlink"),
    "from openenv.core import GenericEnvClient": (
        "openenv", "from openenv.core import GenericEnvClient"),
}


def section_imports(pythons: dict[str, str], quick: bool) -> dict[str, Any]:
    log("section 6: import time")
    rounds = 5 if quick else 7
    # Both clients as installed packages: from bytecode. With PYTHONDONTWRITEBYTECODE=1
    # the editable envlink would be compiled from source at every start while OpenEnv's
    # site-packages has its .pyc files; a private cache, filled by one untimed run of
    # each, puts both on the same footing (and writes nothing into the checkout).
    cache = tempfile.TemporaryDirectory(prefix="envlink-bench-pycache-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = cache.name

    def run(name: str) -> dict[str, Any]:
        which, stmt = IMPORTS[name]
        code = ("import time; t0 = time.perf_counter()\n" + stmt +
                "\nprint(time.perf_counter() - t0)")
        t0 = time.perf_counter()
        out = subprocess.run([pythons[which], "-c", code], check=True, cwd="/", env=env,
                             stdout=subprocess.PIPE, text=True).stdout
        return {"in_process_s": float(out.strip()), "process_s": time.perf_counter() - t0}

    with cache:
        for name in IMPORTS:
            run(name)  # fills the bytecode cache
        samples = interleave(list(IMPORTS), rounds, run)
    res = {name: {k: med_range([r[k] for r in rows]) for k in ("in_process_s", "process_s")}
           for name, rows in samples.items()}
    res["envlink_x_openenv"] = med_range(
        [a["in_process_s"] / b["in_process_s"] for a, b in zip(
            samples["import envlink"], samples["from openenv.core import GenericEnvClient"],
            strict=True)])
    return res


# ------------------------------------------------------------------ instructions

#: How long a client under valgrind may take to answer (its imports run under valgrind).
INSTR_DEADLINE = 3600.0
#: name: (client, mode, telemetry); the server-independent ones run once per Python.
INSTR_STEP_VARIANTS: dict[str, tuple[str, str, str]] = {
    "floor sync (websockets.sync)": ("floor", "sync", "off"),
    "floor async (websockets.asyncio)": ("floor", "async", "off"),
    "openenv sync": ("openenv", "sync", "off"),
    "openenv async": ("openenv", "async", "off"),
    "envlink sync": ("envlink", "sync", "off"),
    "envlink async": ("envlink", "async", "off"),
    "envlink sync +SDK": ("envlink", "sync", "sdk"),
    "envlink async +SDK": ("envlink", "async", "sdk"),
    # --clients sampled: configure(trace_sample_ratio=0.01).
    "envlink sync +SDK 1 %": ("envlink", "sync", "sdk-sampled-1pct"),
    "envlink async +SDK 1 %": ("envlink", "async", "sdk-sampled-1pct"),
}
INSTR_BRIDGE_VARIANTS: dict[str, tuple[str, str, str]] = {
    "run_coroutine_threadsafe": ("rcts", "sync", "off"),
    "envlink Bridge.call": ("bridge", "sync", "off"),
}
#: ratio name: (numerator, denominator), within one server (or the bridge pair).
INSTR_RATIOS: dict[str, tuple[str, str]] = {
    "envlink async / openenv async": ("envlink async", "openenv async"),
    "envlink sync / openenv sync": ("envlink sync", "openenv sync"),
    "envlink sync +SDK / envlink sync": ("envlink sync +SDK", "envlink sync"),
    "envlink async +SDK / envlink async": ("envlink async +SDK", "envlink async"),
    "envlink sync +SDK 1 % / envlink sync": ("envlink sync +SDK 1 %", "envlink sync"),
    "envlink async +SDK 1 % / envlink async": ("envlink async +SDK 1 %", "envlink async"),
    "floor sync / openenv sync": ("floor sync (websockets.sync)", "openenv sync"),
    "floor async / openenv async": ("floor async (websockets.asyncio)", "openenv async"),
}
#: Two counts of the same variant must agree this closely (relative spread).
AGREEMENT = 0.01
INSTR_TARGETS: dict[str, float] = {
    "envlink async / openenv async": 0.95,
    "envlink sync / openenv sync": 0.80,
    "envlink sync +SDK / envlink sync": 1.50,
}


def _python_version(python: str) -> str:
    return subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          check=True, stdout=subprocess.PIPE, text=True).stdout.strip()


def _runs_as(python: str, minor: str) -> bool:
    """Whether ``python`` starts and is version ``minor``."""
    try:
        done = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == minor


def find_pythons(wanted: str) -> dict[str, str]:
    """Base interpreters by minor version: this one, then python3.X on PATH or in pyenv."""
    import shutil

    found = {f"{sys.version_info[0]}.{sys.version_info[1]}": sys.executable}
    for minor in ("3.11", "3.12", "3.13"):
        if minor in found:
            continue
        cands = [shutil.which(f"python{minor}")]
        cands += sorted(str(p) for p in (Path.home() / ".pyenv" / "versions").glob(
            f"{minor}.*/bin/python{minor}"))
        for cand in cands:
            # A pyenv shim exists on PATH even where it cannot run that version.
            if cand and Path(cand).exists() and _runs_as(cand, minor):
                found[minor] = cand
                break
    if wanted != "all":
        keep = set(wanted.split(","))
        found = {k: v for k, v in found.items() if k in keep}
    return dict(sorted(found.items()))


def instruction_pythons(args: argparse.Namespace, base: dict[str, str],
                        ) -> dict[str, dict[str, str | None]]:
    """Per Python version: the envlink and (if there is one) the OpenEnv client's python."""
    out: dict[str, dict[str, str | None]] = {}
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    for minor, base_python in base.items():
        if args.envlink_python and minor == this:
            envlink: str | None = args.envlink_python
        else:
            path = Path(args.envlink_venv) if minor == this else Path(
                f"{args.envlink_venv}-{minor}")
            if args.no_install:
                envlink = str(path / "bin" / "python")
            elif minor == this:
                envlink = envlink_venv(path, base_python)
            else:  # the core is enough here: the SDK is a dependency of envlink
                py = path / "bin" / "python"
                if not py.exists():
                    subprocess.run([base_python, "-m", "venv", str(path)], check=True)
                log(f"installing envlink into {path}")
                _pip_quiet(str(py), "-e", ".")
                envlink = str(py)
        openenv: str | None = None
        for cand in (Path(f"{args.openenv_venv}-{minor}"), Path(args.openenv_venv)):
            py = cand / "bin" / "python"
            if py.exists() and _python_version(str(py)) == minor:
                openenv = str(py)
                break
        if openenv is None and not args.no_install and "openenv" in args.clients:
            openenv = openenv_venv(Path(f"{args.openenv_venv}-{minor}")
                                   if minor != this else Path(args.openenv_venv), base_python)
        out[minor] = {"envlink": envlink, "openenv": openenv}
    return out


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


def count_window(name: str, client: str, mode: str, tel: str, python: str, url: str,
                 dump: Path, marks: Path, steps: int) -> int:
    """One client process under callgrind, counting one window of ``steps`` steps."""
    from _callgrind import MARKS_VAR, read_total, valgrind_argv

    dump.parent.mkdir(parents=True, exist_ok=True)
    dump.unlink(missing_ok=True)
    driver = Driver(f"instr-{dump.parent.name}-{dump.name}", python,
                    ["--client", client, "--mode", mode, "--telemetry", tel, "--url", url],
                    prefix=valgrind_argv(dump),
                    env={MARKS_VAR: str(marks), "PYTHONHASHSEED": "0",
                         "PYTHONWARNINGS": "ignore"},
                    deadline=INSTR_DEADLINE)  # imports under valgrind are slow on a busy machine
    try:
        reply = driver.ask(op="count", n=steps)
    finally:
        driver.stop()
    if not reply.get("on_valgrind"):
        raise RuntimeError(f"{name}: the client did not run under valgrind")
    return read_total(dump)


def count_variant(name: str, client: str, mode: str, tel: str, python: str, url: str,
                  out_dir: Path, marks: Path, steps: tuple[int, int]) -> dict[str, Any]:
    """A short and a long window, each a process: instructions per step by difference."""
    from concurrent.futures import ThreadPoolExecutor

    short, long_ = steps
    long_dump = out_dir / f"callgrind.out.{long_}"
    with ThreadPoolExecutor(max_workers=2) as pool:  # the two windows at once
        f_short = pool.submit(count_window, name, client, mode, tel, python, url,
                              out_dir / f"callgrind.out.{short}", marks, short)
        f_long = pool.submit(count_window, name, client, mode, tel, python, url, long_dump,
                             marks, long_)
        n_short, n_long = f_short.result(), f_long.result()
    per_step = (n_long - n_short) / (long_ - short)
    return {"per_step": per_step, "short": n_short, "long": n_long,
            "steps": [short, long_], "profile": str(long_dump)}


def section_instructions(args: argparse.Namespace) -> dict[str, Any]:
    """Instructions per step of every client, under callgrind, on each Python."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from _callgrind import build_marks

    if shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (Debian: apt-get install valgrind)")
    marks = build_marks(ROOT / "benchmarks" / "results" / ".callgrind")
    steps = (10, 30) if args.quick else (100, 600)
    clients = set(args.clients.split(","))
    servers = args.servers.split(",")
    pythons = instruction_pythons(args, find_pythons(args.pythons))
    base_minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    server_py = pythons.get(base_minor, next(iter(pythons.values())))
    out_root = Path(args.callgrind_dir)
    result: dict[str, Any] = {"steps": list(steps), "repeats": args.repeats,
                              "pythons": {}, "servers": servers}
    running: dict[str, ServerProcess] = {}
    try:
        urls: dict[str, str] = {}
        for kind in servers:
            if kind == "envlink":
                assert server_py["envlink"] is not None
                srv = envlink_server(server_py["envlink"], max_sessions=64,
                                     name="instr-envlink-echo")
            else:
                oe = next((p["openenv"] for p in pythons.values() if p["openenv"]), None)
                if oe is None:
                    log("no OpenEnv virtualenv: OpenEnv's server is left out")
                    continue
                srv = openenv_server("echo", oe, LOG_DIR, max_sessions=32,
                                     name="instr-openenv-echo")
            srv.start(deadline=600.0)  # OpenEnv's imports take minutes on a busy machine
            running[kind] = srv
            urls[kind] = srv.base_url
        for minor, pys in pythons.items():
            log(f"instructions: Python {minor}")
            jobs: list[tuple[str, str, tuple[str, str, str], str, str]] = []
            for kind, url in urls.items():
                for name, spec in INSTR_STEP_VARIANTS.items():
                    wanted = {"off": spec[0], "sdk": "sdk"}.get(spec[2], "sampled")
                    if wanted not in clients:
                        continue
                    python = pys["openenv"] if spec[0] == "openenv" else pys["envlink"]
                    if python is None:
                        continue
                    jobs.append((kind, name, spec, python, url))
            if "bridge" in clients:
                for name, spec in INSTR_BRIDGE_VARIANTS.items():
                    assert pys["envlink"] is not None
                    jobs.append(("bridge", name, spec, pys["envlink"], ""))
            todo = [(rep, job) for rep in range(args.repeats) for job in jobs]

            def run(item: tuple[int, tuple[str, str, tuple[str, str, str], str, str]],
                    minor: str = minor) -> tuple[int, str, str, dict[str, Any]]:
                rep, (kind, name, (client, mode, tel), python, url) = item
                out_dir = out_root / minor / f"{kind}-{_slug(name)}-r{rep + 1}"
                got = count_variant(name, client, mode, tel, python, url, out_dir, marks, steps)
                log(f"  {minor} {kind:<8} {name:<34} run {rep + 1}: "
                    f"{got['per_step'] / 1000:8.1f} k instructions/step")
                return rep, kind, name, got

            with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
                done = list(pool.map(run, todo))
            per: dict[str, dict[str, Any]] = {}
            for _rep, kind, name, got in done:
                entry = per.setdefault(kind, {}).setdefault(name, {"runs": []})
                entry["runs"].append(got)
            for variants in per.values():
                for entry in variants.values():
                    values = [r["per_step"] for r in entry["runs"]]
                    entry["per_step"] = statistics.median(values)
                    entry["spread"] = (max(values) - min(values)) / min(values)
            ratios: dict[str, dict[str, float]] = {}
            for kind, variants in per.items():
                pairs = dict(INSTR_RATIOS)
                if kind == "bridge":
                    pairs = {"envlink Bridge.call / run_coroutine_threadsafe":
                             ("envlink Bridge.call", "run_coroutine_threadsafe")}
                for label, (num, den) in pairs.items():
                    if num in variants and den in variants:
                        ratios.setdefault(kind, {})[label] = (
                            variants[num]["per_step"] / variants[den]["per_step"])
            result["pythons"][minor] = {"python": pys, "variants": per, "ratios": ratios}
        def spreads(bridge: bool) -> list[float]:
            return [entry["spread"] for per_py in result["pythons"].values()
                    for kind, variants in per_py["variants"].items()
                    if (kind == "bridge") is bridge for entry in variants.values()]

        steps_spreads, bridge_spreads = spreads(False), spreads(True)
        if args.repeats > 1 and steps_spreads:
            # The runs of one variant are independent processes: the largest spread says
            # how far two counts of the same code can be apart.
            result["agreement"] = {"max_spread": max(steps_spreads),
                                   "within_1_percent": max(steps_spreads) <= AGREEMENT}
        if args.repeats > 1 and bridge_spreads:
            # Apart: a no-op bridged call is short enough that which thread runs first
            # after the hand-off (a futex wake, or none) shows in its count (3.12+).
            result["bridge_agreement"] = {
                "max_spread": max(bridge_spreads),
                "within_1_percent": max(bridge_spreads) <= AGREEMENT}
    finally:
        for srv in running.values():
            srv.stop()
    return result


def print_instructions(res: dict[str, Any]) -> None:
    short, long_ = res["steps"]
    print(f"\ninstructions per step (callgrind, client process, all threads; "
          f"(N{long_} - N{short}) / {long_ - short}; {res['repeats']} run(s) each)")
    for minor, per_py in res["pythons"].items():
        print(f"\n  Python {minor}")
        kinds = list(per_py["variants"])
        for kind in kinds:
            title = ("bridge, no-op call" if kind == "bridge" else f"on {kind}'s server")
            print(f"  {title}")
            print(f"    {'client':<36}{'k instr/step':>14}{'spread':>9}")
            for name, entry in per_py["variants"][kind].items():
                print(f"    {name:<36}{entry['per_step'] / 1000:>14.1f}"
                      f"{entry['spread'] * 100:>8.2f}%")
            for label, value in per_py["ratios"].get(kind, {}).items():
                target = INSTR_TARGETS.get(label)
                mark = "" if target is None else (
                    f"   (target <= {target:.2f}: {verdict(value <= target)})")
                print(f"    {label:<36}{value:>14.3f}{mark}")
    for key, what in (("agreement", "the runs of each step variant"),
                      ("bridge_agreement", "the runs of each no-op bridged call")):
        agreement = res.get(key)
        if agreement is not None:
            print(f"\n  agreement: {what} are at most "
                  f"{agreement['max_spread'] * 100:.2f}% apart (within "
                  f"{AGREEMENT * 100:.0f}%: {'yes' if agreement['within_1_percent'] else 'NO'})")


# ------------------------------------------------------------------ report


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout.strip()
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "git": rev,
            "loadavg_start": os.getloadavg()}


def versions(pythons: dict[str, str]) -> dict[str, str]:
    out = {}
    for which, pkgs in (("envlink", ("envlink", "opentelemetry-sdk", "websockets", "picows",
                                     "uvloop")),
                        ("openenv", ("openenv", "websockets", "uvloop"))):
        if not Path(pythons[which]).exists():
            continue  # --transports without OpenEnv's virtualenv: its arms are left out
        code = ("import importlib.metadata as m, json, platform\n"
                "def v(p):\n"
                "    try:\n        return m.version(p)\n"
                "    except m.PackageNotFoundError:\n        return None\n"
                "print(json.dumps({'python': platform.python_version(), **{p: v(p) "
                f"for p in {list(pkgs)!r}}}}}))")
        got = json.loads(subprocess.run([pythons[which], "-c", code], check=True,
                                        stdout=subprocess.PIPE, text=True).stdout)
        got = {k: v for k, v in got.items() if v is not None}
        out.update({(f"{which}:{k}" if k in ("websockets", "python") else k): v
                    for k, v in got.items()})
    return out


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def print_scale(sc: dict[str, Any]) -> None:
    print(f"\n5. scale: client pinned to core {sc['client_core']}, "
          f"{len(sc['server_cores'])} envlink echo server(s) on core(s) "
          f"{','.join(map(str, sc['server_cores']))}; {sc['rounds']} interleaved rounds of "
          f"about {sc['steps_per_run']} steps; x: against OpenEnv's client (modules alone) "
          "in the same round")
    head = (f"  {'variant':<26}{'steps/s':>20}{'CPU us/step':>18}{'p50 us':>10}{'p99 us':>10}"
            f"{'KiB/sess':>10}{'servers busy':>16}{'CPU x':>18}{'steps/s x':>18}")
    for title, key in (("sessions on one loop", "levels"), ("threads, a sync client each",
                                                              "threads")):
        for level, lv in sc[key].items():
            print(f"\n  {level} {title}")
            print(head)
            for name, v in lv.items():
                if name == "ratios" or not isinstance(v, dict) or "steps_per_s" not in v:
                    continue
                r = lv["ratios"].get(name, {})
                idle = v["idle_kib_per_session"]
                idle_s = f"{idle:.1f}" if idle is not None and int(level) >= 100 else "-"
                busy = "/".join(f"{b['median']:.2f}" for b in v["server_busy"])
                print(f"  {name:<26}{fmt(v['steps_per_s'], 0, 20)}"
                      f"{fmt(v['cpu_us_per_step'], 0, 18)}"
                      f"{v['p50_us']['median']:>10.0f}{v['p99_us']['median']:>10.0f}"
                      f"{idle_s:>10}{busy:>16}{fmt(r.get('cpu_x'), 2, 18)}"
                      f"{fmt(r.get('steps_per_s_x'), 2, 18)}")
            if "sdk_cpu_x_envlink" in lv:
                print(f"  CPU per step, SDK always on / without: {fmt(lv['sdk_cpu_x_envlink'], 2)};"
                      f" 1% sampled / without: {fmt(lv['sampled_cpu_x_envlink'], 2)}")
            if "ref_sdk_cpu_x_envlink" in lv:
                print("  [ref] CPU per step, SDK always on / without: "
                      f"{fmt(lv['ref_sdk_cpu_x_envlink'], 2)}; 1% sampled / without: "
                      f"{fmt(lv['ref_sampled_cpu_x_envlink'], 2)}")
            gcs = {n: v for n, v in lv.items() if isinstance(v, dict) and "gc_per_kstep" in v}
            if gcs:
                print("  GC collections per 1,000 steps / allocated blocks kept per step: " +
                      "; ".join(f"{n} {v['gc_per_kstep']['median']:.1f} / "
                                f"{v['blocks_kept_per_step']['median']:.2f}"
                                for n, v in gcs.items()))


def print_scale_transports(sc: dict[str, Any]) -> None:
    base = sc["baseline"]
    print(f"\n5t. scale by transport and loop: client pinned to core {sc['client_core']}, "
          f"server(s) on core(s) {','.join(map(str, sc['server_cores']))}; "
          f"{sc['rounds']} interleaved rounds of about {sc['steps_per_run']} steps; "
          f"x: client CPU per step against {base!r} in the same round")
    if sc.get("missing"):
        print("  not run: " + "; ".join(sc["missing"]))
    levels = list(sc["levels"])
    print("  " + f"{'client':<34}" + "".join(f"{f'{n} sessions, CPU x':>24}" for n in levels)
          + "".join(f"{f'{n}: steps/s':>14}" for n in levels[-1:])
          + f"{'KiB/idle sess':>15}")
    for name in sc["arms"]:
        row = f"  {name:<34}"
        for level in levels:
            lv = sc["levels"][level]
            r = lv["ratios"].get(name)
            row += f"{fmt(r['cpu_x'], 2, 24) if r else f'{1:>24}'}"
        last = sc["levels"][levels[-1]][name]
        idle = last["idle_kib_per_session"]
        row += f"{last['steps_per_s']['median']:>14.0f}"
        row += f"{(f'{idle:.1f}' if idle is not None else '-'):>15}"
        print(row)


def print_scale_count(sc: dict[str, Any]) -> None:
    print(f"\n5b. {sc['sessions']} sessions on one loop under callgrind --cache-sim=yes "
          f"(rounds {sc['windows'][0]} and {sc['windows'][1]}, {sc['repeats']} run(s) each): "
          "per step")
    events = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
    print(f"  {'client':<10}" + "".join(f"{ev:>16}" for ev in events))
    for name, per in sc.get("per_step", {}).items():
        print(f"  {name:<10}" + "".join(
            f"{per[ev]['median']:>10.0f} {per[ev]['spread'] * 100:4.1f}%" if ev in per else
            f"{'-':>16}" for ev in events))
    ratio = sc.get("envlink_x_openenv")
    if ratio:
        print(f"  {'envlink/OE':<10}" + "".join(
            f"{ratio[ev]:>16.3f}" if ev in ratio else f"{'-':>16}" for ev in events))


def print_report(res: dict[str, Any]) -> None:
    m = res["machine"]
    print(f"\nenvlink benchmarks ({'quick' if res['quick'] else 'full'}), git {m['git']}, "
          f"{m['cpu']} x{m['cores']}, Python {m['python']}, load {m['loadavg_start'][0]:.2f}"
          f" -> {m['loadavg_end'][0]:.2f}")
    print("  " + ", ".join(f"{k} {v}" for k, v in res["versions"].items()))
    print("  figures: median [min-max] over interleaved rounds; ratios per round, same run")

    if "bridge" in res:
        b = res["bridge"]
        print(f"\n1. bridge, no-op coroutine ({b['rounds']} rounds x {b['calls']} calls)")
        print(f"  {'variant':<38}{'us/call':>22}{'x run_coroutine_threadsafe':>30}")
        for name, v in b["variants"].items():
            us = {"median": v["us_per_call"], "min": v["us_min"], "max": v["us_max"]}
            ratio = {"median": v["ratio"], "min": v["ratio_min"], "max": v["ratio_max"]}
            print(f"  {name:<38}{fmt(us, 1, 22)}{fmt(ratio, 2, 30)}")

    for kind in ("envlink", "openenv"):
        key = f"steps_{kind}_server"
        if key not in res:
            continue
        s = res[key]
        print(f"\n2/3/4. sequential steps on the {kind} server "
              f"({s['rounds']} rounds x {s['steps_per_round']} steps)")
        print(f"  {'client':<34}{'p50 us':>18}{'p99 us':>20}{'steps/s':>20}"
              f"{'CPU us/step':>18}{'p50 x floor':>18}{'CPU x floor':>18}")
        for name, v in s["variants"].items():
            print(f"  {name:<34}{fmt(v['p50_us'], 0, 18)}{fmt(v['p99_us'], 0, 20)}"
                  f"{fmt(v['steps_per_s'], 0, 20)}{fmt(v['cpu_us_per_step'], 0, 18)}"
                  f"{fmt(v.get('p50_us_x_floor'), 2, 18)}"
                  f"{fmt(v.get('cpu_us_per_step_x_floor'), 2, 18)}")
        print(f"  {'envlink vs OpenEnv, same mode':<34}{'p50 x OpenEnv':>18}"
              f"{'CPU x OpenEnv':>20}")
        for name, v in s["variants"].items():
            if not name.startswith("envlink"):
                continue
            label = "openenv_sync" if " sync" in name else "openenv_async"
            print(f"  {name:<34}{fmt(v.get(f'p50_us_x_{label}'), 2, 18)}"
                  f"{fmt(v.get(f'cpu_us_per_step_x_{label}'), 2, 20)}")
        print(f"  {'telemetry cost (vs no SDK)':<34}{'p50 x no SDK':>18}"
              f"{'added CPU us/step':>20}")
        for name, v in s["variants"].items():
            if not name.startswith("envlink") or "+" not in name:
                continue
            label = "envlink_sync_nosdk" if " sync" in name else "envlink_async_nosdk"
            print(f"  {name:<34}{fmt(v.get(f'p50_us_x_{label}'), 2, 18)}"
                  f"{fmt(v.get(f'cpu_us_added_vs_{label}'), 0, 20)}")

    if "scale" in res:
        print_scale(res["scale"])
    if "scale_transports" in res:
        print_scale_transports(res["scale_transports"])
    if "scale_count" in res:
        print_scale_count(res["scale_count"])

    if "imports" in res:
        print("\n6. import time (fresh interpreter each time)")
        print(f"  {'statement':<44}{'in-process s':>22}{'whole process s':>22}")
        for name, v in res["imports"].items():
            if name == "envlink_x_openenv":
                continue
            print(f"  {name:<44}{fmt(v['in_process_s'], 3, 22)}{fmt(v['process_s'], 3, 22)}")
        print(f"  import envlink / OpenEnv client: {fmt(res['imports']['envlink_x_openenv'], 3)}")

    print("\ntargets")
    for line in res["targets"]:
        print(f"  {line}")


def targets(res: dict[str, Any]) -> list[str]:
    out = []
    s = res.get("steps_envlink_server")
    if s:
        v = s["variants"]["envlink sync +SDK"]
        r = v["p50_us_x_envlink_sync_nosdk"]["median"]
        out.append(f"sync step with SDK <= 1.20x no SDK (envlink server): {r:.2f} "
                   f"{verdict(r <= 1.20)}")
        c = v["cpu_us_added_vs_envlink_sync_nosdk"]["median"]
        out.append(f"SDK's added client CPU per sync step <= 100 us (envlink server): {c:.0f} us "
                   f"{verdict(c <= 100)}")
    o = res.get("steps_openenv_server")
    if o:
        v = o["variants"]["envlink sync"]
        r = v["p50_us_x_openenv_sync"]["median"]
        out.append(f"no SDK: sync p50 <= 0.90x OpenEnv sync (OpenEnv server): {r:.2f} "
                   f"{verdict(r <= 0.90)}")
        c = v["cpu_us_per_step_x_openenv_sync"]["median"]
        out.append(f"no SDK: sync CPU/step <= 1.0x OpenEnv sync (OpenEnv server): {c:.2f} "
                   f"{verdict(c <= 1.0)}")
    b = res.get("bridge")
    if b:
        off = b["variants"]["bridge, telemetry off"]["ratio"]
        on = b["variants"]["bridge, telemetry on (batch)"]["ratio"]
        out.append(f"bridge no-op <= 1.0x run_coroutine_threadsafe, no SDK: {off:.2f} "
                   f"{verdict(off <= 1.0)}")
        out.append(f"bridge no-op <= 1.3x run_coroutine_threadsafe, SDK (batch): {on:.2f} "
                   f"{verdict(on <= 1.3)}")
    sc = res.get("scale")
    if sc:
        top = sc["levels"][str(max(SCALE_LEVELS))]
        kib_e = top["envlink"]["idle_kib_per_session"]
        kib_o = top["openenv"]["idle_kib_per_session"]
        out.append(f"memory per idle session <= OpenEnv's ({max(SCALE_LEVELS)} sessions): "
                   f"{kib_e:.1f} vs {kib_o:.1f} KiB {verdict(kib_e <= kib_o)}")
        for level, limit in (("1000", 0.80), ("100", 0.80), ("10", 0.90)):
            r = sc["levels"][level]["ratios"]["envlink"]["cpu_x"]["median"]
            out.append(f"client CPU per step at {level} sessions <= {limit:.2f}x OpenEnv: "
                       f"{r:.2f} {verdict(r <= limit)}")
        r = top["sdk_cpu_x_envlink"]["median"]
        out.append(f"SDK always on at 1000 sessions <= 1.6x without: {r:.2f} {verdict(r <= 1.6)}")
        r = top["sampled_cpu_x_envlink"]["median"]
        out.append(f"1% sampled at 1000 sessions <= 1.3x without: {r:.2f} {verdict(r <= 1.3)}")
        for t, lv in sc["threads"].items():
            r = lv["ratios"]["envlink"]["steps_per_s_x"]["median"]
            out.append(f"{t} threads with sync clients, steps/s >= 2.5x OpenEnv: {r:.2f} "
                       f"{verdict(r >= 2.5)}")
    im = res.get("imports")
    if im:
        t = im["import envlink"]["in_process_s"]["median"]
        out.append(f"import envlink <= 0.3 s: {t:.3f} s {verdict(t <= 0.3)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps")
    parser.add_argument("--json", default=str(HERE / "results" / "latest.json"),
                        help="where to write the figures (default: %(default)s)")
    parser.add_argument("--only", default="bridge,steps,scale,imports",
                        help="comma-separated sections: bridge, steps, scale, imports, "
                             "scale-count (not by default: under callgrind, many minutes), "
                             "fleet, recorder (not by default)")
    parser.add_argument("--python", default=None,
                        help="run the clients and servers on this Python version (e.g. 3.12): "
                             "virtualenvs .venv-bench-3.12 and .venv-openenv-3.12, made from "
                             "python3.12 on the path or pyenv's")
    parser.add_argument("--envlink-venv", default=str(ROOT / ".venv-bench"))
    parser.add_argument("--openenv-venv", default=str(ROOT / ".venv-openenv"))
    parser.add_argument("--no-install", action="store_true",
                        help="use the virtualenvs as they are (they must exist)")
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per step under callgrind instead of timing")
    parser.add_argument("--pythons", default="all",
                        help="--instructions: Python versions, e.g. 3.11,3.13 (default: all found)")
    parser.add_argument("--servers", default="envlink,openenv",
                        help="--instructions: servers to count against")
    parser.add_argument("--clients", default="floor,openenv,envlink,sdk,bridge",
                        help="--instructions: floor, openenv, envlink, sdk, bridge, "
                             "sampled (1 %% head sampling)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="--instructions, scale-count: client processes per variant")
    parser.add_argument("--jobs", type=int, default=2,
                        help="--instructions: client processes counted at once")
    parser.add_argument("--callgrind-dir", default=str(HERE / "results" / "callgrind"),
                        help="--instructions: where the profiles go (default: %(default)s)")
    parser.add_argument("--envlink-python", default=None,
                        help="--instructions: this Python's envlink interpreter, as it is")
    parser.add_argument("--compare-src", default=None,
                        help="scale: envlink's rows again, interleaved in the same rounds, "
                             "with envlink imported from this src directory (marked [ref]): "
                             "a before/after in one run")
    parser.add_argument("--transports", action="store_true",
                        help="scale: OpenEnv's client (where installed), envlink on websockets "
                             "and on picows, and the bare websockets and picows exchanges, each "
                             "on asyncio's loop and on uvloop, in one interleaved run (with "
                             "--only scale)")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    LOG_DIR.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no results/ yet

    # A thousand sessions need a thousand sockets in one client process.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))

    if args.instructions:
        res_i = {"machine": machine(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                 "quick": args.quick}
        res_i["instructions"] = section_instructions(args)
        res_i["machine"]["loadavg_end"] = os.getloadavg()
        path = Path(args.json if args.json != parser.get_default("json")
                    else HERE / "results" / "instructions.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res_i, indent=1))
        print_instructions(res_i["instructions"])
        print(f"\nfigures written to {path}")
        return 0

    base_python = sys.executable
    if args.python is not None:
        found = find_pythons(args.python)
        if args.python not in found:
            raise SystemExit(f"--python {args.python}: no such interpreter found")
        base_python = found[args.python]
        if args.envlink_venv == parser.get_default("envlink_venv"):
            args.envlink_venv = f"{args.envlink_venv}-{args.python}"
        if args.openenv_venv == parser.get_default("openenv_venv"):
            args.openenv_venv = f"{args.openenv_venv}-{args.python}"
    if args.no_install:
        pythons = {"envlink": str(Path(args.envlink_venv) / "bin" / "python"),
                   "openenv": str(Path(args.openenv_venv) / "bin" / "python")}
    else:
        pythons = {"envlink": envlink_venv(Path(args.envlink_venv), base_python),
                   "openenv": openenv_venv(Path(args.openenv_venv), base_python)}

    res: dict[str, Any] = {"quick": args.quick, "machine": machine(),
                           "versions": versions(pythons),
                           "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    if "bridge" in only:
        res["bridge"] = section_bridge(pythons["envlink"], args.quick)
    if "steps" in only:
        res["steps_envlink_server"] = section_steps("envlink", pythons, args.quick)
        res["steps_openenv_server"] = section_steps("openenv", pythons, args.quick)
    if "scale" in only and args.transports:
        res["scale_transports"] = section_scale_transports(pythons, args.quick)
    elif "scale" in only:
        res["scale"] = section_scale(pythons, args.quick, args.compare_src)
    if "scale-count" in only:
        res["scale_count"] = section_scale_count(pythons, args.quick, max(1, args.repeats))
    if "imports" in only:
        res["imports"] = section_imports(pythons, args.quick)
    if "fleet" in only:  # not in the default run: --only fleet
        res["fleet"] = section_fleet(pythons["envlink"], args.quick)
    if "recorder" in only:  # not in the default run: --only recorder
        res["recorder"] = section_recorder(pythons["envlink"], args.quick)
        for sessions, rec in res["recorder"].items():
            print(f"recorder, {sessions} session(s): client CPU per step with/without "
                  f"{rec['ratio']['median']:.3f} ({rec['ratio']['min']:.3f}-"
                  f"{rec['ratio']['max']:.3f})")
    res["machine"]["loadavg_end"] = os.getloadavg()
    res["targets"] = targets(res)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1))
    print_report(res)
    print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
