"""TRL's real GRPOTrainer trains on an envlink environment through a dropped connection.

Needs TRL, transformers and torch (``bash .ci/trl.sh`` builds a virtualenv with them and
runs this with ``ENVLINK_REQUIRE_TRL=1``); elsewhere the module reports itself skipped.
"""

from __future__ import annotations

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
from ._tiny_lm import build_model, build_tokenizer, conversation, warm_up  # noqa: E402

pytestmark = pytest.mark.timeout(900)

#: Every tool call TRL made, in this process (what the trainer asked of the server).
CALLS: list[str] = []


class EchoTool(EnvlinkEnvironment):
    """The echo server's ``echo_message`` tool, for TRL."""

    def echo(self, message: str) -> str:
        """Echo a message back.

        Args:
            message: the text to echo.
        """
        CALLS.append(message)
        result = self._call_tool("echo_message", message=message)
        self.echoed = True
        return str(result)

    def get_reward(self) -> float:
        """1.0 when the episode echoed something."""
        return 1.0 if getattr(self, "echoed", False) else 0.0

    def _observation(self, result: Any, row: Any) -> None:
        self.echoed = False
        return None


def test_grpo_trainer_runs_on_envlink_through_a_dropped_connection(tmp_path: Any) -> None:
    """Two GRPO steps with real tool calls; a connection dropped after the server applied a
    request is recovered; the server applied exactly the steps TRL asked; no session is left."""
    # The 4th request on a connection (a tool call in the second batch) is applied,
    # then its connection dies before the answer: the worst moment for exactly-once.
    server = ServerProcess("--env", "echo", "--drop-after", "4", "--drop-mode", "after_apply")
    try:
        EchoTool.base_url = server.url
        probe = EchoTool()
        prompt = "Say hello with the echo tool."
        convs = [conversation(prompt, "echo", "hello", "done")]
        tokenizer = build_tokenizer(convs, [probe.echo])
        model = build_model(tokenizer)
        loss = warm_up(model, tokenizer, convs, [probe.echo])
        assert loss < 0.1, f"the warm-up did not teach the tool call (loss {loss:.3f})"
        del probe

        dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": prompt}]}] * 8)
        config = GRPOConfig(
            output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
            num_generations=2, max_completion_length=64, max_tool_calling_iterations=2,
            learning_rate=1e-5, logging_steps=1, report_to=[], save_strategy="no",
            use_cpu=True, bf16=False, seed=0, temperature=0.3, dataloader_num_workers=0,
        )
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=config,
                              train_dataset=dataset, environment_factory=EchoTool)
        trainer.train()

        assert trainer.state.global_step == 2
        counters = server.health()["counters"]
        assert counters.get("drop") == 1, counters
        # The model really called the tool, in both batches of four rollouts.
        assert len(CALLS) >= 8, CALLS
        # Exactly once: every call TRL made was applied once, the dropped one included.
        assert counters.get("applied.step") == len(CALLS), (counters, len(CALLS))
        rewards = [log["rewards/EchoTool/mean"] for log in trainer.state.log_history
                   if "rewards/EchoTool/mean" in log]
        assert rewards and all(r > 0 for r in rewards), trainer.state.log_history

        # TRL never closes its environments: dropping the trainer releases them.
        del trainer
        gc.collect()
        health = server.health()
        assert health["sessions"] == 0, health
    finally:
        server.stop()
