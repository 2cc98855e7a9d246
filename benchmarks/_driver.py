"""One benchmark client process, driven by ``run.py`` over stdin/stdout.

Runs under the virtualenv of the client it measures: envlink's (``--client
envlink`` or ``floor``) or OpenEnv's (``--client openenv`` or ``openenv-stock``,
which import ``openenv`` and never ``envlink``; in the scale and threads modes
``openenv`` is OpenEnv's client modules alone, see :func:`openenv_client_class`).
``--cpu N`` pins the process to one core. It sets up one client, then answers one JSON
line per command read from stdin:

* ``{"op": "steps", "n": N}``: N sequential steps, each timed;
  answers per-step latency percentiles, steps/s and the process CPU per step
  (every thread of this process: the bridge's loop thread and the SDK's export
  threads are client CPU too);
* ``{"op": "scale", "sessions": S, "steps": K}``: (``--mode scale``) S sessions
  on this one event loop (spread over the comma-separated ``--url`` servers), K
  concurrent steps each: steps/s, CPU per step, per-step p50/p99, GC collections
  and allocated blocks kept per step; the first command per S also opens the
  sessions and reports the memory per idle session; with ``"server_pids": [P,
  ...]``, also each server's CPU over the window and its busy share of one core;
* ``{"threads": T, "steps": K}``: (``--mode threads``) T threads, each owning a
  sync client, K steps each, the same figures;
* ``{"op": "count", "n": N}``: N sequential steps (``--mode scale``:
  ``"sessions": S, "steps": K``, S sessions stepped together K times), untimed,
  with callgrind counting around them (``_callgrind.Marks``; the process runs
  under callgrind and ``ENVLINK_CALLGRIND_MARKS`` names the marks library), once
  per process;
* ``{"op": "quit"}``.

``--loop uvloop`` runs the async modes on uvloop (the application's choice of loop);
the scale mode's ``floor`` and ``floor-picows`` clients are the bare exchange on
websockets' and picows' asyncio clients.

Nothing here prints to the protocol stream but the answers: stdout is moved to
a private descriptor first, and anything else writing to ``sys.stdout`` lands on
stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

#: The step every client sends: OpenEnv's MCP echo tool, answered by both servers.
ACTION: dict[str, Any] = {"type": "call_tool", "tool_name": "echo_message",
                          "arguments": {"message": "hello"}}
WARMUP_STEPS = 200

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def process_cpu_s(pid: int) -> float:
    """Another process's user and system CPU time so far, from ``/proc`` (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _summary(latencies: list[float], wall: float, cpu: float) -> dict[str, Any]:
    latencies.sort()
    n = len(latencies)
    return {
        "n": n,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[min(n - 1, int(n * 0.99))] * 1e6,
        "steps_per_s": n / wall,
        "cpu_us_per_step": cpu / n * 1e6,
    }


# ------------------------------------------------------------------ telemetry


class _TelemetrySetup:
    """The OpenTelemetry SDK configured the way ``--telemetry`` says (envlink only)."""

    def __init__(self, mode: str, otlp_endpoint: str | None) -> None:
        self.mode = mode
        self.handle: Any = None
        self.prometheus_url: str | None = None
        if mode == "off":
            return
        if mode == "sdk-exemplars":
            # The SDK's own default filter, which configure() turns off unless asked.
            os.environ["OTEL_METRICS_EXEMPLAR_FILTER"] = "trace_based"
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

        import envlink.telemetry

        class DropExporter(SpanExporter):
            """Exports nothing: the cost of producing spans, batched as in production."""

            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        ratios = {"sdk-sampled": 0.1, "sdk-sampled-1pct": 0.01}
        if mode in ("sdk", "sdk-exemplars", "sdk-nested", *ratios):
            self.handle = envlink.telemetry.configure(
                service_name="bench", span_exporters=[DropExporter()],
                metric_readers=[InMemoryMetricReader()],
                trace_sample_ratio=ratios.get(mode))
        elif mode == "prometheus":
            self.handle = envlink.telemetry.configure(service_name="bench", prometheus_port=0)
            self.prometheus_url = f"http://127.0.0.1:{self.handle.prometheus_port}/metrics"
        elif mode == "otlp":
            if not otlp_endpoint:
                raise SystemExit("--telemetry otlp needs --otlp-endpoint")
            self.handle = envlink.telemetry.configure(
                service_name="bench", otlp_endpoint=otlp_endpoint,
                otlp_protocol="http/protobuf", metric_export_interval=10.0)
        else:
            raise SystemExit(f"unknown --telemetry {mode!r}")

    def after_round(self) -> dict[str, Any]:
        """Outside the timed window: prove that the telemetry really flows."""
        if self.prometheus_url is None:
            return {}
        import urllib.request

        with urllib.request.urlopen(self.prometheus_url, timeout=10) as resp:
            body = resp.read()
        return {"scrape_bytes": len(body)}

    def shutdown(self) -> None:
        if self.handle is not None:
            self.handle.shutdown()


