"""A real OpenEnv 0.10 harness server whose agent owns its loop and calls a model.

Built only with OpenEnv's public API: ``create_app(..., mode="production")`` over a
``HarnessEnvironment`` whose ``AgenticHarnessAdapter`` runs an agent of its own. The
agent reads its inference endpoint as an OpenAI-compatible agent does, from
``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` in its environment (``HarnessConfig.env_vars``);
the environment takes them at reset, as the ``agent_env`` keyword that OpenEnv's
server passes on to ``reset_async``, before it starts the agent. Each turn the agent
asks the model twice (``/chat/completions``, with a tool), calls the tool between the
two, and reports the run as ``llm_request``/``llm_response``/``tool_call``/
``tool_result``/``turn_complete`` events. An agent without an endpoint fails its turn.

Usage (with the openenv virtualenv's python)::

    python tests/interop/servers/agent_harness_server.py --port 0 [--max-sessions N]
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
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

TOOL = {"type": "function", "function": {
    "name": "echo", "description": "Echo a message back.",
    "parameters": {"type": "object", "properties": {"message": {"type": "string"}},
                   "required": ["message"]}}}


class ModelAgentAdapter(AgenticHarnessAdapter):
    """An agent that runs its own two-call loop against ``OPENAI_BASE_URL``."""

    async def start(self, working_directory: str) -> None:
        self._alive = True

    async def stop(self) -> None:
        self._alive = False

    async def inject_tools(self, tools: list[Any], bridge_url: str | None = None) -> None:
        pass

    async def is_alive(self) -> bool:
        return getattr(self, "_alive", False)

    async def send_message_streaming(self, message: str) -> AsyncIterator[HarnessEvent]:
        env = self.config.env_vars
        base_url, key = env.get("OPENAI_BASE_URL"), env.get("OPENAI_API_KEY")
        if not base_url or not key:
            raise RuntimeError("the agent has no inference endpoint")
        messages: list[dict[str, Any]] = [{"role": "user", "content": message}]
        async with httpx.AsyncClient(timeout=30.0) as http:
            for _ in range(2):
                body = {"model": "agent", "messages": messages, "tools": [TOOL]}
                yield HarnessEvent(type=HarnessEventType.LLM_REQUEST,
                                   data={"messages": len(messages)})
                answer = await http.post(f"{base_url}/chat/completions", json=body,
                                         headers={"Authorization": f"Bearer {key}"})
                answer.raise_for_status()
                reply = answer.json()["choices"][0]["message"]
                yield HarnessEvent(type=HarnessEventType.LLM_RESPONSE,
                                   data={"content": reply.get("content")})
                messages.append({k: v for k, v in reply.items() if v is not None})
                calls = reply.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    yield HarnessEvent(type=HarnessEventType.TOOL_CALL,
                                       data={"tool_name": call["function"]["name"]})
                    yield HarnessEvent(type=HarnessEventType.TOOL_RESULT,
                                       data={"tool_name": call["function"]["name"],
                                             "result": message, "error": None})
                    messages.append({"role": "tool", "tool_call_id": call["id"],
                                     "content": message})
        yield HarnessEvent(type=HarnessEventType.TURN_COMPLETE,
                           data={"response": messages[-1].get("content"), "done": True})


class AgentHarnessEnvironment(HarnessEnvironment):
    """Each session has its own adapter; its agent's endpoint is given at reset."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          agent_env: dict[str, str] | None = None,
                          **kwargs: Any) -> Observation:
        if agent_env:
            self.adapter.config.env_vars.update(agent_env)
        return await super().reset_async(seed=seed, episode_id=episode_id, **kwargs)


def make_env() -> HarnessEnvironment:
    config = HarnessConfig(name="interop-agent", command=["true"], working_directory="/tmp")
    return AgentHarnessEnvironment(ModelAgentAdapter(config))


def main() -> None:
    args = parse_args(__doc__ or "")
    app = create_app(make_env, HarnessAction, Observation, env_name="agent_harness_env",
                     mode="production", **concurrency(args))
    serve(app, args)


if __name__ == "__main__":
    main()
