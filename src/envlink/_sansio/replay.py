"""Replay with verification: what to send to rebuild an episode, and what to compare. No I/O.

A lost episode is rebuilt on a new session by sending its reset with the recorded
kwargs, then every recorded step in order, and comparing each answer with the one
recorded. The client's ``replay`` recovery (``_client/recovery.py``, on a raw
connection) and the pool's rebuild on another endpoint (``_pool/slot.py``, through
a new client) both drive a :class:`JournalReplay`, so both compare the same way
and raise the same error for the same situation:

- an answer that differs from the recorded one (by the replay checker):
  :class:`~envlink.ReplayDivergedError`;
- an error answer (a full server, a failing environment, a refused reset):
  :class:`~envlink.SessionLostError` with the :class:`~envlink.ServerError` as its
  cause; the server could not rebuild the episode, which says nothing about whether
  the environment is deterministic.

Both carry a copy of the recorded journal.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from envlink._errors import ReplayDivergedError, ServerError, SessionLostError
from envlink._sansio.journal import EpisodeJournal, JournalEntry, encode_payload

__all__ = ["RESET", "JournalReplay", "ReplayVerify", "same_answer"]

#: Compares a recorded answer's ``data`` with the replayed one (``True``: the same).
ReplayVerify = Callable[[dict[str, Any], dict[str, Any]], bool]

#: The index :meth:`JournalReplay.check` takes for the reset's answer.
RESET = -1


def same_answer(recorded: Mapping[str, Any], actual: Mapping[str, Any]) -> bool:
    """The default replay check: the whole answer ``data`` is equal."""
    return recorded == actual


class JournalReplay:
    """One replay of a recorded episode, checked answer by answer.

    The I/O layer sends ``reset(**reset_kwargs)`` and then each of ``entries``'
    actions in order, and hands every answer to :meth:`check` (index
    :data:`RESET` for the reset, then each step's index).

    Args:
        journal: the recorded episode (a step recorded as applied with its answer
            lost takes the answer the rebuilt session gives).
        verify: the replay checker (default: :func:`same_answer`).
    """

    __slots__ = ("journal", "verify")

    def __init__(self, journal: EpisodeJournal, verify: ReplayVerify = same_answer) -> None:
        self.journal = journal
        self.verify = verify

    @property
    def reset_kwargs(self) -> dict[str, Any]:
        """The kwargs of the reset that began the recorded episode."""
        return self.journal.reset_kwargs

    @property
    def entries(self) -> list[JournalEntry]:
        """The recorded steps, in the order they are to be sent again."""
        return self.journal.entries

    def check(self, index: int, answer: dict[str, Any] | str | ServerError | None) -> None:
        """Compare the answer to the reset (:data:`RESET`) or to step ``index``.

        Args:
            index: :data:`RESET`, or the step's position in ``entries``.
            answer: the answer's ``data`` (a dict, or its JSON text); the
                :class:`~envlink.ServerError` the server answered with; or ``None``
                when there is no answer to compare.

        Raises:
            SessionLostError: the server answered with an error (its cause).
            ReplayDivergedError: the answer differs from the recorded one.
        """
        journal = self.journal
        what = "reset" if index == RESET else f"step {index}"
        if isinstance(answer, ServerError):
            # The server refused to rebuild the episode (capacity, a failing env...):
            # the episode is lost, but nothing diverged.
            raise SessionLostError(f"replay of {what} failed on the server: {answer}",
                                   journal=journal.snapshot()) from answer
        if index == RESET:
            recorded_json = journal.reset_response_json
        else:
            entry = journal.entries[index]
            recorded_json = entry.response_json
            if recorded_json is None and answer is not None:
                # Applied on the old session, its answer lost: nothing to compare; the
                # journal takes the answer the rebuilt session gave.
                journal.entries[index] = JournalEntry(entry.action_json,
                                                      encode_payload(answer))
                return
        if (isinstance(answer, str) and answer == recorded_json
                and self.verify is same_answer):
            return  # the same text is the same answer: nothing to decode
        actual = json.loads(answer) if isinstance(answer, str) else answer
        recorded = None if recorded_json is None else json.loads(recorded_json)
        if recorded is None or actual is None or not self.verify(recorded, actual):
            raise ReplayDivergedError(
                f"replay diverged at {what}: the server answered differently than it did "
                "originally", index=index, expected=recorded, actual=actual,
                journal=journal.snapshot())