# ------------------------------------------------------------------ clients


class SyncRunner:
    """A blocking client: ``step()`` is one synchronous step."""

    def __init__(self, client: str, url: str, nested: bool = False) -> None:
        self.client = client
        if client == "floor":
            from websockets.sync.client import connect

            ws_url = url.replace("http://", "ws://") + "/ws"
            self._ws = connect(ws_url, max_size=None)
            self._ws.send(json.dumps({"type": "reset", "data": {}}))
            self._ws.recv()
            step_frame = {"type": "step", "data": ACTION}
            ws = self._ws
            dumps, loads = json.dumps, json.loads

            def step() -> Any:
                ws.send(dumps(step_frame))
                return loads(ws.recv())

            self.step: Callable[[], Any] = step
            self._close: Callable[[], None] = self._ws.close
        elif client == "envlink":
            from envlink import GenericEnvClient

            env = (GenericEnvClient(base_url=url).sync(nested_spans=True) if nested
                   else GenericEnvClient(base_url=url).sync())
            env.reset()
            self.step = lambda: env.step(ACTION)
            self._close = env.close
        elif client == "bridge":
            from envlink._bridge import Bridge

            bridge = Bridge()
            self.step = lambda: bridge.call(_noop, timeout=60.0)
            self._close = bridge.close
        elif client == "rcts":
            loop, thread = _plain_loop_thread()
            self.step = lambda: asyncio.run_coroutine_threadsafe(_noop(), loop).result(60.0)

            def close() -> None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(10)

            self._close = close
        elif client == "openenv":
            from openenv.core import GenericEnvClient as OpenEnvClient

            oenv = OpenEnvClient(base_url=url, message_timeout_s=60).sync()
            oenv.__enter__()
            oenv.reset()
            self.step = lambda: oenv.step(ACTION)
            self._close = lambda: oenv.__exit__(None, None, None)
        else:
            raise SystemExit(f"unknown --client {client!r}")
        for _ in range(WARMUP_STEPS):
            self.step()

    def steps(self, n: int) -> dict[str, Any]:
        step = self.step
        perf = time.perf_counter
        lat = [0.0] * n
        gc.collect()
        cpu0, t0 = time.process_time(), perf()
        for i in range(n):
            s = perf()
            step()
            lat[i] = perf() - s
        wall, cpu = perf() - t0, time.process_time() - cpu0
        return _summary(lat, wall, cpu)

    def count(self, n: int, marks: Any) -> dict[str, Any]:
        step = self.step
        gc.collect()
        marks.start()
        for _ in range(n):
            step()
        marks.stop()
        return {"n": n, "on_valgrind": marks.on_valgrind}

    def close(self) -> None:
        self._close()


async def _noop() -> None:
    return None


def _plain_loop_thread() -> tuple[asyncio.AbstractEventLoop, Any]:
    """An event loop in a daemon thread, as ``run_coroutine_threadsafe`` users run one."""
    import threading

    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.call_soon(ready.set)
        loop.run_forever()
        loop.close()

    thread = threading.Thread(target=run, name="bench-plain-loop", daemon=True)
    thread.start()
    ready.wait()
    return loop, thread


