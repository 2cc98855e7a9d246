"""OpenEnv's own harness code runs rollouts on envlink's session factory.

Needs the openenv package (``bash .ci/trl.sh`` installs it next to TRL and runs this with
``ENVLINK_REQUIRE_TRL=1``); elsewhere the module reports itself skipped.
"""

from __future__ import annotations

from typing import Any

from ._support import require

require("openenv", "ENVLINK_REQUIRE_TRL", "pip install 'openenv==0.10.*'; bash .ci/trl.sh "
        "installs it with TRL")

import pytest  # noqa: E402
from openenv.core.harness import (  # noqa: E402
    MCPHarnessAdapter,
    ModelStepResult,
    ResourceSession,
    ToolResult,
    build_harness_rollout_func,
)
from openenv.core.llm_client import LLMResponse, ToolCall  # noqa: E402

from envlink.integrations.openenv_harness import EnvlinkSessionFactory  # noqa: E402

from .._processes import ServerProcess  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def scripted_model(trainer: Any, session: Any) -> Any:
    """A model step that calls the first listed tool once, then answers."""

    def step(messages: list[dict[str, Any]], tools: list[Any], sampling: dict[str, Any]
             ) -> ModelStepResult:
        if not any(m.get("role") == "tool" for m in messages):
            call = ToolCall(id="call_0", name=tools[0].name,
                            args={"message": messages[0]["content"]})
            return ModelStepResult(response=LLMResponse(content="", tool_calls=[call]),
                                   prompt_ids=[1], completion_ids=[2], logprobs=[-0.5])
        return ModelStepResult(response=LLMResponse(content="done", tool_calls=[]),
                               prompt_ids=[3], completion_ids=[4], logprobs=[-0.1])

    return step


def test_build_harness_rollout_func_on_a_one_session_server() -> None:
    """OpenEnv's rollout function and MCP harness adapter, unchanged, run three rollouts on a
    one-session server whose first upgrade is refused: creation is retried, every rollout
    is scored, no CAPACITY_REACHED reaches the harness, and no session is left open."""
    server = ServerProcess("--env", "echo", "--max-sessions", "1", "--refuse", "1")
    try:
        factory = EnvlinkSessionFactory(
            server.url, create_timeout=30,
            # The echo environment gives no reward: score the episode from the server's
            # own step count (OpenEnv refuses a reward the environment did not produce).
            reward=lambda session, transcript: float(session.client.state()["step_count"]))
        rollout = build_harness_rollout_func(session_factory=factory,
                                             harness_adapter=MCPHarnessAdapter(),
                                             model_step_builder=scripted_model)
        out = rollout(["alpha", "beta", "gamma"], None)
        assert out["env_reward"] == [2.0, 2.0, 2.0]  # list_tools and one tool call
        assert out["completion_ids"] == [[2, 4]] * 3
        assert [m["tool_calls"] for m in out["verify_metrics"]] == [1, 1, 1]
        session = factory.create("x")
        assert isinstance(session, ResourceSession) or hasattr(session, "call_tool")
        assert isinstance(session.call_tool("echo_message", {"message": "m"}), ToolResult)
        session.close()
        health = server.health()
        assert health["counters"]["refused"] == 1
        assert health["sessions"] == 0
        assert (factory.created, factory.failed) == (4, 0)
    finally:
        server.stop()
