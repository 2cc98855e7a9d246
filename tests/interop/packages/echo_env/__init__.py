"""The echo environment's client package (OpenEnv's MCP tool client, as envs/echo_env)."""

from .client import EchoEnv

__all__ = ["EchoEnv"]
