"""Ground truth for the chaos suite, from outside the client.

Every step of a chaos episode moves the deterministic walker by a distinct power of two
(``2**i`` for the episode's i-th call), so the position in any observation names exactly
the set of steps the server had applied, and the step counter says how many times it
applied one: a step applied twice shows up as ``popcount(position) < step`` (doubling a
power of two carries into another bit). The draws come from the reference
:class:`~envlink.server.DeterministicEnvironment` run fault-free on the same seed.

The server side is recorded by :class:`Ledger`: the chaos servers build their sessions
with :class:`LedgerEnvironment`, a deterministic environment that notes every reset and
every applied step, per session, before the answer leaves the server.

Pure: no I/O, no envlink client import. :func:`check_segment` turns the records of one
episode segment (one ``reset`` seed) into a list of violations.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from envlink.server import DeterministicEnvironment

__all__ = [
    "DEFINITE_FAILURES",
    "MAX_STEPS",
    "UNKNOWN_OUTCOME",
    "Call",
    "Ledger",
    "LedgerEnvironment",
    "ServerSegment",
    "answer_problems",
    "check_segment",
    "reference_answers",
]

#: Step limit of chaos episodes: never reached, so ``done`` is always false.
MAX_STEPS = 1_000_000

#: Errors that say the call's outcome is unknown (the step may have been applied).
UNKNOWN_OUTCOME = frozenset({
    "OutcomeUnknownError", "CallTimeoutError", "ProtocolError", "SessionLostError",
    "ReplayDivergedError", "SessionGoneError",
})
#: Errors that say the call definitely failed: its step must not have been applied.
#: ``CallTimeoutError(not sent)`` is a ``CallTimeoutError`` whose ``outcome_unknown``
#: is false.
DEFINITE_FAILURES = frozenset({
    "CallTimeoutError(not sent)", "ServerError", "CapacityReachedError", "ToolCallError",
    "ServerValidationError", "FactoryError", "SessionError", "McpError",
    "ConnectError", "HandshakeRejectedError", "ConnectionLostError", "RetryBudgetExhaustedError",
    "ClientClosedError", "ReentrantCallError",
})


@dataclass
class Call:
    """One call made by a chaos driver, as the caller saw it."""

    index: int
    method: str  # "reset" | "step" | "state"
    seed: int  # the episode segment (the seed of the reset that began it)
    move: int | None
    timeout: float
    started: float
    ended: float
    fault: str | None = None
    ok: bool = False
    #: The answer: a step/reset observation frame's data, or the state dict.
    answer: dict[str, Any] | None = None
    error: str | None = None  # the exception's class name
    error_module: str | None = None
    message: str = ""
    #: ``SessionLostError.journal.to_dict()``, when the error carried one.
    journal: dict[str, Any] | None = None
    journal_missing: bool = False
    #: Seconds the caller's thread and the client's loop thread spent runnable but
    #: waiting for a CPU during the call (the kernel's run-queue delay): a late call
    #: is excused only as far as the machine, not the client, made it late.
    starved: float = 0.0

    @property
    def elapsed(self) -> float:
        return self.ended - self.started

    def late_by(self, tolerance: float) -> float:
        """Seconds past deadline + tolerance that the machine's CPU starvation does not
        explain (0 if none)."""
        return max(0.0, self.elapsed - self.timeout - tolerance - self.starved)


@dataclass
class ServerSegment:
    """What one server-side session applied after one reset."""

    seed: int
    session: int  # which environment instance (server session) it ran on
    steps: list[tuple[int, dict[str, Any]]] = field(default_factory=list)  # (move, data)

    @property
    def moves(self) -> list[int]:
        return [m for m, _ in self.steps]


class Ledger:
    """Every reset and applied step on the chaos servers, per session. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_seed: dict[int, list[ServerSegment]] = {}
        self._sessions = 0

    def new_session(self) -> int:
        with self._lock:
            self._sessions += 1
            return self._sessions

    def begin(self, seed: int, session: int) -> ServerSegment:
        segment = ServerSegment(seed, session)
        with self._lock:
            self._by_seed.setdefault(seed, []).append(segment)
        return segment

    def record(self, segment: ServerSegment, move: int, data: dict[str, Any]) -> None:
        with self._lock:
            segment.steps.append((move, data))

    def segments(self, seed: int) -> list[ServerSegment]:
        """The server segments begun with ``seed``, oldest first (copies)."""
        with self._lock:
            return [ServerSegment(s.seed, s.session, list(s.steps))
                    for s in self._by_seed.get(seed, [])]

    def forget(self, seeds: Iterable[int]) -> None:
        """Drop checked segments (keeps memory flat over a long soak)."""
        with self._lock:
            for seed in seeds:
                self._by_seed.pop(seed, None)


