"""verifiers 0.4 (``verifiers.v1``): OpenEnv's taskset, run on envlink.

verifiers' own OpenEnv taskset (``verifiers.v1.tasksets.openenv``) plays the user of
an OpenEnv environment: each model reply becomes an action, each observation the next
user turn, and the per-step rewards are summed onto the trace. This module is the
same taskset, with the same configuration, on envlink's client: the connection is
reopened and the session recovered when it drops mid-episode (``on_session_lost=
"auto"``), a full server is waited for, every call has a deadline, and the schema is
read through the client's public ``schema()`` instead of a private URL attribute.

Name it as the taskset id, in place of ``openenv``::

    vf-eval envlink.integrations.verifiers --taskset.base_url http://127.0.0.1:8000

verifiers loads a taskset by importing the module its id names and taking the
``Taskset`` and ``Env`` subclasses its ``__all__`` exports, so this module imports
``verifiers.v1`` when it is imported (the other adapters import nothing).
"""

from __future__ import annotations

import json
from typing import Any

from verifiers.v1.tasksets.openenv.taskset import (
    OpenEnvEnv,
    OpenEnvTaskset,
    parse_action,
)

from envlink import CallToolAction
from envlink._client.client import GenericEnvClient
from envlink.integrations._runtime import DEFAULT_CLIENT_OPTIONS

__all__ = ["EnvlinkOpenEnvEnv", "EnvlinkOpenEnvTaskset"]

#: Action schema titles of OpenEnv's generic MCP actions, which do not say which tools
#: exist: the taskset lists the tools and shows them to the model instead.
_GENERIC_MCP_ACTIONS = frozenset({"Action", "CallToolAction", "ListToolsAction"})


class EnvlinkOpenEnvTaskset(OpenEnvTaskset):  # type: ignore[misc]
    """verifiers' OpenEnv taskset (same configuration and tasks), played by
    :class:`EnvlinkOpenEnvEnv`.

    Configuration (``--taskset.*``), as verifiers' ``OpenEnvConfig``: ``base_url`` of a
    running server, or ``env`` (an ``owner/space`` run locally through
    ``GenericEnvClient.from_env``, with ``use_docker`` and ``provider_kwargs``), and
    ``resets`` (one task per set of ``reset`` arguments).
    """


class EnvlinkOpenEnvEnv(OpenEnvEnv):  # type: ignore[misc]
    """verifiers' OpenEnv environment loop on envlink's client.

    The loop is verifiers' own: the observation and the action schema go to the model
    as JSON, its reply is parsed into an action (``parse_action``), an empty reply
    ends the run, and the rewards of the steps are summed as ``openenv_reward``.
    """

    client_options: dict[str, Any] = DEFAULT_CLIENT_OPTIONS

    async def _client(self, data: Any) -> GenericEnvClient:
        """The episode's client: of ``base_url``, or of ``env`` started by a provider."""
        if data.base_url:
            return GenericEnvClient(data.base_url, **self.client_options)
        client: GenericEnvClient = await GenericEnvClient.from_env(
            data.env, use_docker=data.use_docker, **data.provider_kwargs)
        return client

    async def run(self, task: Any, agents: Any) -> None:
        """One episode: reset with the task's arguments, then one step per model reply.

        Raises:
            EnvlinkError: the environment failed (a session that could not be
                recovered, a server error): the episode's error, never a reward.
        """
        data = task.data
        client = await self._client(data)
        total = 0.0
        async with client:
            action_schema: dict[str, Any] = dict((await client.schema()).action)
            if action_schema.get("title") in _GENERIC_MCP_ACTIONS:
                listed = await client.step({"type": "list_tools"})
                action_schema = CallToolAction.model_json_schema() | {
                    "available_tools": listed.observation["tools"]}
            result = await client.reset(**data.reset)

            def payload() -> str:
                return json.dumps({"observation": result.observation,
                                   "action_schema": action_schema}, ensure_ascii=False)

            async with agents.player.interaction(task) as interaction:
                segment = await interaction.turn(payload())
                while not segment.terminated and not result.done:
                    action = segment.last_reply.strip()
                    if not action:
                        # Nothing can advance the environment: end the run instead of
                        # showing the same observation again.
                        interaction.trace.stop("empty_action")
                        break
                    result = await client.step(parse_action(action, action_schema))
                    total += result.reward or 0.0
                    if result.done:
                        break
                    segment = await interaction.turn(payload())
        interaction.trace.record_reward("openenv_reward", total)
