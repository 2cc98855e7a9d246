"""A SkyRL text environment (``skyrl_gym``'s ``BaseTextEnv`` shape) on envlink.

SkyRL's generator builds one environment per trajectory, *on its event loop*, with
``Env(env_config, extras)``, then calls ``init(prompt) -> (conversation, metadata)``,
``step(action: str) -> BaseTextEnvStepOutput`` (a dict: ``observations``, ``reward``,
``done``, ``metadata``), ``get_metrics()`` and ``close()``. :class:`EnvlinkTextEnv`:

- opens nothing in ``__init__`` (the server URL comes from ``extras`` or
  ``env_config``, read there; the connection is made by ``init``);
- reports an environment failure as an exception (SkyRL then fails the trajectory),
  never as a reward of -1 that would train the policy on a network error;
- reports envlink's own view of the episode in ``get_metrics()``.

Where ``skyrl_gym`` is installed, :class:`EnvlinkTextEnv` is a real subclass of its
``BaseTextEnv``, so ``skyrl_gym.make`` (which checks ``isinstance(env, skyrl_gym.Env)``)
builds it; :func:`register` adds it to SkyRL's registry. Without SkyRL the class has
the same shape on a plain base, and the step output is the plain dict SkyRL's
``TypedDict`` describes.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any

from envlink._client.client import EnvClient, GenericEnvClient, StepResult
from envlink.integrations._runtime import (
    DEFAULT_CLIENT_OPTIONS,
    Lease,
    reset_until_ready,
    shared_bridge,
)

__all__ = ["EnvlinkTextEnv", "register"]

#: Where :func:`register` points SkyRL's registry.
ENTRY_POINT = "envlink.integrations.skyrl:EnvlinkTextEnv"


def _text_env_base() -> Any:
    # SkyRL's base class where SkyRL is installed (its make() accepts only subclasses of
    # skyrl_gym.Env); a plain base elsewhere, so envlink never depends on SkyRL.
    try:
        module = importlib.import_module("skyrl_gym.envs.base_text_env")
    except ImportError:
        return object
    return module.BaseTextEnv


_TextEnvBase: Any = _text_env_base()


def _get(source: Any, key: str) -> Any:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return source.get(key)
    return getattr(source, key, None)  # an omegaconf DictConfig reads as attributes too


class EnvlinkTextEnv(_TextEnvBase):  # type: ignore[misc]
    """A SkyRL text environment for one trajectory on an OpenEnv-compatible server.

    Settings, each looked up in ``extras`` first, then ``env_config``:
    ``envlink_url`` (or ``base_url``; default ``ENVLINK_URL``), ``max_turns``
    (default 1), ``reset_kwargs`` (a dict), ``reset_timeout`` (seconds, default 120),
    ``client_options`` (a dict for the client).

    Override :meth:`_action` to turn the model's text into an environment action, and
    :meth:`_observation_text` to render an observation for the model.

    Args:
        env_config: SkyRL's environment config (a mapping or ``DictConfig``).
        extras: the dataset row's extras.
    """

    client_class: type[EnvClient[Any, Any, Any]] = GenericEnvClient

    def __init__(self, env_config: Any = None, extras: Mapping[str, Any] | None = None) -> None:
        super().__init__()  # SkyRL's BaseTextEnv sets turns, max_turns and tool groups
        self.env_config = env_config
        self.extras = dict(extras or {})
        url = self._setting("envlink_url") or self._setting("base_url") \
            or os.environ.get("ENVLINK_URL")
        if not url:
            raise ValueError("EnvlinkTextEnv needs a server: envlink_url in extras or "
                             "env_config, or the ENVLINK_URL environment variable")
        self.base_url = str(url)
        self.max_turns = int(self._setting("max_turns") or 1)
        self.turns = 0
        self._lease = Lease()
        self._rewards: list[float] = []
        self._last: StepResult[Any] | None = None

    def _setting(self, key: str) -> Any:
        value = self.extras.get(key)
        return value if value is not None else _get(self.env_config, key)

    @property
    def client(self) -> Any:
        """The trajectory's :class:`~envlink.SyncEnvClient` (on the process's shared loop)."""
        if self._lease.client is None:
            options = {**DEFAULT_CLIENT_OPTIONS, **dict(self._setting("client_options") or {})}
            self._lease.client = self.client_class(self.base_url, **options).sync(
                shared_bridge())
        return self._lease.client

    def init(self, prompt: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Connect and reset; the prompt, with the first observation appended when there is one.

        Raises:
            EnvlinkError: the session could not be made within ``reset_timeout``.
        """
        client = self.client
        deadline = float(self._setting("reset_timeout") or 120.0)
        result: StepResult[Any] = client.bridge.call(
            reset_until_ready, client.async_client, dict(self._setting("reset_kwargs") or {}),
            deadline=deadline, timeout=deadline + 5.0, method="reset")
        self._last = result
        text = self._observation_text(result)
        conversation = list(prompt)
        if text:
            conversation.append({"role": "user", "content": text})
        return conversation, {"session_id": client.async_client.session_id}

    def step(self, action: str) -> dict[str, Any]:
        """Apply the model's turn.

        Returns:
            SkyRL's ``BaseTextEnvStepOutput``: ``observations`` (the next user message,
            none when done), ``reward``, ``done``, ``metadata``.

        Raises:
            EnvlinkError: the environment failed (connection lost beyond recovery, a
                server error): an error of the trajectory, not a reward.
        """
        self.turns += 1
        result: StepResult[Any] = self.client.step(self._action(action))
        self._last = result
        reward = float(result.reward or 0.0)
        self._rewards.append(reward)
        done = bool(result.done) or self.turns >= self.max_turns
        text = self._observation_text(result)
        observations = [] if done or not text else [{"role": "user", "content": text}]
        return {"observations": observations, "reward": reward, "done": done,
                "metadata": {"observation": result.observation}}

    def _action(self, action: str) -> Any:
        """The environment action for the model's text (default: ``{"message": text}``)."""
        return {"message": action}

    def _observation_text(self, result: StepResult[Any]) -> str:
        """The text the model sees for an observation (default: its JSON-ish ``str``)."""
        return "" if result.observation is None else str(result.observation)

    def get_metrics(self) -> dict[str, Any]:
        """envlink's account of the trajectory: steps the server applied (from the episode
        journal), turns, rewards."""
        client = self._lease.client
        journal = client.async_client.journal if client is not None else None
        return {
            "envlink/steps": journal.step_count if journal is not None else 0,
            "envlink/turns": self.turns,
            "envlink/reward_sum": sum(self._rewards),
        }

    def close(self) -> None:
        """End the server session. Idempotent."""
        self._lease.release()


def register(id: str = "envlink", **kwargs: Any) -> None:
    """Register :class:`EnvlinkTextEnv` in SkyRL's registry, for ``skyrl_gym.make(id)``.

    SkyRL's generator then builds one environment per trajectory with
    ``skyrl_gym.make(id, env_config=..., extras=...)``.

    Args:
        id: the environment id SkyRL's config names (``environment.env_class``).
        kwargs: default constructor arguments stored in the registry's spec.

    Raises:
        ImportError: ``skyrl_gym`` is not installed.
    """
    skyrl_gym = importlib.import_module("skyrl_gym")
    skyrl_gym.register(id=id, entry_point=ENTRY_POINT, kwargs=kwargs or None)
