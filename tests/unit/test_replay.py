"""The one replay check the client and the pool share: one error for each situation."""

from __future__ import annotations

from typing import Any

import pytest

from envlink import EpisodeJournal, ReplayDivergedError, ServerError, SessionLostError
from envlink._sansio.replay import RESET, JournalReplay, same_answer


def _journal() -> EpisodeJournal:
    journal = EpisodeJournal()
    journal.record_reset({"seed": 1}, {"observation": {"n": 0}})
    journal.record_step({"move": 1}, {"observation": {"n": 1}})
    journal.record_step({"move": 2}, None)  # applied, its answer lost
    return journal


def test_the_same_answers_pass_as_dicts_or_as_text() -> None:
    """Equal answers pass, whether the I/O layer hands over the data or its JSON text."""
    replay = JournalReplay(_journal())
    assert replay.reset_kwargs == {"seed": 1}
    replay.check(RESET, {"observation": {"n": 0}})
    replay.check(0, '{"observation":{"n":1}}')
    replay.check(0, '{"observation": {"n": 1}}')  # other spacing: decoded and compared


def test_an_error_answer_is_session_lost_not_divergence() -> None:
    """A server error during replay is SessionLostError caused by it, with the journal."""
    refused = ServerError("no room", "CAPACITY_REACHED")
    with pytest.raises(SessionLostError) as info:
        JournalReplay(_journal()).check(0, refused)
    assert not isinstance(info.value, ReplayDivergedError)
    assert info.value.__cause__ is refused
    assert str(info.value) == "replay of step 0 failed on the server: [CAPACITY_REACHED] no room"
    assert info.value.journal is not None and info.value.journal.step_count == 2


def test_a_different_answer_diverges_with_both_answers() -> None:
    """A different answer is ReplayDivergedError naming the index and both answers."""
    with pytest.raises(ReplayDivergedError) as info:
        JournalReplay(_journal()).check(0, {"observation": {"n": 9}})
    assert (info.value.index, info.value.expected, info.value.actual) == (
        0, {"observation": {"n": 1}}, {"observation": {"n": 9}})
    with pytest.raises(ReplayDivergedError, match="diverged at reset"):
        JournalReplay(_journal()).check(RESET, None)


def test_a_custom_checker_decides_even_for_identical_text() -> None:
    """A custom checker is asked about every answer; the text shortcut is the default's."""
    seen: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def never(recorded: dict[str, Any], actual: dict[str, Any]) -> bool:
        seen.append((recorded, actual))
        return False

    with pytest.raises(ReplayDivergedError):
        JournalReplay(_journal(), never).check(0, '{"observation":{"n":1}}')
    assert seen == [({"observation": {"n": 1}}, {"observation": {"n": 1}})]
    assert JournalReplay(_journal()).verify is same_answer


def test_a_step_whose_answer_was_lost_takes_the_replayed_answer() -> None:
    """A step recorded without its answer is not compared: the journal takes the new one."""
    journal = _journal()
    JournalReplay(journal).check(1, {"observation": {"n": 2}})
    assert journal.entries[1].action == {"move": 2}
    assert journal.entries[1].response == {"observation": {"n": 2}}
