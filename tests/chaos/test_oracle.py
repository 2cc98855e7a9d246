"""The chaos oracle catches what it must: each invariant fails on a record that breaks it."""

from __future__ import annotations

from typing import Any

import pytest

from ._oracle import Call, ServerSegment, check_segment, reference_answers

pytestmark = pytest.mark.timeout(30)

SEED = 4242


def _episode(moves: list[int]) -> tuple[list[Call], ServerSegment]:
    """A clean sequential segment: a reset, then each move answered fault-free."""
    answers = reference_answers(SEED, moves)
    calls = [Call(0, "reset", SEED, None, 1.0, 0.0, 0.01, ok=True)]
    server = ServerSegment(SEED, session=1)
    for i, (move, answer) in enumerate(zip(moves, answers, strict=True), start=1):
        calls.append(Call(i, "step", SEED, move, 1.0, i, i + 0.01, ok=True, answer=answer))
        server.steps.append((move, answer))
    return calls, server


def _state(server: ServerSegment) -> dict[str, Any]:
    return {"seed": SEED, "position": sum(server.moves), "step_count": len(server.moves)}


def _journal(server: ServerSegment, moves: list[int] | None = None) -> dict[str, Any]:
    steps = [{"action": {"move": m}, "response": {
        "observation": {"position": a["position"], "draw": a["draw"], "step": a["step"]},
        "reward": a["reward"], "done": a["done"]}}
        for m, a in server.steps if moves is None or m in moves]
    return {"reset_kwargs": {"seed": SEED}, "steps": steps, "truncated": False}


def _check(calls: list[Call], servers: list[ServerSegment], **kwargs: Any) -> list[str]:
    options: dict[str, Any] = {"final_state": _state(servers[-1]),
                               "final_journal": _journal(servers[-1]),
                               "policy": "replay", "sequential": True, "tolerance": 0.1}
    options.update(kwargs)
    return check_segment(SEED, calls, servers, **options)


def test_clean_episode_passes() -> None:
    """A fault-free record satisfies every invariant (the checks are not vacuous below)."""
    calls, server = _episode([1, 2, 4, 8])
    assert _check(calls, [server]) == []


def test_step_applied_twice_is_caught() -> None:
    """A server session that applied a step twice is a violation."""
    calls, server = _episode([1, 2, 4])
    server.steps.append(server.steps[-1])
    assert any("applied a step twice" in v for v in _check(calls, [server]))


def test_answer_delivered_to_the_wrong_call_is_caught() -> None:
    """An answer that belongs to another call (its bit is missing) is a violation."""
    calls, server = _episode([1, 2, 4])
    calls[2].answer, calls[3].answer = calls[3].answer, calls[2].answer
    assert any("does not include it" in v for v in _check(calls, [server]))


def test_answer_not_from_the_fault_free_run_is_caught() -> None:
    """A draw that differs from the fault-free run of the same seed is a violation."""
    calls, server = _episode([1, 2])
    assert calls[2].answer is not None
    calls[2].answer = {**calls[2].answer, "draw": calls[2].answer["draw"] + 1}
    violations = _check(calls, [server])
    assert any("fault-free run" in v for v in violations)


def test_definitely_failed_step_that_was_applied_is_caught() -> None:
    """A step the caller was told failed (ServerError) must not have been applied."""
    calls, server = _episode([1, 2, 4])
    calls[3].ok, calls[3].answer = False, None
    calls[3].error, calls[3].error_module = "ServerError", "envlink"
    assert any("told they failed" in v for v in _check(calls, [server]))


def test_unknown_outcome_step_may_have_been_applied() -> None:
    """A step whose error says the outcome is unknown may have been applied."""
    calls, server = _episode([1, 2, 4])
    calls[3].ok, calls[3].answer = False, None
    calls[3].error, calls[3].error_module = "OutcomeUnknownError", "envlink"
    assert _check(calls, [server], policy="raise") == []


