"""One benchmark client process, driven by ``run.py`` over stdin/stdout.

Runs under the virtualenv of the client it measures: envlink's (``--client
envlink`` or ``floor``) or OpenEnv's (``--client openenv``, which imports
``openenv`` and never ``envlink``). It sets up one client, then answers one JSON
line per command read from stdin:

* ``{"op": "steps", "n": N}``: N sequential steps, each timed;
  answers per-step latency percentiles, steps/s and the process CPU per step
  (every thread of this process: the bridge's loop thread and the SDK's export
  threads are client CPU too);
* ``{"op": "scale", "sessions": S, "steps": K}``: (``--mode scale``) S sessions
  on this one event loop, K concurrent steps each; the first command per S
  also opens the sessions and reports the memory per idle session; with
  ``"server_pid": P``, also the CPU time process P (the server) spent per step
  while they ran;
* ``{"op": "count", "n": N}``: N sequential steps, untimed, with callgrind
  counting around them (``_callgrind.Marks``; the process runs under callgrind
  and ``ENVLINK_CALLGRIND_MARKS`` names the marks library), once per process;
* ``{"op": "quit"}``.

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
from collections.abc import Awaitable, Callable
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

        if mode in ("sdk", "sdk-exemplars", "sdk-nested", "sdk-sampled"):
            self.handle = envlink.telemetry.configure(
                service_name="bench", span_exporters=[DropExporter()],
                metric_readers=[InMemoryMetricReader()],
                trace_sample_ratio=0.1 if mode == "sdk-sampled" else None)
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


class ScaleRunner:
    """Many sessions of one client on this process's one event loop."""

    def __init__(self, client: str, url: str) -> None:
        self.client = client
        self.url = url
        self.sessions: dict[int, list[Any]] = {}

    def _new(self) -> Any:
        if self.client == "envlink":
            from envlink import GenericEnvClient

            return GenericEnvClient(base_url=self.url)
        from openenv.core import GenericEnvClient as OpenEnvClient

        return OpenEnvClient(base_url=self.url, message_timeout_s=120)

    async def _open(self, count: int) -> tuple[list[Any], float]:
        gc.collect()
        before = rss_bytes()
        clients = [self._new() for _ in range(count)]
        # Open in batches: a thousand simultaneous handshakes would measure the
        # server's accept queue, not the client.
        for i in range(0, count, 50):
            batch = clients[i:i + 50]
            if self.client == "openenv":
                await asyncio.gather(*(c.connect() for c in batch))
            await asyncio.gather(*(c.reset() for c in batch))
        gc.collect()
        return clients, (rss_bytes() - before) / count

    async def scale(self, sessions: int, steps: int, server_pid: int | None = None,
                    ) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if sessions not in self.sessions:
            for other in list(self.sessions):  # one population at a time
                await asyncio.gather(*(c.close() for c in self.sessions.pop(other)))
            clients, per_session = await self._open(sessions)
            self.sessions[sessions] = clients
            out["idle_bytes_per_session"] = per_session
            for c in clients:  # warm up every session
                await c.step(ACTION)
        clients = self.sessions[sessions]

        async def run(c: Any) -> None:
            for _ in range(steps):
                await c.step(ACTION)

        gc.collect()
        server0 = process_cpu_s(server_pid) if server_pid is not None else 0.0
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(run(c) for c in clients))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        total = sessions * steps
        out.update(n=total, steps_per_s=total / wall, cpu_us_per_step=cpu / total * 1e6)
        if server_pid is not None:
            # The server's CPU over the same window (it serves only this client then),
            # read in clock ticks: to about 10 ms.
            out["server_cpu_us_per_step"] = (process_cpu_s(server_pid) - server0) / total * 1e6
        return out

    async def close(self) -> None:
        for clients in self.sessions.values():
            await asyncio.gather(*(c.close() for c in clients))


# ------------------------------------------------------------------ main


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", choices=["envlink", "openenv", "floor", "bridge", "rcts"],
                        required=True)
    parser.add_argument("--mode", choices=["sync", "async", "scale"], required=True)
    parser.add_argument("--telemetry", default="off")
    parser.add_argument("--otlp-endpoint", default=None)
    parser.add_argument("--url", default="")
    args = parser.parse_args()
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
    if args.mode == "sync":
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
                runner = ScaleRunner(args.client, args.url)
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
                elif isinstance(runner, ScaleRunner):
                    result = await runner.scale(int(cmd["sessions"]), int(cmd["steps"]),
                                                cmd.get("server_pid"))
                else:
                    result = await runner.steps(int(cmd["n"]))
                    result.update(telemetry.after_round())
                answer(result)
            await runner.close()

        asyncio.run(serve())
    telemetry.shutdown()
    answer({"bye": True})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
