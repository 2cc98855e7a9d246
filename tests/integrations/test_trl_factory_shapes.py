"""TRL's other ``environment_factory`` shapes under the real ``GRPOTrainer``, each through a
dropped connection: a dict of factories routed by the dataset's ``environment`` column,
``reset()`` returning text or ``None``, ``get_reward`` sync and async; and a run without
a dataset, where ``reset()`` supplies the prompt.

A ``reset()`` returning a list (multimodal content parts) is not run here: TRL merges it
into the prompt, but only a vision model's chat template renders content parts (the
text template of this tiny model raises in jinja), so it needs a VLM.

A tiny random model from a config (no warm-up: these runs exercise the environment
calls TRL makes, not tool calling). Needs TRL (``bash .ci/trl.sh``); elsewhere skipped.
"""

from __future__ import annotations

import asyncio
import gc
import os
from typing import Any

from ._support import require

require("trl", "ENVLINK_REQUIRE_TRL", "pip install 'envlink[trl]' torch==2.13.0; "
        "bash .ci/trl.sh builds that virtualenv")

import pytest  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from envlink.integrations.trl import EnvlinkEnvironment  # noqa: E402

from .._processes import ServerProcess  # noqa: E402
from ._tiny_lm import build_model, build_tokenizer, conversation  # noqa: E402

pytestmark = pytest.mark.timeout(300)

#: What each environment's reset returned, in this process (what TRL was given).
OBSERVED: dict[str, list[Any]] = {}


class Routed(EnvlinkEnvironment):
    """Shared by the dict's environments: one tool, the reset answer recorded."""

    def echo(self, message: str) -> str:
        """Echo a message back.

        Args:
            message: the text to echo.
        """
        return str(self._call_tool("echo_message", message=message))

    def _observation(self, result: Any, row: Any) -> Any:
        observation = self._shape(str(result.observation["echoed_message"]))
        OBSERVED.setdefault(type(self).__name__, []).append(observation)
        assert "environment" not in row  # TRL keeps its routing column from reset
        return observation

    def _shape(self, text: str) -> Any:
        return f" [{text}]"


class TextEnv(Routed):
    """reset() returns text; get_reward is sync and reads the server."""

    def get_reward(self) -> float:
        """1 + the episode's steps on the server."""
        return 1.0 + float(self.client.state()["step_count"])


class AsyncEnv(Routed):
    """reset() returns text; get_reward is async."""

    async def get_reward(self) -> float:
        """10 + the episode's steps, read from the server off TRL's loop."""
        state = await asyncio.to_thread(lambda: self.client.state())
        return 10.0 + float(state["step_count"])


class SilentEnv(Routed):
    """reset() returns None (nothing is appended to the prompt)."""

    def _shape(self, text: str) -> Any:
        return None

    def get_reward(self) -> float:
        """Always 100."""
        return 100.0


class PromptFromReset(EnvlinkEnvironment):
    """No dataset: the environment's reset answer is the prompt."""

    def echo(self, message: str) -> str:
        """Echo a message back.

        Args:
            message: the text to echo.
        """
        return str(self._call_tool("echo_message", message=message))

    def _observation(self, result: Any, row: Any) -> str:
        OBSERVED.setdefault("PromptFromReset", []).append(row["prompt"])
        return f"Say: {result.observation['echoed_message']}"

    def get_reward(self) -> float:
        """1 + the episode's steps on the server."""
        return 1.0 + float(self.client.state()["step_count"])


def tiny(tools: list[Any]) -> tuple[Any, Any]:
    tokenizer = build_tokenizer([conversation("Say hello.", "echo", "hello", "done")], tools)
    return tokenizer, build_model(tokenizer)


def config(tmp_path: Any, **overrides: Any) -> GRPOConfig:
    return GRPOConfig(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=6,
        num_generations=2, max_completion_length=8, max_tool_calling_iterations=1,
        learning_rate=1e-5, logging_steps=1, report_to=[], save_strategy="no",
        use_cpu=True, bf16=False, seed=0, dataloader_num_workers=0, **overrides)


