"""Environment packages' OpenEnv clients, adopted by envlink unedited, one scenario per run.

``python adopt_driver.py SCENARIO URL`` runs under envlink's interpreter with the
openenv virtualenv's site-packages appended to the path (``OPENENV_SITE``: a user's
environment holds both libraries) and the packages' directories
(``ADOPT_PACKAGES``) in front. Prints one JSON line: what each client saw.

Scenarios:

- ``template URL``: the client of a package made by ``openenv init`` (OpenEnv's own
  template: its own action and observation models), OpenEnv's class against the
  adopted one, used blocking, through ``.sync()``, with ``await``, from
  ``from_docker_image`` / ``from_env`` (a container provider of OpenEnv's that runs
  the package's server as a process), in a pool and in the TRL adapter.
- ``echo URL``: the echo package's ``MCPToolClient`` subclass, OpenEnv's against
  the adopted one.
- ``echo_on_envlink URL``: the same adopted client against ``envlink serve`` (and,
  with ``WITH_OPENENV=1``, OpenEnv's own class too).
- ``counter URL``: the counter package's typed client under ``on_session_lost``,
  through a proxy the test set to cut the connection mid-episode.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

sys.path.append(os.environ["OPENENV_SITE"])
sys.path[:0] = [p for p in os.environ.get("ADOPT_PACKAGES", "").split(os.pathsep) if p]

import envlink  # noqa: E402

SCENARIO, URL = sys.argv[1:3]
HEADERS = json.loads(os.environ.get("ADOPT_HEADERS", "{}"))


def dump(value: Any) -> Any:
    """A JSON view of a result, with the class of each model."""
    if hasattr(value, "model_dump"):
        return {"class": type(value).__name__, **value.model_dump(mode="json")}
    if hasattr(value, "observation"):
        return {"observation": dump(value.observation), "reward": value.reward,
                "done": value.done}
    if isinstance(value, list):
        return [dump(v) for v in value]
    return value


# ----------------------------------------------------------------- openenv init's package


def template() -> dict[str, Any]:
    from openenv.core.containers.runtime.providers import ContainerProvider
    from tally_env import TallyAction, TallyEnv

    from envlink.integrations.trl import EnvlinkEnvironment

    Tally = envlink.adopt(TallyEnv)

    def episode(env: Any) -> list[Any]:
        return [dump(env.reset()), dump(env.step(TallyAction(message="hello"))),
                dump(env.step(TallyAction(message="hi"))), dump(env.state())["step_count"]]

    async def aepisode(env: Any) -> list[Any]:
        return [dump(await env.reset()), dump(await env.step(TallyAction(message="hello"))),
                dump(await env.step(TallyAction(message="hi"))),
                dump(await env.state())["step_count"]]

    out: dict[str, Any] = {"adopted_is_envlink": issubclass(Tally, envlink.EnvClient),
                           "name": Tally.__name__}
    with TallyEnv(base_url=URL).sync() as env:
        out["openenv"] = episode(env)
    with Tally(base_url=URL, on_session_lost="auto") as env:
        out["plain"] = episode(env)
    with Tally(base_url=URL).sync() as env:
        out["facade"] = episode(env)

    async def run_async() -> list[Any]:
        async with Tally(base_url=URL) as env:
            return await aepisode(env)

    out["async"] = asyncio.run(run_async())

    class ProcessProvider(ContainerProvider):  # type: ignore[misc]
        """An OpenEnv container provider that "runs the image" as the package's server."""

        def __init__(self) -> None:
            self.images: list[str] = []
            self.process: subprocess.Popen[bytes] | None = None
            self.stopped = False

        def start_container(self, image: str, port: int | None = None,
                            env_vars: Any = None, **kwargs: Any) -> str:
            self.images.append(image)
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            self.process = subprocess.Popen(
                [os.environ["OPENENV_PYTHON"], os.environ["PACKAGE_SERVER"], "--port",
                 str(port), "--package-dir", os.environ["TEMPLATE_DIR"], "--package",
                 "tally_env"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "ENABLE_WEB_INTERFACE": "false"})
            return f"http://127.0.0.1:{port}"

        def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
            end = time.monotonic() + timeout_s
            while True:
                try:
                    with urllib.request.urlopen(f"{base_url}/health", timeout=2):
                        return
                except OSError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.1)

        def stop_container(self) -> None:
            assert self.process is not None
            self.process.terminate()
            self.process.wait(10)
            self.stopped = True

    docker = ProcessProvider()
    env = Tally.from_docker_image("tally-env:latest", provider=docker).sync()
    try:
        out["from_docker_image"] = episode(env)
    finally:
        env.close()
    space = ProcessProvider()
    env = Tally.from_env("someone/tally-env", provider=space).sync()
    try:
        out["from_env"] = episode(env)
    finally:
        env.close()
    out["providers"] = {"images": docker.images + space.images,
                        "stopped": [docker.stopped, space.stopped]}

    with envlink.EnvPool(URL, 2, client=Tally).sync() as pool:
        first = pool.reset()
        batch = pool.step([TallyAction(message="a"), TallyAction(message="bcd")])
        out["pool"] = [dump(r) for r in first.results()] + [dump(r) for r in batch.results()]

    class TallyTool(EnvlinkEnvironment):
        client_class = Tally

        def say(self, message: str) -> str:
            """Say something.

            Args:
                message: the text.
            """
            return str(self._step(TallyAction(message=message)).observation.echoed_message)

    tool = TallyTool(base_url=URL, session_mode="release")
    tool.reset()
    out["trl"] = [tool.say("tool"), tool.episode_reward]
    return out


