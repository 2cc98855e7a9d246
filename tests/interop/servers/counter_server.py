"""A typed OpenEnv server: its own Action, Observation and State models.

Built only with OpenEnv's public server API (``Environment`` + ``create_app``).
The environment is deterministic: the same reset kwargs and the same actions
always give the same observations, so envlink's ``replay`` recovery can verify
every replayed observation against the recorded one.

A counter starts at ``start`` (a reset kwarg) and each ``CounterAction`` adds
``delta``; the episode is done when the total reaches ``target``. ``--offset``
shifts every total: a server restarted with another offset answers a replayed
episode differently, which is how the tests make a replay diverge.

When OpenEnv destroys a session (its reaper, ``openenv/session/close``, a socket
that owned its session closing) it calls the environment's ``close()``; this one
then prints ``openenv serve: event environment_closed {...}`` with its episode id
and step count, and refuses further steps, as a real environment whose resources
are gone would.

Usage (with the openenv virtualenv's python)::

    python tests/interop/servers/counter_server.py --port 0 [--max-sessions N]
        [--frame-log F] [--offset K] [--session-timeout S]
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from _harness import announce, concurrency, parse_args, serve
from openenv.core.env_server import Action, Environment, Observation, State, create_app
from pydantic import Field


class CounterAction(Action):
    """Add ``delta`` to the counter."""

    delta: int = Field(ge=-100, le=100)
    label: str = ""
    #: Seconds the step takes on the server (a slow environment).
    sleep_s: float = Field(default=0.0, ge=0.0, le=10.0)


class CounterObservation(Observation):
    """The counter after an action."""

    total: int
    target: int
    history: list[int] = Field(default_factory=list)
    label: str = ""


class CounterState(State):
    """Server-side state, with fields of its own."""

    total: int = 0
    target: int = 0


class CounterEnvironment(Environment[CounterAction, CounterObservation, CounterState]):
    """A deterministic counter."""

    SUPPORTS_CONCURRENT_SESSIONS = True
    #: Added to the start of every episode (the ``--offset`` option).
    OFFSET = 0

    def __init__(self) -> None:
        super().__init__()
        self._state = CounterState(episode_id=None, step_count=0)
        self._history: list[int] = []
        self._closed = False

    def reset(self, seed: int | None = None, episode_id: str | None = None,
              start: int = 0, target: int = 10, **kwargs: Any) -> CounterObservation:
        self._state = CounterState(episode_id=episode_id or f"counter-{seed}",
                                   step_count=0, total=start + self.OFFSET,
                                   target=target)
        self._history = []
        return CounterObservation(total=self._state.total, target=target, history=[], done=False,
                                  reward=0.0)

    def step(self, action: CounterAction, timeout_s: float | None = None,
             **kwargs: Any) -> CounterObservation:
        if self._closed:
            raise RuntimeError("the environment was closed")
        if action.sleep_s:
            time.sleep(action.sleep_s)
        self._state.step_count += 1
        self._state.total += action.delta
        self._history.append(action.delta)
        done = self._state.total >= self._state.target
        return CounterObservation(total=self._state.total, target=self._state.target,
                                  history=list(self._history), label=action.label,
                                  done=done, reward=float(action.delta))

    @property
    def state(self) -> CounterState:
        return self._state

    # The Task API (OpenEnv's /{env}/splits, /tasks...): a task is a reset's arguments.
    _TASKS: ClassVar[dict[str, list[dict[str, int]]]] = {
        "train": [{"start": n, "target": n + 5} for n in range(6)],
        "eval": [{"start": 100, "target": 101}]}

    def list_splits(self) -> list[str]:
        return list(self._TASKS)

    def list_tasks(self, split: str) -> list[dict[str, int]]:
        return list(self._TASKS[split or "train"])

    def num_tasks(self, split: str) -> int:
        return len(self._TASKS[split or "train"])

    def get_task(self, split: str, index: int) -> dict[str, int]:
        return self._TASKS[split or "train"][index]

    def get_task_range(self, split: str, start: int, stop: int) -> list[dict[str, int]]:
        return self._TASKS[split or "train"][start:stop]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            announce("environment_closed", episode_id=self._state.episode_id,
                     step_count=self._state.step_count)


def main() -> None:
    args = parse_args(__doc__ or "", lambda parser: parser.add_argument(
        "--offset", type=int, default=0, help="added to every episode's start"))
    CounterEnvironment.OFFSET = args.offset
    app = create_app(CounterEnvironment, CounterAction, CounterObservation,
                     env_name="counter_env", state_cls=CounterState, **concurrency(args))
    serve(app, args)


if __name__ == "__main__":
    main()
