"""A seeded environment: the same seed and actions give byte-identical observations.

Used by replay tests: an episode replayed against a fresh session must produce
exactly the observations that were recorded.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from envlink._config import is_int
from envlink.server._environments.environment import ActionRejectedError, Transition

__all__ = ["DeterministicEnvironment"]

_DRAW_RANGE = 1_000_000

_INT: dict[str, Any] = {"type": "integer"}
_ACTION_SCHEMA: dict[str, Any] = {
    "title": "MoveAction", "type": "object", "additionalProperties": False,
    "properties": {"move": dict(_INT, title="Move",
                                description="how far the walker moves (negative: back)")},
    "required": ["move"],
}
_OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "WalkObservation", "type": "object",
    "properties": {
        "position": dict(_INT, title="Position"),
        "draw": dict(_INT, title="Draw", minimum=0, maximum=_DRAW_RANGE - 1),
        "step": dict(_INT, title="Step", minimum=0),
        "done": {"type": "boolean"},
        "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]},
    },
    "required": ["position", "draw", "step"],
}
_STATE_SCHEMA: dict[str, Any] = {
    "title": "WalkState", "type": "object",
    "properties": {
        "episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "step_count": dict(_INT, minimum=0),
        "position": _INT, "seed": _INT, "max_steps": dict(_INT, minimum=1),
    },
}


class DeterministicEnvironment:
    """A walker on a line with a seeded random draw per step. Supports snapshots.

    ``reset(seed=0, max_steps=10)`` starts at position 0; each ``{"move": int}``
    action moves the walker and draws a number from ``random.Random(seed)``.
    The observation is ``{"position", "draw", "step"}``, the reward is the draw
    scaled to [0, 1), and the episode is done after ``max_steps`` steps.
    """

    def __init__(self, *, default_max_steps: int = 10) -> None:
        self._default_max_steps = default_max_steps
        self._rng: random.Random | None = None
        self._seed = 0
        self._max_steps = default_max_steps
        self._position = 0
        self._step = 0
        self._episode_id: str | None = None

    def reset(self, seed: int = 0, max_steps: int | None = None,
              episode_id: str | None = None) -> Transition:
        """Start an episode.

        Raises:
            ActionRejectedError: ``seed`` or ``max_steps`` is not an integer (or < 1).
        """
        if not is_int(seed):
            raise ActionRejectedError(f"seed must be an integer, got {seed!r}")
        steps = self._default_max_steps if max_steps is None else max_steps
        if not is_int(steps) or steps < 1:
            raise ActionRejectedError(f"max_steps must be a positive integer, got {max_steps!r}")
        self._rng = random.Random(seed)
        self._seed = seed
        self._max_steps = steps
        self._position = 0
        self._step = 0
        self._episode_id = episode_id or str(uuid.uuid4())
        draw = self._rng.randrange(_DRAW_RANGE)
        return Transition(
            observation={"position": 0, "draw": draw, "step": 0}, reward=0.0, done=False
        )

    def step(self, action: dict[str, Any]) -> Transition:
        """Move by ``action["move"]``.

        Raises:
            ActionRejectedError: the action is not exactly ``{"move": int}``.
            RuntimeError: no episode was started, or it is done (``EXECUTION_ERROR``).
        """
        if set(action) != {"move"} or not is_int(action["move"]):
            raise ActionRejectedError(f"action must be {{'move': int}}, got {action!r}")
        if self._rng is None:
            raise RuntimeError("call reset before step")
        if self._step >= self._max_steps:
            raise RuntimeError("the episode is done; call reset")
        move: int = action["move"]
        self._position += move
        self._step += 1
        draw = self._rng.randrange(_DRAW_RANGE)
        return Transition(
            observation={"position": self._position, "draw": draw, "step": self._step},
            reward=draw / _DRAW_RANGE,
            done=self._step >= self._max_steps,
        )

    def schema(self) -> dict[str, Any]:
        """The action's, observations' and state's JSON schemas, for ``GET /schema``."""
        return {"action": _ACTION_SCHEMA, "observation": _OBSERVATION_SCHEMA,
                "reset_observation": _OBSERVATION_SCHEMA, "state": _STATE_SCHEMA}

    def state(self) -> dict[str, Any]:
        """Episode id, step count, position, seed and step limit."""
        return {
            "episode_id": self._episode_id,
            "step_count": self._step,
            "position": self._position,
            "seed": self._seed,
            "max_steps": self._max_steps,
        }

    # The Task API (OpenEnv 0.10's ``/{env}/splits``, ``/{env}/tasks``...): each task is
    # the reset arguments of one episode, so a training loop can enumerate its episodes.

    def list_splits(self) -> list[str]:
        """The task splits: ``train`` and ``test``."""
        return list(_SPLITS)

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        """Every task of ``split`` (reset arguments: ``seed`` and ``max_steps``).

        Raises:
            ValueError: an unknown split.
        """
        return [self.get_task(split, i) for i in range(self.num_tasks(split))]

    def num_tasks(self, split: str) -> int:
        """How many tasks ``split`` has.

        Raises:
            ValueError: an unknown split.
        """
        return _SPLITS[_split(split)][1]

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        """Task ``index`` of ``split``.

        Raises:
            IndexError: ``index`` is outside the split.
            ValueError: an unknown split.
        """
        first, count = _SPLITS[_split(split)]
        if not is_int(index) or not 0 <= index < count:
            raise IndexError(index)
        return {"seed": first + index, "max_steps": self._default_max_steps}

    def get_task_range(self, split: str, start: int, stop: int) -> list[dict[str, Any]]:
        """Tasks ``start`` to ``stop`` (excluded) of ``split``, clipped to the split.

        Raises:
            ValueError: an unknown split.
        """
        count = self.num_tasks(split)
        return [self.get_task(split, i) for i in range(max(start, 0), min(stop, count))]

    def snapshot(self) -> dict[str, Any]:
        """The whole state, including the random generator's, as JSON-able data."""
        return {
            "state": self.state(),
            "rng": None if self._rng is None else _jsonable(self._rng.getstate()),
        }

    def restore(self, snapshot: dict[str, Any]) -> None:
        """Put back a :meth:`snapshot`."""
        state = snapshot["state"]
        self._episode_id = state["episode_id"]
        self._step = int(state["step_count"])
        self._position = int(state["position"])
        self._seed = int(state["seed"])
        self._max_steps = int(state["max_steps"])
        rng_state = snapshot.get("rng")
        if rng_state is None:
            self._rng = None
        else:
            self._rng = random.Random()
            self._rng.setstate(_tuples(rng_state))


#: Task splits: the first seed and the number of tasks of each.
_SPLITS: dict[str, tuple[int, int]] = {"train": (0, 32), "test": (1000, 8)}


def _split(split: str) -> str:
    name = split or "train"
    if name not in _SPLITS:
        raise ValueError(f"unknown split {split!r} (splits: {', '.join(_SPLITS)})")
    return name




def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


def _tuples(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    return value
