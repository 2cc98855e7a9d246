"""A 0.10 user's ``provider=`` code on OpenEnv's client or envlink's: only the import differs.

``python provider_parity.py openenv|envlink SERVER_PYTHON SERVER_SCRIPT`` runs one
episode through ``GenericEnvClient(provider=...)`` with a subclass of OpenEnv's own
``RuntimeProvider`` that starts the real OpenEnv counter server, opens a
``new_session()`` child, closes, and prints what happened as JSON (the server's
pid, whether it is still running after close).

Under envlink's interpreter, OpenEnv's ``providers`` module (standard library only)
is loaded from the openenv virtualenv by path: the same class, unmodified.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

WHICH, SERVER_PYTHON, SERVER_SCRIPT = sys.argv[1:4]

if WHICH == "openenv":
    from openenv.core import GenericEnvClient
    from openenv.core.containers.runtime.providers import RuntimeProvider
else:
    from envlink import GenericEnvClient  # the one line a user changes

    _path = os.environ["OPENENV_PROVIDERS_PY"]
    _spec = importlib.util.spec_from_file_location("openenv_providers", _path)
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
    RuntimeProvider = _module.RuntimeProvider


class CounterServerProvider(RuntimeProvider):  # type: ignore[misc,valid-type]
    """What a 0.10 user writes: start a server process, poll /health, stop it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.base_url: str | None = None

    def start(self, port=None, env_vars=None, **kwargs):  # type: ignore[no-untyped-def]
        if port is None:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
        self.process = subprocess.Popen(
            [SERVER_PYTHON, SERVER_SCRIPT, "--port", str(port), "--max-sessions", "4"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={**os.environ, "ENABLE_WEB_INTERFACE": "false"})
        self.base_url = f"http://127.0.0.1:{port}"
        return self.base_url

    def wait_for_ready(self, timeout_s=120.0):  # type: ignore[no-untyped-def]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                with urllib.request.urlopen(f"{self.base_url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.base_url} not ready")

    def stop(self):  # type: ignore[no-untyped-def]
        if self.process is not None:
            self.process.terminate()
            self.process.wait(20)
            self.process = None


async def main() -> dict[str, object]:
    provider = CounterServerProvider()
    client = GenericEnvClient(provider=provider, message_timeout_s=120.0)
    await client.connect()
    pid = provider.process.pid if provider.process is not None else None
    reset = await client.reset()
    step = await client.step({"delta": 3})
    child = await client.new_session()
    child_step = await child.step({"delta": 5})
    state = await client.state()
    same_server = child.base_url == client.base_url
    await client.close()
    return {
        "pid": pid,
        "reset_done": reset.done,
        "step_observation": step.observation,
        "child_observation": child_step.observation,
        "child_same_server": same_server,
        "state_step_count": state["step_count"] if isinstance(state, dict) else state.step_count,
        "stopped": provider.process is None,
    }


print(json.dumps(asyncio.run(main()), default=str))
