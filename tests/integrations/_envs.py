"""Environment classes the integration tests share (importable by a spawned child)."""

from __future__ import annotations

from typing import Any

from envlink.integrations.trl import EnvlinkEnvironment

__all__ = ["AsyncEcho", "Echo"]


class Echo(EnvlinkEnvironment):
    """The echo server's tools, for TRL."""

    def echo(self, message: str) -> str:
        """Echo a message back.

        Args:
            message: the text to echo.
        """
        return str(self._call_tool("echo_message", message=message))

    def measure(self, message: str) -> int:
        """The length of a message, measured by the environment.

        Args:
            message: the text to measure.
        """
        return int(self._call_tool("echo_with_length", message=message)["length"])

    def broken(self, message: str) -> str:
        """Call a tool the server does not have.

        Args:
            message: anything.
        """
        return str(self._call_tool("no_such_tool", message=message))

    def get_reward(self) -> float:
        """The number of steps of the episode so far, read from the server."""
        return float(self.client.state()["step_count"])


class AsyncEcho(EnvlinkEnvironment):
    """The echo tool as a coroutine (TRL gathers async tools on its own loop)."""

    async def echo(self, message: str) -> str:
        """Echo a message back.

        Args:
            message: the text to echo.
        """
        return str(await self._acall_tool("echo_message", message=message))

    async def broken(self, message: str) -> Any:
        """Call a tool the server does not have.

        Args:
            message: anything.
        """
        return await self._acall_tool("no_such_tool", message=message)

    async def get_reward(self) -> float:
        """1.0, scored asynchronously."""
        return 1.0


def run_like_async_worker(factory: Any, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What TRL's async rollout worker does with an environment, in a spawned child.

    ``_AsyncRolloutLoop`` builds instances from the (unpickled) factory, runs
    ``reset``, sync tools and a sync ``get_reward`` in a thread pool from coroutines on
    its loop, and awaits async tools on that loop; several rollouts are in flight at once.
    """
    import asyncio
    import functools
    import inspect
    import threading
    from concurrent.futures import ThreadPoolExecutor

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="grpo-tool")
        envs = [factory() for _ in rows]

        async def rollout(env: Any, row: dict[str, Any]) -> Any:
            await loop.run_in_executor(pool, functools.partial(env.reset, **row))
            tool = env.echo
            if inspect.iscoroutinefunction(tool):
                echoed = await tool(message=row["prompt"])
            else:
                echoed = await loop.run_in_executor(
                    pool, functools.partial(tool, message=row["prompt"]))
            if inspect.iscoroutinefunction(env.get_reward):
                reward = await env.get_reward()
            else:
                reward = await loop.run_in_executor(pool, env.get_reward)
            return echoed, reward

        results = await asyncio.gather(*(rollout(e, r) for e, r in zip(envs, rows, strict=True)))
        pool.shutdown()
        threads = {t.name for t in threading.enumerate() if t.name.startswith("envlink")}
        return {"results": [list(r) for r in results], "envlink_threads": sorted(threads)}

    return asyncio.run(main())


def child_main(factory: Any, rows: list[dict[str, Any]], results: Any) -> None:
    """A spawned child's entry point, as TRL's: run the rollouts, report, return (the
    interpreter then exits normally, running its exit hooks)."""
    results.put(run_like_async_worker(factory, rows))
