"""The counter environment's models, as its server defines them."""

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class CounterAction(Action):
    """Add ``delta`` to the counter."""

    delta: int = Field(ge=-100, le=100)
    label: str = ""


class CounterObservation(Observation):
    """The counter after an action."""

    total: int
    target: int
    history: list[int] = Field(default_factory=list)
    label: str = ""


class CounterState(State):
    """The server's state, with fields of its own."""

    total: int = 0
    target: int = 0