def test_late_call_is_caught() -> None:
    """A call that returned later than its deadline + tolerance is a violation."""
    calls, server = _episode([1, 2])
    calls[1].ended = calls[1].started + calls[1].timeout + 0.2
    assert any("deadline" in v for v in _check(calls, [server]))


def test_foreign_exception_is_caught() -> None:
    """An exception outside envlink's error tree is a violation."""
    calls, server = _episode([1, 2])
    calls[2].ok, calls[2].answer = False, None
    calls[2].error, calls[2].error_module = "KeyError", None
    assert any("outside envlink's error tree" in v for v in _check(calls, [server]))


def test_journal_that_omits_an_applied_step_is_caught() -> None:
    """client.journal must describe what the server applied (here it leaves a step out)."""
    calls, server = _episode([1, 2, 4])
    violations = _check(calls, [server], final_journal=_journal(server, [1, 4]))
    assert any("does not describe what the server applied" in v for v in violations)


def test_session_lost_journal_must_match_a_server_session() -> None:
    """A SessionLostError journal naming a step no session applied is a violation."""
    calls, server = _episode([1, 2])
    lost = Call(3, "step", SEED, 4, 1.0, 3, 3.01, error="SessionLostError",
                error_module="envlink", journal=_journal(server) | {"steps": [
                    {"action": {"move": 2}, "response": {}}]})
    violations = _check([*calls, lost], [server], final_state=None, final_journal=None)
    assert any("matches no server session" in v for v in violations)
    missing = Call(3, "step", SEED, 4, 1.0, 3, 3.01, error="SessionLostError",
                   error_module="envlink", journal_missing=True)
    violations = _check([*calls, missing], [server], final_state=None, final_journal=None)
    assert any("without a journal" in v for v in violations)


def test_counting_journals_must_count_what_the_server_applied() -> None:
    """A journal that keeps no steps must count exactly what a session applied (final and lost)."""
    calls, server = _episode([1, 2, 4])
    counted = {"reset_kwargs": {"seed": SEED}, "steps": [], "truncated": False,
               "keep_steps": False}
    assert _check(calls, [server], final_journal=counted | {"steps_applied": 3}) == []
    for wrong in (2, 4):
        violations = _check(calls, [server], final_journal=counted | {"steps_applied": wrong})
        assert any("does not describe what the server applied" in v for v in violations)
    lost = Call(4, "step", SEED, 8, 1.0, 4, 4.01, error="SessionLostError",
                error_module="envlink", journal=counted | {"steps_applied": 2})
    violations = _check([*calls, lost], [server], final_state=None, final_journal=None)
    assert any("fewer than the 3 answered" in v for v in violations)
    lost.journal = counted | {"steps_applied": 3}
    assert _check([*calls, lost], [server], final_state=None, final_journal=None) == []


def test_replayed_episode_must_equal_its_fault_free_run() -> None:
    """Answers that skip a step of a replay episode no longer equal the fault-free run."""
    calls, server = _episode([1, 2, 4])
    # The server session the episode ended on skipped step 2: the last answer is built
    # on [1, 4], so the episode differs from its fault-free run.
    other = ServerSegment(SEED, session=2)
    for move, answer in zip([1, 4], reference_answers(SEED, [1, 4]), strict=True):
        other.steps.append((move, answer))
    calls[3].answer = other.steps[-1][1]
    violations = _check(calls, [server, other], final_state=_state(other),
                        final_journal=_journal(other))
    assert any("differs from its fault-free run" in v for v in violations)


def test_lateness_is_excused_only_by_measured_cpu_starvation() -> None:
    """A late call passes only if the CPU starvation measured during it explains the excess."""
    calls, server = _episode([1, 2])
    calls[1].ended = calls[1].started + calls[1].timeout + 0.25
    calls[1].starved = 0.2  # 0.25 late - 0.1 tolerance = 0.15 <= 0.2: the machine's doing
    assert _check(calls, [server]) == []
    calls[1].starved = 0.1  # 0.05 s of the lateness is the client's
    assert any("deadline" in v for v in _check(calls, [server]))
