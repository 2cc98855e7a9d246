"""The environment state of typed clients: OpenEnv's ``State``, still readable as a mapping."""

from __future__ import annotations

from collections.abc import KeysView, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["State"]


class State(BaseModel):
    """An environment's state, as OpenEnv's ``State``: ``episode_id`` and ``step_count``.

    Whatever else the server sends is kept (``state.total``, ``state["total"]``). It
    also reads as a mapping (``state["step_count"]``, ``"total" in state``,
    ``state.get(...)``, ``state.keys()``, ``dict(state.items())``) and equals the dict
    of its fields, so code written against the dicts envlink returned before keeps
    working.

    Attributes:
        episode_id: the current episode's id, if the server gave one.
        step_count: the steps taken in the current episode.
    """

    model_config = ConfigDict(extra="allow")

    episode_id: str | None = None
    step_count: int = Field(default=0, ge=0)

    def _fields(self) -> dict[str, Any]:
        return self.model_dump()

    def __getitem__(self, key: str) -> Any:
        return self._fields()[key]

    def get(self, key: str, default: Any = None) -> Any:
        """The field ``key``, or ``default``."""
        return self._fields().get(key, default)

    def keys(self) -> KeysView[str]:
        """The names of the fields (the known ones and the server's extra ones)."""
        return self._fields().keys()

    def items(self) -> Any:
        """``(name, value)`` of every field."""
        return self._fields().items()

    def values(self) -> Any:
        """The value of every field."""
        return self._fields().values()

    def __contains__(self, key: object) -> bool:
        return key in self._fields()

    def __len__(self) -> int:
        return len(self._fields())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping) and not isinstance(other, BaseModel):
            return self._fields() == dict(other)
        return super().__eq__(other)

    __hash__ = None  # type: ignore[assignment]
