"""TRL's other ``environment_factory`` shapes under the real ``GRPOTrainer``, each through a
dropped connection: a dict of factories routed by the dataset's ``environment`` column,
``reset()`` returning text or ``None``, ``get_reward`` sync and async; a run without a
dataset, where ``reset()`` supplies the prompt; and ``reset()`` returning a list of
content parts (multimodal), rendered by a chat template that takes content parts (the
tiny model's own text template cannot; a vision model's can).

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
#: (environment column, last prompt message content) of every scored rollout.
PROMPTS: list[tuple[Any, Any]] = []

#: Qwen's turn markers around content that is text or a list of text parts (and tool
#: calls, which TRL requires an environment's template to render).
CONTENT_PARTS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.content is string %}{{ m.content }}{% elif m.content %}"
    "{% for part in m.content %}{{ part.text }}{% endfor %}{% endif %}"
    "{% for call in m.tool_calls or [] %}<tool_call>{{ call.function.name }} "
    "{{ call.function.arguments | tojson }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def record_prompts(prompts: list[Any], environment: list[Any] | None = None,
                   **kwargs: Any) -> list[float | None]:
    """A reward function that records the prompts TRL built and scores nothing."""
    names = environment or [None] * len(prompts)
    PROMPTS.extend((name, prompt[-1]["content"]) for name, prompt in zip(
        names, prompts, strict=True))
    return [None] * len(prompts)


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


class PartsEnv(EnvlinkEnvironment):
    """reset() returns a list of content parts (a multimodal observation); no tools."""

    def _observation(self, result: Any, row: Any) -> list[dict[str, str]]:
        return [{"type": "text", "text": f" [{result.observation['echoed_message']}]"}]

    def get_reward(self) -> float:
        """1 + the episode's steps on the server."""
        return 1.0 + float(self.client.state()["step_count"])


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


def no_session_left(server: ServerProcess) -> None:
    """Every session TRL used is released, the one whose connection dropped under a reset
    included: the client resent the reset on that session, re-attached by its token."""
    health = server.health()
    assert health["sessions"] == 0, health
    assert health["counters"].get("resume") == 1, health


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
    PROMPTS.clear()
    try:
        for cls in (TextEnv, AsyncEnv, SilentEnv):
            cls.base_url = server.url
        tokenizer, model = tiny([TextEnv().echo])
        prompt = [{"role": "user", "content": "Say hello."}]
        rows = [{"prompt": prompt, "environment": name} for name in ("text", "async", "silent")]
        trainer = GRPOTrainer(
            model=model, processing_class=tokenizer, args=config(tmp_path),
            train_dataset=Dataset.from_list(rows * 2), reward_funcs=[record_prompts],
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
        # Every row reached its own environment: 6 rows a step, two steps; text was
        # appended to the prompt, None left it as it was.
        assert sum(map(len, OBSERVED.values())) == 12
        assert dict(PROMPTS) == {"text": "Say hello. [Echo environment ready!]",
                                 "async": "Say hello. [Echo environment ready!]",
                                 "silent": "Say hello."}
        del trainer
        gc.collect()
        no_session_left(server)
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
        no_session_left(server)
    finally:
        server.stop()


def test_a_list_observation_becomes_content_parts(tmp_path: Any) -> None:
    """reset() returning content parts: TRL turns the prompt into parts and appends them, the
    model trains on it, and a dropped connection under a reset is recovered."""
    server = dropping_server()
    PROMPTS.clear()
    try:
        PartsEnv.base_url = server.url
        tokenizer, model = tiny([])
        tokenizer.chat_template = CONTENT_PARTS_TEMPLATE
        prompt = [{"role": "user", "content": "Say hello."}]
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config(tmp_path),
                              train_dataset=Dataset.from_list([{"prompt": prompt}] * 6),
                              reward_funcs=[record_prompts], environment_factory=PartsEnv)
        trainer.train()

        assert trainer.state.global_step == 2
        assert server.health()["counters"].get("drop") == 1
        assert {repr(content) for _, content in PROMPTS} == {repr([
            {"type": "text", "text": "Say hello."},
            {"type": "text", "text": " [Echo environment ready!]"}])}
        assert len(rewards(trainer, "PartsEnv")) == 2
        del trainer
        gc.collect()
        no_session_left(server)
    finally:
        server.stop()