# ----------------------------------------------------------------------- the echo package


def echo() -> dict[str, Any]:
    from echo_env import EchoEnv
    from openenv.core.env_server.mcp_types import CallToolAction

    Echo = envlink.adopt(EchoEnv)

    async def session(env: Any) -> dict[str, Any]:
        async with env:
            await env.reset()
            tools = await env.list_tools()
            cached = await env.list_tools()
            fresh = await env.list_tools(use_cache=False)
            step = await env.step(CallToolAction(tool_name="echo_with_length",
                                                  arguments={"message": "step"}))
            return {
                "tools": sorted(t.name for t in tools),
                "tool_class": type(tools[0]).__name__,
                "cached_same": cached is tools, "fresh_same": sorted(
                    t.name for t in fresh) == sorted(t.name for t in tools),
                "has": [await env.has_tool("echo_message"), await env.has_tool("nope")],
                "schema": (await env.get_tool("echo_message")).input_schema["required"],
                "call": await env.call_tool("echo_message", message="Hello!"),
                "call_length": await env.call_tool("echo_with_length", message="Test"),
                "step": [type(step.observation).__name__, step.observation.tool_name,
                         step.observation.error],
                "step_count": (await env.state()).step_count,
                "mode": env.use_production_mode,
            }

    out = {"openenv": asyncio.run(session(EchoEnv(base_url=URL))),
           "adopted": asyncio.run(session(Echo(base_url=URL, on_session_lost="auto")))}
    with Echo(base_url=URL) as env:
        env.reset()
        out["plain"] = [[t.name for t in env.list_tools()],
                        env.call_tool("echo_message", message="plain")]
    return out


def echo_on_envlink() -> dict[str, Any]:
    """The echo package's MCPToolClient, adopted, against ``envlink serve`` (and OpenEnv's
    own class, where the server offers HTTP MCP sessions): tools listed and called over
    POST /mcp on the client's session, errors typed."""
    from echo_env import EchoEnv

    Echo = envlink.adopt(EchoEnv)

    async def session(env: Any) -> dict[str, Any]:
        async with env:
            await env.reset()
            tools = await env.list_tools()
            out: dict[str, Any] = {
                "tools": sorted(t.name for t in tools),
                "tool_class": type(tools[0]).__name__,
                "call": await env.call_tool("echo_message", message="Hello!"),
                "call_length": await env.call_tool("echo_with_length", message="Test"),
            }
            try:
                await env.call_tool("nope")
            except Exception as exc:
                out["unknown"] = [type(exc).__name__, isinstance(exc, RuntimeError)]
            out["step_count"] = (await env.state()).step_count
            return out

    out = {"adopted": asyncio.run(session(Echo(base_url=URL)))}
    if os.environ.get("WITH_OPENENV") == "1":
        out["openenv"] = asyncio.run(session(EchoEnv(base_url=URL)))
    return out


# -------------------------------------------------------------------- the counter package


def counter() -> dict[str, Any]:
    from counter_env import CounterAction, CounterEnv, CounterObservation, CounterState

    Counter = envlink.adopt(CounterEnv)
    policy = os.environ.get("ADOPT_POLICY", "resume")
    reconnect = envlink.ReconnectPolicy(max_attempts=8, initial_delay=0.05, max_delay=0.5,
                                        max_elapsed=20.0)
    deltas = [1, 2, 3, 4, 5, 6]
    out: dict[str, Any] = {"unknown": []}
    with Counter(base_url=URL, headers=HEADERS, on_session_lost=policy, timeout=15.0,
                 reconnect=reconnect) as env:
        env.reset(seed=11, start=0, target=1000)
        totals = []
        for index, delta in enumerate(deltas):
            try:
                result = env.step(CounterAction(delta=delta))
            except envlink.OutcomeUnknownError as exc:
                out["unknown"].append({"index": index, "applied": exc.applied})
                continue
            assert isinstance(result.observation, CounterObservation)
            totals.append(result.observation.total)
        state = env.state()
        assert isinstance(state, CounterState)
        out.update(totals=totals, step_count=state.step_count, total=state.total,
                   recovery=env.recovery)
    return out


if __name__ == "__main__":
    print(json.dumps({"template": template, "echo": echo, "counter": counter,
                      "echo_on_envlink": echo_on_envlink}[SCENARIO]()))
