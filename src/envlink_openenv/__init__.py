"""The taskset id ``envlink-openenv`` for verifiers 0.4: OpenEnv's taskset on envlink.

verifiers finds a taskset by importing the top-level module its id names
(``envlink-openenv`` → ``envlink_openenv``) and taking the ``Taskset`` and ``Env``
subclasses in its ``__all__``; they live in :mod:`envlink.integrations.verifiers`.
"""

from envlink.integrations.verifiers import EnvlinkOpenEnvEnv, EnvlinkOpenEnvTaskset

__all__ = ["EnvlinkOpenEnvEnv", "EnvlinkOpenEnvTaskset"]