def rewards(trainer: GRPOTrainer, name: str) -> list[float]:
    """The logged mean rewards of an environment's column (steps whose batch had its rows)."""
    return [log[f"rewards/{name}/mean"] for log in trainer.state.log_history
            if log.get(f"rewards/{name}/mean") is not None]


def no_session_left_but_the_dropped_one(server: ServerProcess) -> None:
    """Every session TRL used is released; the one whose connection dropped under a reset
    is left detached on the server until its resume grace ends (the retried reset opened
    a new session instead of resuming it)."""
    health = server.health()
    assert health["sessions"] == health["counters"].get("session.detached", 0) == 1, health


def dropping_server() -> ServerProcess:
    """The echo server, dropping one connection right after applying its 3rd request (an
    instance's reset of the second step, after a reset and a reward read)."""
    return ServerProcess("--env", "echo", "--drop-after", "3", "--drop-mode", "after_apply")


def test_a_dict_of_factories_with_every_reset_and_reward_shape(tmp_path: Any) -> None:
    """Rows routed by their environment column to three envlink environments (text and None
    observations; sync and async get_reward) train two steps through a dropped
    connection; each environment's reward column is its own; no session is left."""
    server = dropping_server()
    OBSERVED.clear()
    try:
        for cls in (TextEnv, AsyncEnv, SilentEnv):
            cls.base_url = server.url
        tokenizer, model = tiny([TextEnv().echo])
        prompt = [{"role": "user", "content": "Say hello."}]
        rows = [{"prompt": prompt, "environment": name} for name in ("text", "async", "silent")]
        trainer = GRPOTrainer(
            model=model, processing_class=tokenizer, args=config(tmp_path),
            train_dataset=Dataset.from_list(rows * 2),
            environment_factory={"text": TextEnv, "async": AsyncEnv, "silent": SilentEnv})
        trainer.train()

        assert trainer.state.global_step == 2
        assert server.health()["counters"].get("drop") == 1
        # Each rollout's reward comes from its own environment only (a random model rarely
        # calls the tool; when it does, the step count adds to the reward).
        for name, floor in (("TextEnv", 1.0), ("AsyncEnv", 10.0), ("SilentEnv", 100.0)):
            logged = rewards(trainer, name)
            assert logged and all(floor <= r < floor + 5 for r in logged), (name, logged)
        for name in ("TextEnv", "AsyncEnv"):
            assert set(OBSERVED[name]) == {" [Echo environment ready!]"}
        assert set(map(repr, OBSERVED["SilentEnv"])) == {"None"}
        # Every row reached its own environment: 6 rows a step, two steps.
        assert sum(map(len, OBSERVED.values())) == 12
        del trainer
        gc.collect()
        no_session_left_but_the_dropped_one(server)
    finally:
        server.stop()


def test_no_dataset_reset_supplies_the_prompt(tmp_path: Any) -> None:
    """Without a train_dataset (max_steps set), TRL drives placeholder rows and each reset's
    answer becomes the prompt; a dropped connection under a reset is recovered."""
    server = dropping_server()
    OBSERVED.clear()
    try:
        PromptFromReset.base_url = server.url
        tokenizer, model = tiny([PromptFromReset().echo])
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config(tmp_path),
                              environment_factory=PromptFromReset)
        trainer.train()

        assert trainer.state.global_step == 2
        assert server.health()["counters"].get("drop") == 1
        logged = rewards(trainer, "PromptFromReset")
        assert len(logged) == 2 and all(1.0 <= r < 5.0 for r in logged), logged
        # TRL's placeholder row: an empty user message, which reset's text completes.
        assert OBSERVED["PromptFromReset"][0] == [{"role": "user", "content": ""}]
        assert server.health()["counters"]["applied.reset"] >= 6
        del trainer
        gc.collect()
        no_session_left_but_the_dropped_one(server)
    finally:
        server.stop()
