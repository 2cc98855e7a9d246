"""The counter environment's client package (a typed OpenEnv client)."""

from .client import CounterEnv
from .models import CounterAction, CounterObservation, CounterState

__all__ = ["CounterAction", "CounterEnv", "CounterObservation", "CounterState"]