class LedgerEnvironment(DeterministicEnvironment):
    """The deterministic environment, noting what it applies in a :class:`Ledger`."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__()
        self._ledger = ledger
        self._session = ledger.new_session()
        self._segment: ServerSegment | None = None

    def reset(self, seed: int = 0, max_steps: int | None = None,
              episode_id: str | None = None) -> Any:
        result = super().reset(seed=seed, max_steps=max_steps, episode_id=episode_id)
        self._segment = self._ledger.begin(seed, self._session)
        return result

    def step(self, action: dict[str, Any]) -> Any:
        result = super().step(action)
        if self._segment is not None:
            self._ledger.record(self._segment, action["move"], project(result.to_wire()))
        return result


def project(data: dict[str, Any]) -> dict[str, Any]:
    """The parts of an observation frame's data that the oracle compares."""
    obs = data.get("observation") or {}
    return {"position": obs.get("position"), "draw": obs.get("draw"), "step": obs.get("step"),
            "reward": data.get("reward"), "done": data.get("done")}


@lru_cache(maxsize=64)
def _reference(seed: int, count: int) -> tuple[tuple[int, float], ...]:
    """(draw, reward) after each of ``count`` steps of a fault-free run of ``seed``."""
    env = DeterministicEnvironment()
    env.reset(seed=seed, max_steps=MAX_STEPS)
    out = []
    for _ in range(count):
        result = env.step({"move": 0})
        out.append((int(result.observation["draw"]), float(result.reward or 0.0)))
    return tuple(out)


def reference_answers(seed: int, moves: Sequence[int]) -> list[dict[str, Any]]:
    """The projected answers of a fault-free run of ``seed`` applying ``moves`` in order."""
    env = DeterministicEnvironment()
    env.reset(seed=seed, max_steps=MAX_STEPS)
    return [project(env.step({"move": m}).to_wire()) for m in moves]


def answer_problems(seed: int, move: int, answer: dict[str, Any]) -> list[str]:
    """Why ``answer`` cannot be the fault-free answer to applying ``move`` in ``seed``.

    The position must include the move's own bit, count each applied step once, and
    the draw/reward must be the reference's for that step number.
    """
    position, step = answer.get("position"), answer.get("step")
    if not isinstance(position, int) or not isinstance(step, int) or step < 1:
        return [f"malformed answer {answer!r}"]
    problems = []
    if not position & move:
        problems.append(f"answer to move {move} does not include it (position {position})")
    if position.bit_count() != step:
        problems.append(f"position {position} has {position.bit_count()} steps, the server "
                        f"counted {step}: a step was applied twice")
    ref = _reference(seed, step)
    if (answer.get("draw"), answer.get("reward")) != ref[step - 1]:
        problems.append(f"draw/reward {answer.get('draw')}/{answer.get('reward')} at step "
                        f"{step} differ from the fault-free run's {ref[step - 1]}")
    if answer.get("done") is not False:
        problems.append(f"done is {answer.get('done')!r} before max_steps")
    return problems