class AsyncRunner:
    """An async client on this process's event loop (run in the main thread)."""

    def __init__(self, client: str, url: str) -> None:
        self.client = client
        self.url = url
        self.step: Callable[[], Awaitable[Any]]
        self._close: Callable[[], Awaitable[None]]

    async def setup(self) -> None:
        client, url = self.client, self.url
        if client == "floor":
            from websockets.asyncio.client import connect

            ws = await connect(url.replace("http://", "ws://") + "/ws", max_size=None)
            await ws.send(json.dumps({"type": "reset", "data": {}}))
            await ws.recv()
            step_frame = {"type": "step", "data": ACTION}
            dumps, loads = json.dumps, json.loads

            async def step() -> Any:
                await ws.send(dumps(step_frame))
                return loads(await ws.recv())

            self.step = step
            self._close = ws.close
        elif client == "envlink":
            from envlink import GenericEnvClient

            env = GenericEnvClient(base_url=url)
            await env.reset()
            self.step = lambda: env.step(ACTION)
            self._close = env.close
        elif client == "openenv":
            from openenv.core import GenericEnvClient as OpenEnvClient

            oenv = OpenEnvClient(base_url=url, message_timeout_s=60)
            await oenv.connect()
            await oenv.reset()
            self.step = lambda: oenv.step(ACTION)
            self._close = oenv.close
        else:
            raise SystemExit(f"unknown --client {client!r}")
        for _ in range(WARMUP_STEPS):
            await self.step()

    async def steps(self, n: int) -> dict[str, Any]:
        step = self.step
        perf = time.perf_counter
        lat = [0.0] * n
        gc.collect()
        cpu0, t0 = time.process_time(), perf()
        for i in range(n):
            s = perf()
            await step()
            lat[i] = perf() - s
        wall, cpu = perf() - t0, time.process_time() - cpu0
        return _summary(lat, wall, cpu)

    async def count(self, n: int, marks: Any) -> dict[str, Any]:
        step = self.step
        gc.collect()
        marks.start()
        for _ in range(n):
            await step()
        marks.stop()
        return {"n": n, "on_valgrind": marks.on_valgrind}

    async def close(self) -> None:
        await self._close()


def openenv_client_class(client: str) -> Any:
    """OpenEnv 0.10's ``GenericEnvClient``: ``openenv`` imports its client modules only.

    ``from openenv.core import GenericEnvClient`` (``openenv-stock``) runs
    ``openenv/core/__init__.py``, which also imports OpenEnv's server stack (FastAPI,
    Gradio, pandas, ...): a heap that every full collection of the process walks. A
    training process imports what it imports; the strict comparison is OpenEnv's client
    code alone, so ``openenv`` gives ``openenv`` and ``openenv.core`` empty package
    modules (their real ``__path__``, not their ``__init__``) and imports the client
    modules from them.
    """
    if client == "openenv-stock":
        from openenv.core import GenericEnvClient as stock

        return stock
    import importlib.util
    import types

    for name in ("openenv", "openenv.core"):
        if name in sys.modules:
            continue
        spec = importlib.util.find_spec(name)
        assert spec is not None
        assert spec.submodule_search_locations is not None
        module = types.ModuleType(name)
        module.__path__ = list(spec.submodule_search_locations)
        module.__spec__ = spec
        sys.modules[name] = module
    from openenv.core.generic_client import GenericEnvClient as strict

    return strict


