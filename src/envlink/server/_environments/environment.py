"""What the reference server serves: the :class:`Environment` protocol and its result.

Pure: no I/O. An environment is a plain synchronous object; the server calls it
on its event loop, one request at a time per session, so it must be quick and
must not block.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from envlink._errors import ActionRejectedError

__all__ = [
    "ActionRejectedError",
    "Environment",
    "EnvironmentFactory",
    "InvalidActionError",
    "SnapshotEnvironment",
    "StepResult",
    "Transition",
    "accepted_kwargs",
    "supports_snapshot",
]


@dataclass(frozen=True)
class Transition:
    """What :meth:`Environment.reset` and :meth:`Environment.step` return.

    Attributes:
        observation: the observation's fields (JSON-serialisable).
        reward: the reward of the last action, or ``None``.
        done: whether the episode has ended.
        metadata: extra information; like OpenEnv, it is put inside the observation
            (always, as ``"metadata"``) and beside it in the frame when not empty.
    """

    observation: Mapping[str, Any]
    reward: float | None = None
    done: bool = False
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        """The ``data`` of an observation frame, shaped as OpenEnv serialises it."""
        data: dict[str, Any] = {
            "observation": {"metadata": dict(self.metadata), **self.observation},
            "reward": self.reward,
            "done": self.done,
        }
        if self.metadata:
            data["metadata"] = dict(self.metadata)
        return data


#: The earlier name of :class:`Transition`, kept for existing environments. The
#: client's :class:`envlink.StepResult` is a different class (what a client's step
#: returns), hence the new name.
StepResult = Transition


#: The earlier name of :class:`~envlink.server.ActionRejectedError`, kept for existing
#: environments (one class, defined with envlink's other exceptions; the client's
#: :class:`envlink.InvalidActionError` is a different one, hence the new name).
InvalidActionError = ActionRejectedError


@runtime_checkable
class Environment(Protocol):
    """One episode-running environment instance; the server creates one per session.

    ``reset(**kwargs) -> Transition`` starts a new episode. The server passes only
    the reset arguments that its signature accepts (all of them if it takes
    ``**kwargs``), as OpenEnv does, so any keyword signature fits.
    """

    @property
    def reset(self) -> Callable[..., Transition]:
        """``reset(**kwargs) -> Transition``; see the class docstring."""
        ...

    def step(self, action: dict[str, Any]) -> Transition:
        """Apply one action (the ``data`` of a step frame)."""
        ...

    def state(self) -> dict[str, Any]:
        """The environment state: at least ``episode_id`` and ``step_count``."""
        ...


@runtime_checkable
class SnapshotEnvironment(Environment, Protocol):
    """An environment whose state can be saved, so its sessions survive a restart."""

    def snapshot(self) -> dict[str, Any]:
        """The whole state as a JSON-serialisable object."""
        ...

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Put back a state returned by :meth:`snapshot` (possibly by another process)."""
        ...


#: A zero-argument callable that returns a fresh environment.
EnvironmentFactory = Callable[[], Environment]


def supports_snapshot(env: object) -> bool:
    """Whether ``env`` implements :meth:`SnapshotEnvironment.snapshot` and ``restore``."""
    return callable(getattr(env, "snapshot", None)) and callable(getattr(env, "restore", None))


def accepted_kwargs(func: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of ``kwargs`` that ``func`` accepts (all of them with ``**kwargs``)."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return dict(kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}