def _journal_moves(journal: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for entry in journal.get("steps", []):
        out.append((int(entry["action"]["move"]), project(entry["response"])))
    return out


def check_journal(seed: int, journal: dict[str, Any], calls: Sequence[Call],
                  servers: Sequence[ServerSegment] | None, *, what: str,
                  upto: float) -> list[str]:
    """A journal must describe what a server session of this segment applied.

    Its steps are a prefix of one server segment's (same moves, same answers), and any
    step that segment applied beyond it belongs to a call whose outcome was unknown;
    every step whose answer the caller received is in it.
    """
    problems: list[str] = []
    if journal.get("reset_kwargs", {}).get("seed") != seed:
        return [f"{what}: journal of reset {journal.get('reset_kwargs')} in segment {seed}"]
    if journal.get("truncated"):
        return problems
    if not journal.get("keep_steps", True):
        return _check_counted_journal(journal, calls, servers, what=what, upto=upto)
    entries = _journal_moves(journal)
    moves = [m for m, _ in entries]
    by_move = {c.move: c for c in calls if c.method == "step"}
    for call in calls:
        if call.method == "step" and call.ok and call.ended <= upto \
                and call.move not in moves:
            problems.append(f"{what}: answered step {call.move} missing from the journal")
    if len(set(moves)) != len(moves):
        problems.append(f"{what}: journal lists a step twice: {moves}")
    if servers is None:
        return problems
    for server in servers:
        if server.steps[:len(entries)] == entries:
            extra = server.moves[len(entries):]
            unexplained = [m for m in extra
                           if m not in by_move or by_move[m].ok
                           or by_move[m].error not in UNKNOWN_OUTCOME]
            if not unexplained:
                return problems
    problems.append(f"{what}: journal {moves} matches no server session of segment {seed} "
                    f"(applied: {[s.moves for s in servers]})")
    return problems


def _check_counted_journal(journal: dict[str, Any], calls: Sequence[Call],
                           servers: Sequence[ServerSegment] | None, *, what: str,
                           upto: float) -> list[str]:
    """A journal that counts steps (keeps none) must count what a server session applied.

    Its ``steps_applied`` covers every step whose answer the caller received, and a
    server session of the segment applied that many steps first, then only steps whose
    outcome was unknown.
    """
    applied = int(journal["steps_applied"])
    answered = [c.move for c in calls if c.method == "step" and c.ok and c.ended <= upto]
    problems: list[str] = []
    if len(answered) > applied:
        problems.append(f"{what}: counts {applied} steps, fewer than the {len(answered)} "
                        "answered")
    if servers is None:
        return problems
    by_move = {c.move: c for c in calls if c.method == "step"}
    for server in servers:
        if len(server.moves) < applied or not set(answered) <= set(server.moves[:applied]):
            continue
        unexplained = [m for m in server.moves[applied:]
                       if m not in by_move or by_move[m].ok
                       or by_move[m].error not in UNKNOWN_OUTCOME]
        if not unexplained:
            return problems
    problems.append(f"{what}: {applied} steps counted match no server session "
                    f"(applied: {[s.moves for s in servers]})")
    return problems


def check_segment(seed: int, calls: Sequence[Call], servers: Sequence[ServerSegment] | None,
                  *, final_state: dict[str, Any] | None, final_journal: dict[str, Any] | None,
                  policy: str, sequential: bool, tolerance: float) -> list[str]:
    """Every invariant for one episode segment; returns the violations found.

    Args:
        seed: the segment's reset seed.
        calls: the calls of the segment, in the order they were made.
        servers: the ledger's server segments for ``seed`` (``None``: server out of
            process, only the answers and the final state are checked).
        final_state: the state read fault-free at the end (``None``: the episode was
            lost, or not read).
        final_journal: ``client.journal.to_dict()`` read with ``final_state``.
        policy: the recovery policy the client ran under.
        sequential: calls were made one after another (else concurrently).
        tolerance: seconds a call may take beyond its deadline.
    """
    v: list[str] = []
    steps = [c for c in calls if c.method == "step"]
    seen: list[dict[str, Any]] = []
    for call in calls:
        tag = f"call {call.index} ({call.method}, seed {seed})"
        if call.late_by(tolerance) > 0:
            v.append(f"{tag}: returned after {call.elapsed:.3f} s, deadline {call.timeout} s "
                     f"(CPU starvation during the call: {call.starved:.3f} s)")
        if call.error is not None and not call.error_module:
            v.append(f"{tag}: raised {call.error} outside envlink's error tree: {call.message}")
        if call.journal_missing:
            v.append(f"{tag}: {call.error} without a journal")
        if call.ok and call.method == "step":
            assert call.move is not None and call.answer is not None
            v += [f"{tag}: {p}" for p in answer_problems(seed, call.move, call.answer)]
        if call.ok and call.method == "state":
            state = call.answer or {}
            if state.get("seed") != seed:
                v.append(f"{tag}: state of seed {state.get('seed')} in segment {seed}")
            pos, count = state.get("position"), state.get("step_count")
            if not isinstance(pos, int) or not isinstance(count, int) \
                    or pos.bit_count() != count:
                v.append(f"{tag}: state {state} counts a step twice")
        if call.journal is not None and call.journal not in seen:
            seen.append(call.journal)  # later calls of a lost episode repeat the same one
            v += check_journal(seed, call.journal, calls, servers,
                               what=f"journal of call {call.index}", upto=call.started)

    answered = [c for c in steps if c.ok and c.answer is not None]
    order = answered if sequential else sorted(answered, key=lambda c: c.answer["step"])  # type: ignore[index]
    for before, after in itertools.pairwise(order):
        a, b = before.answer, after.answer
        assert a is not None and b is not None
        if not (b["step"] > a["step"] and a["position"] & b["position"] == a["position"]):
            v.append(f"seed {seed}: answer to call {after.index} ({b}) does not extend the "
                     f"answer to call {before.index} ({a})")

    failed = {c.move for c in steps if c.error in DEFINITE_FAILURES}
    if servers is not None:
        for server in servers:
            moves = server.moves
            if len(set(moves)) != len(moves):
                v.append(f"seed {seed}: server session {server.session} applied a step twice: "
                         f"{moves}")
            wrongly = failed & set(moves)
            if wrongly:
                told = {c.move: f"{c.error}: {c.message}" for c in steps if c.move in wrongly}
                v.append(f"seed {seed}: steps {sorted(wrongly)} were applied by session "
                         f"{server.session} although the caller was told they failed ({told})")
        for call in answered:
            assert call.answer is not None
            if not any((call.move, call.answer) in s.steps for s in servers):
                v.append(f"seed {seed}: call {call.index} got an answer no server session "
                         f"gave for its step: {call.answer}")

    if final_state is not None:
        pos, count = final_state.get("position"), final_state.get("step_count")
        if final_state.get("seed") != seed or not isinstance(pos, int) \
                or not isinstance(count, int) or pos.bit_count() != count:
            v.append(f"seed {seed}: final state {final_state} is not this segment's or counts "
                     "a step twice")
        else:
            for move in failed:
                if pos & move:
                    v.append(f"seed {seed}: step {move} is applied in the final state although "
                             "the caller was told it failed")
            for call in answered:
                assert call.move is not None
                if not pos & call.move:
                    v.append(f"seed {seed}: answered step {call.move} is missing from the "
                             f"episode's final state {final_state}")
            if final_journal is not None and not final_journal.get("keep_steps", True):
                # Counted, not kept: the server applied the counted steps, then some of
                # those still of unknown outcome.
                counted = int(final_journal["steps_applied"])
                unknown = {int(a["move"]) for a in final_journal.get("unknown_steps", [])}
                if not 0 <= count - counted <= len(unknown) or (
                        servers and (len(servers[-1].moves) < counted or not set(
                            servers[-1].moves[counted:]) <= unknown)):
                    v.append(f"seed {seed}: client.journal counts {counted} steps (unknown: "
                             f"{sorted(unknown)}), which does not describe what the server "
                             f"applied (position {pos}, {count} steps)")
            elif final_journal is not None and not final_journal.get("truncated"):
                entries = _journal_moves(final_journal)
                moves = [m for m, _ in entries]
                # Steps still listed as of unknown outcome may or may not be applied.
                unknown = {int(a["move"]) for a in final_journal.get("unknown_steps", [])}
                rest = pos - sum(moves)
                if set(moves) & unknown or rest < 0 or rest & sum(moves) \
                        or any(rest & (1 << b) and (1 << b) not in unknown
                               for b in range(rest.bit_length())):
                    v.append(f"seed {seed}: client.journal {moves} (unknown: {sorted(unknown)}) "
                             f"does not describe what the server applied (position {pos}, "
                             f"{count} steps)")
                if servers:
                    latest = servers[-1]
                    if latest.steps[:len(entries)] != entries \
                            or not set(latest.moves[len(entries):]) <= unknown:
                        v.append(f"seed {seed}: client.journal {moves} (unknown: "
                                 f"{sorted(unknown)}) differs from the serving session's "
                                 f"applied steps {latest.moves}")
        if sequential and policy in ("replay", "resume") and steps \
                and all(c.ok for c in steps):
            expected = reference_answers(seed, [c.move or 0 for c in steps])
            got = [c.answer for c in steps]
            if got != expected:
                v.append(f"seed {seed}: {policy} episode differs from its fault-free run")
    return v
