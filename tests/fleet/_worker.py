"""A process of the fleet, for the tests: ``python _worker.py JSON``.

Modes (``mode`` in the JSON):

- ``hold``: open ``sessions`` sessions, print ``held``, then keep them until stdin
  closes (a test SIGKILLs it while it holds them).
- ``churn``: ``rounds`` times, open ``sessions`` sessions at once, step each, close
  them; print one JSON line of every session's ``[opened, closing]`` (CLOCK_MONOTONIC,
  shared by the processes of a host), and the seconds the process took.
- ``pool``: an ``EnvPool`` of ``sessions`` over ``urls``, ``episodes`` resets of
  ``steps`` steps, once a line comes on stdin (so that processes start together);
  print one JSON line of the errors its slots answered.
- ``starts``: ``starts`` clients with a provider each (started on connect), paced and
  bounded by the fleet; print one JSON line of the start times (wall clock).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

import envlink


def _config(spec: dict[str, Any]) -> envlink.ClientConfig:
    return envlink.ClientConfig(fleet=envlink.FleetLimits(**spec["fleet"]),
                                timeout=envlink.Timeout(spec.get("timeout", 30.0)))


async def _hold(spec: dict[str, Any]) -> None:
    config = _config(spec)
    clients = [envlink.GenericEnvClient(spec["url"], config=config)
               for _ in range(spec["sessions"])]
    await asyncio.gather(*(c.reset() for c in clients))
    print("held", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await asyncio.gather(*(c.close() for c in clients))


async def _churn(spec: dict[str, Any]) -> None:
    config = _config(spec)
    spans: list[list[float]] = []
    errors: list[str] = []
    start = time.monotonic()

    async def one() -> None:
        client = envlink.GenericEnvClient(spec["url"], config=config)
        try:
            await client.reset()
            opened = time.monotonic()
            for _ in range(spec.get("steps", 1)):
                await client.step({"message": "x"})
            spans.append([opened, time.monotonic()])
        except envlink.EnvlinkError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            await client.close()

    print("ready", flush=True)
    for _ in range(spec["rounds"]):
        await asyncio.gather(*(one() for _ in range(spec["sessions"])))
    print(json.dumps({"spans": spans, "errors": errors,
                      "seconds": time.monotonic() - start}), flush=True)


class _Provider:
    """A runtime provider whose server is already running: records when it starts."""

    def __init__(self, url: str, starts: list[float]) -> None:
        self.url = url
        self.starts = starts

    def start(self) -> str:
        self.starts.append(time.time())
        return self.url

    def wait_for_ready(self, timeout_s: float = 30.0) -> None:
        pass

    def stop(self) -> None:
        pass


async def _starts(spec: dict[str, Any]) -> None:
    config = _config(spec)
    starts: list[float] = []
    clients = [envlink.GenericEnvClient(provider=_Provider(spec["url"], starts), config=config)
               for _ in range(spec["starts"])]
    print("ready", flush=True)
    await asyncio.gather(*(c.reset() for c in clients))
    await asyncio.gather(*(c.close() for c in clients))
    print(json.dumps({"starts": starts}), flush=True)


async def _pool(spec: dict[str, Any]) -> None:
    config = _config(spec)
    errors: list[str] = []
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
    async with envlink.EnvPool(spec["urls"], spec["sessions"], client_config=config,
                               batch_timeout=spec.get("timeout", 30.0)) as pool:
        for _ in range(spec["episodes"]):
            results = list(await pool.reset())
            for _ in range(spec.get("steps", 2)):
                results += list(await pool.step([{"message": "x"}] * spec["sessions"]))
            errors += [f"{type(r).__name__}: {r}" for r in results
                       if isinstance(r, BaseException)]
    print(json.dumps({"errors": errors, "end": time.monotonic()}), flush=True)


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    modes = {"hold": _hold, "churn": _churn, "starts": _starts, "pool": _pool}
    asyncio.run(modes[spec["mode"]](spec))
