"""The public-behaviour cases of OpenEnv 0.10's client tests, on OpenEnv's client or envlink's.

``python parity_cases.py openenv|envlink CONFIG_JSON`` runs every case with the
library named (OpenEnv's under the openenv virtualenv's python, envlink's under
envlink's, neither seeing the other), against the real loopback servers named in
the config, and prints one JSON object: per case, whether it passed, its error, and
the value it returned (compared across the libraries by the test). Only the imports
differ between the two runs, as for a user migrating.

The cases are written from what OpenEnv's tests check (``tests/test_core/
test_generic_client.py``, ``test_client_provider_cleanup.py``,
``test_env_client_capacity.py``, ``test_env_client_headers.py``,
``tests/core/test_mcp/test_mcp_client.py``, ``tests/core/test_mode_selection.py``,
``tests/envs/test_mcp_client_close.py``), against servers instead of mocks.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

LIB = sys.argv[1]
CONFIG: dict[str, str] = json.loads(sys.argv[2])
CASE_TIMEOUT = 30

if LIB == "openenv":
    from openenv import AutoAction, AutoEnv
    from openenv.core import GenericEnvClient, SyncEnvClient
    from openenv.core.client_types import StepResult
    from openenv.core.generic_client import GenericAction
    from openenv.core.mcp_client import MCPToolClient
else:
    from envlink import (
        AutoAction,
        AutoEnv,
        GenericAction,
        GenericEnvClient,
        MCPToolClient,
        StepResult,
        SyncEnvClient,
    )

CASES: dict[str, Callable[[], Any]] = {}
RESET = {"seed": 7, "start": 0, "target": 100}


def case(fn: Callable[[], Any]) -> Callable[[], Any]:
    CASES[fn.__name__] = fn
    return fn


def check(condition: object, message: str = "") -> None:
    if not condition:
        raise AssertionError(message or "check failed")


def raises(kind: type[BaseException], call: Callable[[], Any]) -> BaseException:
    """The exception ``call`` raises, checked to be a ``kind``."""
    try:
        result = call()
        if inspect.isawaitable(result):
            asyncio.run(_await(result))
    except kind as exc:
        return exc
    except BaseException as exc:
        raise AssertionError(f"expected {kind.__name__}, got {type(exc).__name__}: {exc}"
                             ) from exc
    raise AssertionError(f"expected {kind.__name__}, nothing was raised")


async def _await(awaitable: Any) -> Any:
    return await awaitable


def obs(result: Any) -> Any:
    check(isinstance(result, StepResult), f"not a StepResult: {type(result).__name__}")
    return {"observation": result.observation, "reward": result.reward, "done": result.done}


class RecordingProvider:
    """A container provider whose "container" is the already running counter server."""

    def __init__(self, start_error: BaseException | None = None,
                 stop_error: BaseException | None = None) -> None:
        self.starts: list[list[Any]] = []
        self.stops = 0
        self.start_error = start_error
        self.stop_error = stop_error

    def start_container(self, image: str | None = None, port: int | None = None,
                        env_vars: dict[str, str] | None = None, **kwargs: Any) -> str:
        self.starts.append([image, env_vars])
        if self.start_error is not None:
            raise self.start_error
        return CONFIG["counter"]

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        return None

    def stop_container(self) -> None:
        self.stops += 1
        if self.stop_error is not None:
            raise self.stop_error


# ------------------------------------------------------------------- generic client


@case
def sync_close_leaves_no_loop_thread() -> Any:
    # First case of the run: no client has started a thread yet.
    import threading

    before = set(threading.enumerate())
    with GenericEnvClient(base_url=CONFIG["counter"]).sync() as env:
        env.reset(**RESET)
    left = [t.name for t in set(threading.enumerate()) - before if t.is_alive()]
    check(not left, f"threads still alive after close(): {left}")
    return True


@case
def base_url_is_normalized_and_read_only() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"] + "/")
    check(client.base_url == CONFIG["counter"], repr(client.base_url))
    raises(AttributeError, lambda: setattr(client, "base_url", "http://127.0.0.1:9"))
    provider_only = GenericEnvClient(provider=RecordingProvider())
    return provider_only.base_url


@case
def client_without_url_or_provider_is_value_error() -> Any:
    raises(ValueError, GenericEnvClient)


@case
def generic_hooks_pass_dicts_through() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"])
    nested = {"command": "run", "params": {"file": "t.py", "args": ["-v"]}}
    check(client._step_payload(nested) == nested)
    check(client._step_payload({}) == {})
    full = client._parse_result({"observation": {"stdout": "hi"}, "reward": 1.5, "done": True})
    minimal = client._parse_result({})
    check(client._parse_state({"episode_id": "e", "step_count": 5, "x": 1})
          == {"episode_id": "e", "step_count": 5, "x": 1})
    return [obs(full), obs(minimal)]


@case
def sync_wrapper_runs_an_episode() -> Any:
    facade = GenericEnvClient(base_url=CONFIG["counter"]).sync()
    check(isinstance(facade, SyncEnvClient))
    with facade as env:
        check(isinstance(env, SyncEnvClient))
        results = [obs(env.reset(**RESET)), obs(env.step({"delta": 2})),
                   obs(env.step({"delta": 3}))]
        state = env.state()
    return [results, state["step_count"], state["total"]]


@case
def plain_calls_block_and_return_results() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"])
    with client as env:
        check(env is client, "with returns the client itself")
        first = env.reset(**RESET)
        check(not inspect.iscoroutine(first), "reset() returned a coroutine in plain code")
        step = env.step({"delta": 4})
        return [obs(first), obs(step), env.state()["step_count"]]


@case
def async_episode_with_async_with() -> Any:
    async def run() -> Any:
        async with GenericEnvClient(base_url=CONFIG["counter"]) as env:
            check(isinstance(env, GenericEnvClient))
            first = await env.reset(**RESET)
            step = await env.step({"delta": 5})
            return [obs(first), obs(step), (await env.state())["step_count"]]

    return asyncio.run(run())


@case
def new_session_is_an_independent_child() -> Any:
    async def run() -> Any:
        async with GenericEnvClient(base_url=CONFIG["counter"]) as env:
            await env.reset(**RESET)
            await env.step({"delta": 1})
            child = await env.new_session()
            check(isinstance(child, GenericEnvClient) and child is not env)
            check(child.base_url == env.base_url)
            await child.reset(**RESET)
            return [(await child.state())["step_count"], (await env.state())["step_count"]]

    return asyncio.run(run())


@case
def sync_wrapper_new_session_is_a_sync_client() -> Any:
    with GenericEnvClient(base_url=CONFIG["counter"]).sync() as env:
        child = env.new_session()
        check(isinstance(child, SyncEnvClient), type(child).__name__)
        check(isinstance(child.async_client, GenericEnvClient))
        return obs(child.reset(**RESET))["observation"]


@case
def sync_client_exposes_async_client_and_hooks() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"])
    facade = client.sync()
    check(facade.async_client is client)
    check(facade._step_payload({"a": 1}) == {"a": 1})
    return obs(facade._parse_result({"observation": {"o": 1}, "reward": 1.0}))


@case
def plain_call_after_async_connect_returns_a_result() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"])

    async def connect() -> None:
        await client.connect()

    asyncio.run(connect())
    result = client.reset(**RESET)
    check(not inspect.iscoroutine(result), "reset() returned a coroutine in plain code")
    out = obs(result)
    client.close()
    return out


@case
def sync_locked_client_inside_a_running_loop_returns_the_result() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"])
    facade = client.sync()
    facade.connect()
    try:
        async def inside() -> Any:
            result = client.reset(**RESET)
            check(isinstance(result, StepResult), f"got {type(result).__name__}")
            return result.observation

        return asyncio.run(inside())
    finally:
        facade.close()


@case
def ping_and_timeout_options_are_accepted() -> Any:
    client = GenericEnvClient(base_url=CONFIG["counter"], connect_timeout_s=30.0,
                              message_timeout_s=120.0, websocket_ping_interval_s=None,
                              websocket_ping_timeout_s=None)
    with client.sync() as env:
        return obs(env.reset(**RESET))["observation"]


# ------------------------------------------------------------------ providers, factories


@case
def from_docker_image_is_lazy_then_sync_connects() -> Any:
    provider = RecordingProvider()
    handle = GenericEnvClient.from_docker_image("coding-env:latest", provider=provider,
                                                env_vars={"DEBUG": "1"})
    check(provider.starts == [], "started before the handle was resolved")
    client = handle.sync()
    check(isinstance(client, SyncEnvClient))
    check(client.base_url == CONFIG["counter"], repr(client.base_url))
    with client:
        result = client.reset(**RESET)
    check(provider.stops == 1, f"stopped {provider.stops} times")
    return [provider.starts, obs(result)["observation"]]


@case
def from_docker_image_awaited_gives_a_connected_client() -> Any:
    provider = RecordingProvider()

    async def run() -> Any:
        client = await GenericEnvClient.from_docker_image("my-env:latest", provider=provider)
        check(isinstance(client, GenericEnvClient))
        async with client:
            result = await client.reset(**RESET)
        return obs(result)["observation"]

    observation = asyncio.run(run())
    check(provider.stops == 1, f"stopped {provider.stops} times")
    return [provider.starts, observation]


@case
def factory_handle_runs_under_asyncio_run() -> Any:
    provider = RecordingProvider()
    handle = GenericEnvClient.from_docker_image("coding-env:latest", provider=provider)
    check(asyncio.iscoroutine(handle), "the handle is not a coroutine")
    client = asyncio.run(handle)
    check(isinstance(client, GenericEnvClient))
    client.close()  # plain code after asyncio.run: the call blocks
    return [len(provider.starts), provider.stops]


@case
def factory_handle_is_single_use() -> Any:
    provider = RecordingProvider()
    handle = GenericEnvClient.from_docker_image("coding-env:latest", provider=provider)
    client = handle.sync()
    try:
        message = str(raises(RuntimeError, handle.sync))
        check("already" in message and "resolved" in message, message)
    finally:
        client.close()
    return [len(provider.starts), provider.stops]


@case
def invalid_mode_leaves_no_container_running() -> Any:
    provider = RecordingProvider()
    os.environ["OPENENV_CLIENT_MODE"] = "not-a-valid-mode"
    try:
        raises(ValueError, lambda: GenericEnvClient.from_env(
            "user/my-env", use_docker=True, provider=provider).sync())
    finally:
        del os.environ["OPENENV_CLIENT_MODE"]
    check(len(provider.starts) == provider.stops, f"{provider.starts} {provider.stops}")
    return True


@case
def from_env_runs_the_spaces_registry_image() -> Any:
    provider = RecordingProvider()
    client = GenericEnvClient.from_env("user/my-env", use_docker=True, provider=provider).sync()
    client.close()
    check(str(provider.starts[0][0]).startswith("registry.hf.space/user-my-env"))
    return provider.stops


@case
def provider_client_starts_once_shares_with_children_stops_once() -> Any:
    provider = RecordingProvider()

    async def run() -> Any:
        client = GenericEnvClient(provider=provider)
        check(client.base_url is None)
        await client.connect()
        check(client.base_url == CONFIG["counter"])
        child = await client.new_session()
        check(child.base_url == CONFIG["counter"])
        await client.close()
        await client.close()

    asyncio.run(run())
    return [len(provider.starts), provider.stops]


@case
def provider_start_error_keeps_its_type() -> Any:
    error = ValueError("start failed")
    provider = RecordingProvider(start_error=error)
    client = GenericEnvClient(provider=provider)
    # Catchable by the provider's own type, with its message (envlink raises a
    # ProviderError that also derives from ValueError, chained to the original).
    caught = raises(ValueError, client.connect)
    check(caught is error or caught.__cause__ is error, f"got {caught!r}")
    check("start failed" in str(caught), f"got {caught!r}")
    return len(provider.starts)


@case
def failed_provider_stop_is_raised_by_close() -> Any:
    error = RuntimeError("container still running")
    provider = RecordingProvider(stop_error=error)

    async def run() -> BaseException:
        client = GenericEnvClient(provider=provider)
        await client.connect()
        try:
            await client.close()
        except RuntimeError as exc:
            return exc
        raise AssertionError("close() hid the failed stop")

    caught = asyncio.run(run())
    check(caught is error or caught.__cause__ is error, f"got {caught!r}")
    return provider.stops >= 1


# --------------------------------------------------------------- capacity and headers


@case
def capacity_refusal_is_a_runtime_error() -> Any:
    async def run() -> str:
        async with GenericEnvClient(base_url=CONFIG["capacity"]) as holder:
            await holder.reset()
            refused = GenericEnvClient(base_url=CONFIG["capacity"])
            try:
                try:
                    await refused.connect()
                    await refused.reset()
                except RuntimeError as exc:
                    return str(exc)
                raise AssertionError("the second session was not refused")
            finally:
                await refused.close()

    message = asyncio.run(run())
    check("CAPACITY_REACHED" in message, message)
    return True


@case
def headers_reach_a_private_server() -> Any:
    headers = {"Authorization": CONFIG["token"]}

    async def run() -> Any:
        async with GenericEnvClient(base_url=CONFIG["private"], headers=headers) as env:
            await env.reset()
            child = await env.new_session()
            await child.reset()

    asyncio.run(run())
    with GenericEnvClient(base_url=CONFIG["private"], headers=headers).sync() as env:
        return obs(env.reset())["observation"]["echoed_message"]


@case
def refused_upgrade_is_a_connection_error() -> Any:
    async def run() -> None:
        async with GenericEnvClient(base_url=CONFIG["private"]) as env:
            await env.reset()

    raises(ConnectionError, lambda: asyncio.run(run()))


@case
def mcp_tool_client_sends_headers() -> Any:
    async def run() -> Any:
        async with MCPToolClient(base_url=CONFIG["private"],
                                 headers={"Authorization": CONFIG["token"]}) as env:
            await env.reset()
            return sorted(t.name for t in await env.list_tools())

    return asyncio.run(run())


# ------------------------------------------------------------------------- modes


@case
def modes_from_argument_and_environment() -> Any:
    url = CONFIG["counter"]
    seen = [GenericEnvClient(base_url=url)._mode,
            GenericEnvClient(base_url=url, mode="PRODUCTION")._mode,
            GenericEnvClient(base_url=url, mode="Simulation")._mode]
    os.environ["OPENENV_CLIENT_MODE"] = "PRODUCTION"
    try:
        seen += [GenericEnvClient(base_url=url)._mode,
                 GenericEnvClient(base_url=url, mode="simulation")._mode]
    finally:
        del os.environ["OPENENV_CLIENT_MODE"]
    bad = str(raises(ValueError, lambda: GenericEnvClient(base_url=url, mode="invalid_mode")))
    check(all(w in bad.lower() for w in ("mode", "simulation", "production")), bad)
    os.environ["OPENENV_CLIENT_MODE"] = "invalid"
    try:
        bad = str(raises(ValueError, lambda: GenericEnvClient(base_url=url)))
    finally:
        del os.environ["OPENENV_CLIENT_MODE"]
    check("OPENENV_CLIENT_MODE" in bad and "invalid" in bad.lower(), bad)
    return seen


@case
def mcp_tool_client_defaults_to_production() -> Any:
    # OpenEnv also refuses mode="simulation" here; envlink accepts it on purpose (tools
    # as steps, without the POST /mcp): a documented difference, not a parity case.
    client = MCPToolClient(base_url=CONFIG["echo"])
    check(client.use_production_mode is True)
    return client.use_production_mode


# ----------------------------------------------------------------------- MCP tools


@case
def mcp_tools_listed_cached_found_and_called() -> Any:
    async def run() -> Any:
        async with MCPToolClient(base_url=CONFIG["echo"]) as env:
            await env.reset()
            tools = await env.list_tools()
            check(await env.list_tools() is tools, "the second list_tools() is the cache")
            fresh = await env.list_tools(use_cache=False)
            tool = await env.get_tool("echo_message")
            return {
                "names": sorted(t.name for t in tools),
                "fresh": sorted(t.name for t in fresh),
                "schema": tool.input_schema.get("required"),
                "missing": await env.get_tool("nope"),
                "has": [await env.has_tool("echo_with_length"), await env.has_tool("nope")],
                "call": await env.call_tool("echo_with_length", message="Test"),
                "steps": (await env.state()).step_count,
            }

    return asyncio.run(run())


@case
def mcp_tool_error_is_a_runtime_error() -> Any:
    async def run() -> str:
        async with MCPToolClient(base_url=CONFIG["echo"]) as env:
            await env.reset()
            try:
                await env.call_tool("no_such_tool", x=1)
            except RuntimeError as exc:
                return str(exc)
            raise AssertionError("an unknown tool did not raise")

    message = asyncio.run(run())
    check("no_such_tool" in message, message)
    return True


@case
def mcp_sync_close_releases_the_session() -> Any:
    # More cycles than the server has sessions: each close() must really end one.
    for _ in range(4):
        client = MCPToolClient(base_url=CONFIG["small"])
        client.connect()
        client.close()
    return True


@case
def generic_sync_close_releases_the_session() -> Any:
    for _ in range(4):
        client = GenericEnvClient(base_url=CONFIG["small"])
        client.connect()
        client.close()
    return True


# ------------------------------------------------------------------ by name (auto)


@case
def autoenv_skip_install_gives_a_generic_client() -> Any:
    client = AutoEnv.from_env("echo", base_url=CONFIG["counter"], skip_install=True)
    check(isinstance(client, GenericEnvClient), type(client).__name__)
    down = str(raises(ConnectionError, lambda: AutoEnv.from_env(
        "echo", base_url=CONFIG["dead"], skip_install=True)))
    check("Server not available" in down, down)
    local = str(raises(ValueError, lambda: AutoEnv.from_env("echo", skip_install=True)))
    check("skip_install=True" in local, local)
    return True


@case
def autoaction_skip_install_gives_generic_action() -> Any:
    action_class = AutoAction.from_env("user/repo", skip_install=True)
    check(action_class is GenericAction)
    action = GenericAction(code="x = 1", timeout=30)
    check(isinstance(action, dict))
    return dict(action)


def _timeout(signum: int, frame: Any) -> None:
    raise TimeoutError(f"case ran over {CASE_TIMEOUT}s")


def main() -> None:
    signal.signal(signal.SIGALRM, _timeout)
    report: dict[str, Any] = {}
    for name, fn in CASES.items():
        signal.alarm(CASE_TIMEOUT)
        try:
            value = fn()
            report[name] = {"ok": True, "value": json.loads(json.dumps(value, default=repr))}
        except BaseException as exc:  # every failure is reported, never raised
            report[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                            "trace": traceback.format_exc()[-1500:]}
        finally:
            signal.alarm(0)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