def _pct(values: Iterable[float]) -> dict[str, float]:
    latencies = sorted(values)
    n = len(latencies)
    return {"p50_us": latencies[n // 2] * 1e6,
            "p99_us": latencies[min(n - 1, int(n * 0.99))] * 1e6}


def _gc_collections() -> int:
    return sum(g["collections"] for g in gc.get_stats())


class _FloorSession:
    """The floor of one session at scale: websockets' asyncio client doing the same JSON
    exchange, nothing more (no deadline, no recovery, no telemetry)."""

    def __init__(self, url: str) -> None:
        self.url = url.replace("http://", "ws://") + "/ws"
        self.ws: Any = None

    async def connect(self) -> None:
        from websockets.asyncio.client import connect

        self.ws = await connect(self.url, max_size=None)

    async def _call(self, frame: dict[str, Any]) -> Any:
        await self.ws.send(json.dumps(frame))
        return json.loads(await self.ws.recv())

    async def reset(self) -> Any:
        return await self._call({"type": "reset", "data": {}})

    async def step(self, action: dict[str, Any]) -> Any:
        return await self._call({"type": "step", "data": action})

    async def close(self) -> None:
        await self.ws.close()


class _PicowsFloorSession:
    """The floor on picows: its listener hands each frame's text to a future, one
    exchange at a time, and ``json`` does the rest."""

    def __init__(self, url: str) -> None:
        self.url = url.replace("http://", "ws://") + "/ws"
        self.transport: Any = None
        self.listener: Any = None

    async def connect(self) -> None:
        import picows

        class Listener(picows.WSListener):  # type: ignore[misc]
            waiter: Any = None

            def on_ws_frame(self, transport: Any, frame: Any) -> None:
                if frame.msg_type == picows.WSMsgType.TEXT and self.waiter is not None:
                    self.waiter.set_result(frame.get_payload_as_utf8_text())
                    self.waiter = None
                elif frame.msg_type == picows.WSMsgType.CLOSE:
                    transport.disconnect()

        self.transport, self.listener = await picows.ws_connect(
            Listener, self.url, max_frame_size=1 << 30)
        self._text = picows.WSMsgType.TEXT

    async def _call(self, frame: dict[str, Any]) -> Any:
        waiter = self.listener.waiter = asyncio.get_running_loop().create_future()
        self.transport.send(self._text, json.dumps(frame).encode())
        return json.loads(await waiter)

    async def reset(self) -> Any:
        return await self._call({"type": "reset", "data": {}})

    async def step(self, action: dict[str, Any]) -> Any:
        return await self._call({"type": "step", "data": action})

    async def close(self) -> None:
        self.transport.send_close()
        self.transport.disconnect()
        await self.transport.wait_disconnected()


class ScaleRunner:
    """Many sessions of one client on this process's one event loop.

    ``urls``: the servers; session ``i`` goes to ``urls[i % len(urls)]``.
    """

    def __init__(self, client: str, urls: list[str]) -> None:
        self.client = client
        self.urls = urls
        self.sessions: dict[int, list[Any]] = {}
        self._cls: Any = None

    def _new(self, i: int) -> Any:
        url = self.urls[i % len(self.urls)]
        if self.client == "envlink":
            from envlink import GenericEnvClient

            return GenericEnvClient(base_url=url)
        if self.client == "floor":
            return _FloorSession(url)
        if self.client == "floor-picows":
            return _PicowsFloorSession(url)
        if self._cls is None:
            self._cls = openenv_client_class(self.client)
        return self._cls(base_url=url, message_timeout_s=120)

    async def _open(self, count: int) -> tuple[list[Any], float]:
        gc.collect()
        before = rss_bytes()
        clients = [self._new(i) for i in range(count)]
        # Open in batches: a thousand simultaneous handshakes would measure the
        # server's accept queue, not the client.
        for i in range(0, count, 50):
            batch = clients[i:i + 50]
            if self.client != "envlink":  # OpenEnv's client and the floors connect first
                await asyncio.gather(*(c.connect() for c in batch))
            await asyncio.gather(*(c.reset() for c in batch))
        gc.collect()
        return clients, (rss_bytes() - before) / count

    async def _population(self, sessions: int) -> tuple[list[Any], dict[str, Any]]:
        out: dict[str, Any] = {}
        if sessions not in self.sessions:
            for other in list(self.sessions):  # one population at a time
                await asyncio.gather(*(c.close() for c in self.sessions.pop(other)))
            clients, per_session = await self._open(sessions)
            self.sessions[sessions] = clients
            out["idle_bytes_per_session"] = per_session
            for c in clients:  # warm up every session
                await c.step(ACTION)
        return self.sessions[sessions], out

    async def scale(self, sessions: int, steps: int, server_pids: list[int] | None = None,
                    ) -> dict[str, Any]:
        clients, out = await self._population(sessions)
        perf = time.perf_counter
        # An array, not a list: a float kept per step would count as a block kept.
        lat = array("d")
        record = lat.append

        async def run(c: Any) -> None:
            for _ in range(steps):
                s = perf()
                await c.step(ACTION)
                record(perf() - s)

        pids = server_pids or []
        gc.collect()
        blocks0, gc0 = sys.getallocatedblocks(), _gc_collections()
        server0 = [process_cpu_s(p) for p in pids]
        cpu0, t0 = time.process_time(), perf()
        await asyncio.gather(*(run(c) for c in clients))
        wall, cpu = perf() - t0, time.process_time() - cpu0
        server1 = [process_cpu_s(p) for p in pids]
        total = sessions * steps
        gcs = _gc_collections() - gc0
        out.update(n=total, wall_s=wall, steps_per_s=total / wall,
                   cpu_us_per_step=cpu / total * 1e6, **_pct(lat),
                   gc_per_kstep=gcs / total * 1000,
                   blocks_kept_per_step=(sys.getallocatedblocks() - blocks0) / total)
        if pids:
            # Each server's CPU over the same window (it serves only this client then),
            # read in clock ticks: to about 10 ms. Busy: its share of one core.
            spent = [b - a for a, b in zip(server0, server1, strict=True)]
            out["server_cpu_us_per_step"] = sum(spent) / total * 1e6
            out["server_busy"] = [s / wall for s in spent]
        return out

    async def count(self, sessions: int, steps: int, marks: Any) -> dict[str, Any]:
        """``steps`` rounds of all sessions stepped together, counted by callgrind."""
        clients, _ = await self._population(sessions)

        async def run(c: Any) -> None:
            for _ in range(steps):
                await c.step(ACTION)

        gc.collect()
        marks.start()
        await asyncio.gather(*(run(c) for c in clients))
        marks.stop()
        return {"n": sessions * steps, "on_valgrind": marks.on_valgrind}

    async def close(self) -> None:
        for clients in self.sessions.values():
            await asyncio.gather(*(c.close() for c in clients))


class ThreadsRunner:
    """T threads, each owning a sync client of its own (TRL's tool thread pool's shape).

    envlink's sync clients share the default bridge (one loop thread); each of
    OpenEnv's ``.sync()`` clients runs its own loop thread.
    """

    def __init__(self, client: str, urls: list[str]) -> None:
        self.client = client
        self.urls = urls
        self.clients: list[Any] = []
        self.threads = 0

    def _new(self, i: int) -> Any:
        url = self.urls[i % len(self.urls)]
        if self.client == "envlink":
            from envlink import GenericEnvClient

            env = GenericEnvClient(base_url=url).sync()
        else:
            env = openenv_client_class(self.client)(base_url=url, message_timeout_s=120).sync()
            env.__enter__()
        env.reset()
        return env

    def _close_all(self) -> None:
        for env in self.clients:
            if self.client == "envlink":
                env.close()
            else:
                env.__exit__(None, None, None)
        self.clients = []

    def run(self, threads: int, steps: int, server_pids: list[int] | None = None,
            ) -> dict[str, Any]:
        import threading
        from concurrent.futures import ThreadPoolExecutor

        out: dict[str, Any] = {}
        if threads != self.threads:
            self._close_all()
            gc.collect()
            before = rss_bytes()
            with ThreadPoolExecutor(max_workers=8) as pool:
                self.clients = list(pool.map(self._new, range(threads)))
            gc.collect()
            out["idle_bytes_per_session"] = (rss_bytes() - before) / threads
            self.threads = threads
            for env in self.clients:
                env.step(ACTION)
        perf = time.perf_counter
        lats = [array("d") for _ in range(threads)]
        start = threading.Barrier(threads + 1)

        def work(i: int) -> None:
            env, lat = self.clients[i], lats[i]
            step = env.step
            start.wait()
            for _ in range(steps):
                s = perf()
                step(ACTION)
                lat.append(perf() - s)

        workers = [threading.Thread(target=work, args=(i,), daemon=True)
                   for i in range(threads)]
        for w in workers:
            w.start()
        pids = server_pids or []
        gc.collect()
        server0 = [process_cpu_s(p) for p in pids]
        cpu0, t0 = time.process_time(), perf()
        start.wait()
        for w in workers:
            w.join()
        wall, cpu = perf() - t0, time.process_time() - cpu0
        server1 = [process_cpu_s(p) for p in pids]
        total = threads * steps
        out.update(n=total, wall_s=wall, steps_per_s=total / wall,
                   cpu_us_per_step=cpu / total * 1e6,
                   **_pct(x for lat in lats for x in lat))
        if pids:
            spent = [b - a for a, b in zip(server0, server1, strict=True)]
            out["server_cpu_us_per_step"] = sum(spent) / total * 1e6
            out["server_busy"] = [s / wall for s in spent]
        return out

    def close(self) -> None:
        self._close_all()


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=["envlink", "openenv", "openenv-stock", "floor",
                                             "floor-picows", "bridge", "rcts"], required=True)
    parser.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                        help="the event loop this process runs its async clients on (the "
                             "application's choice: envlink never replaces it)")
    parser.add_argument("--mode", choices=["sync", "async", "scale", "threads"], required=True)
    parser.add_argument("--telemetry", default="off")
    parser.add_argument("--otlp-endpoint", default=None)
    parser.add_argument("--url", default="", help="server URL (scale, threads: comma-separated)")
    parser.add_argument("--cpu", type=int, default=None,
                        help="pin this process (and every thread it starts) to this core")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})  # before any thread: they inherit it
    marks: Any = None
    if os.environ.get("ENVLINK_CALLGRIND_MARKS"):
        from _callgrind import Marks

        marks = Marks(os.environ["ENVLINK_CALLGRIND_MARKS"])

    # The protocol stream is a private copy of stdout; fd 1 becomes stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def answer(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")

    telemetry = _TelemetrySetup(args.telemetry, args.otlp_endpoint)
    if args.mode == "threads":
        threads = ThreadsRunner(args.client, args.url.split(","))
        answer({"ready": True, "rss": rss_bytes()})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            answer(threads.run(int(cmd["threads"]), int(cmd["steps"]), cmd.get("server_pids")))
        threads.close()
    elif args.mode == "sync":
        runner = SyncRunner(args.client, args.url, nested=args.telemetry == "sdk-nested")
        answer({"ready": True, "rss": rss_bytes()})
        for line in sys.stdin:
            cmd = json.loads(line)
            if cmd["op"] == "quit":
                break
            if cmd["op"] == "count":
                answer(runner.count(int(cmd["n"]), marks))
                continue
            result = runner.steps(int(cmd["n"]))
            result.update(telemetry.after_round())
            answer(result)
        runner.close()
    else:
        async def serve() -> None:
            loop = asyncio.get_running_loop()
            runner: AsyncRunner | ScaleRunner
            if args.mode == "async":
                runner = AsyncRunner(args.client, args.url)
                await runner.setup()
            else:
                runner = ScaleRunner(args.client, args.url.split(","))
            answer({"ready": True, "rss": rss_bytes()})
            while True:
                # Reading stdin in a worker thread keeps the loop running between
                # commands (so WebSocket pings are answered); the reader is
                # blocked in read() while steps are timed.
                line = await loop.run_in_executor(None, sys.stdin.readline)
                if not line:
                    break
                cmd = json.loads(line)
                if cmd["op"] == "quit":
                    break
                if cmd["op"] == "count" and isinstance(runner, AsyncRunner):
                    result = await runner.count(int(cmd["n"]), marks)
                elif cmd["op"] == "count" and isinstance(runner, ScaleRunner):
                    result = await runner.count(int(cmd["sessions"]), int(cmd["steps"]), marks)
                elif isinstance(runner, ScaleRunner):
                    result = await runner.scale(int(cmd["sessions"]), int(cmd["steps"]),
                                                cmd.get("server_pids"))
                else:
                    result = await runner.steps(int(cmd["n"]))
                    result.update(telemetry.after_round())
                answer(result)
            await runner.close()

        if args.loop == "uvloop":
            import uvloop

            uvloop.run(serve())
        else:
            asyncio.run(serve())
    telemetry.shutdown()
    answer({"bye": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
