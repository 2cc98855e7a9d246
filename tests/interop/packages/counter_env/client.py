"""The counter environment's client: OpenEnv's ``EnvClient`` with the package's models."""

from typing import Any

from openenv.core import EnvClient
from openenv.core.client_types import StepResult

from .models import CounterAction, CounterObservation, CounterState


class CounterEnv(EnvClient[CounterAction, CounterObservation, CounterState]):
    """Client of the counter environment."""

    def _step_payload(self, action: CounterAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[CounterObservation]:
        observation = CounterObservation(**payload.get("observation", {}),
                                         done=payload.get("done", False),
                                         reward=payload.get("reward"))
        return StepResult(observation=observation, reward=payload.get("reward"),
                          done=payload.get("done", False))

    def _parse_state(self, payload: dict[str, Any]) -> CounterState:
        return CounterState(**payload)

    async def add_all(self, deltas: list[int]) -> int:
        """A package method of its own: step each delta, return the final total."""
        total = 0
        for delta in deltas:
            total = (await self.step(CounterAction(delta=delta))).observation.total
        return total
