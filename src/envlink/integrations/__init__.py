"""Adapters for training loops: TRL, OpenEnv's harness layer, SkyRL, MCP tools for models.

Each adapter lives in its own module and imports its framework lazily (or not at
all), so ``import envlink.integrations.trl`` works without TRL installed; the
verifiers module, whose classes subclass verifiers', is the one exception:

- :mod:`envlink.integrations.trl`: a base class for TRL's ``environment_factory``;
- :mod:`envlink.integrations.openenv_harness`: a ``ResourceSessionFactory`` whose
  ``create`` retries;
- :mod:`envlink.integrations.skyrl`: a SkyRL ``BaseTextEnv`` text environment;
- :mod:`envlink.integrations.verifiers`: verifiers 0.4's OpenEnv taskset on envlink
  (the taskset id ``envlink-openenv``);
- :mod:`envlink.integrations.openai_tools`: MCP tool lists as OpenAI tool schemas and back.

See ``docs/training.md``.
"""

from __future__ import annotations

__all__: list[str] = []
