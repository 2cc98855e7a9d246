"""A real OpenEnv 0.10 production server with a ``/harness`` route (RFC 005).

Built only with OpenEnv's public API: a ``HarnessEnvironment`` over an
``AgenticHarnessAdapter`` that runs no process and answers each turn with a
scripted event stream (``tool_call``, ``tool_result``, ``text_output``,
``turn_complete``); the message ``!fail`` makes the adapter raise, which OpenEnv's
server reports as a terminal ``error`` event. ``create_app(..., mode="production")``
registers ``/harness`` because the factory produces a ``HarnessEnvironment``.

Usage (with the openenv virtualenv's python)::

    python tests/interop/servers/harness_server.py --port 0 [--max-sessions N]
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from _harness import concurrency, parse_args, serve
from openenv.core.env_server import Observation, create_app
from openenv.core.harness import (
    AgenticHarnessAdapter,
    HarnessAction,
    HarnessConfig,
    HarnessEnvironment,
    HarnessEvent,
    HarnessEventType,
)


class ScriptedAdapter(AgenticHarnessAdapter):
    """A harness without a process: each message is echoed through a fake tool call."""

    async def start(self, working_directory: str) -> None:
        self._alive = True

    async def stop(self) -> None:
        self._alive = False

    async def inject_tools(self, tools: list[Any], bridge_url: str | None = None) -> None:
        pass

    async def is_alive(self) -> bool:
        return getattr(self, "_alive", False)

    async def send_message_streaming(self, message: str) -> AsyncIterator[HarnessEvent]:
        if message == "!fail":
            raise RuntimeError("scripted failure")
        yield HarnessEvent(type=HarnessEventType.TOOL_CALL,
                           data={"tool_name": "echo", "arguments": {"message": message}})
        yield HarnessEvent(type=HarnessEventType.TOOL_RESULT,
                           data={"tool_name": "echo", "result": message, "error": None})
        yield HarnessEvent(type=HarnessEventType.TEXT_OUTPUT, data={"text": message})
        yield HarnessEvent(type=HarnessEventType.TURN_COMPLETE,
                           data={"response": message, "done": False})


class ScriptedHarnessEnvironment(HarnessEnvironment):
    """Each session has its own adapter and no shared state."""

    SUPPORTS_CONCURRENT_SESSIONS = True


def make_env() -> HarnessEnvironment:
    config = HarnessConfig(name="interop-scripted", command=["true"], working_directory="/tmp")
    return ScriptedHarnessEnvironment(ScriptedAdapter(config))


def main() -> None:
    args = parse_args(__doc__ or "")
    app = create_app(make_env, HarnessAction, Observation, env_name="harness_env",
                     mode="production", **concurrency(args))
    serve(app, args)


if __name__ == "__main__":
    main()
