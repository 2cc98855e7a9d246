"""The sans-I/O session core: every client decision, without a socket or an event loop."""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest

from envlink import (
    ConnectionLostError,
    OutcomeUnknownError,
    ProtocolError,
    ReconnectPolicy,
    SessionLostError,
)
from envlink._sansio.protocol import Extensions, ObservationFrame, StateFrame
from envlink._sansio.session import (
    Action,
    Dropped,
    DropReason,
    Episode,
    Link,
    Preflight,
    SessionCore,
)

pytestmark = pytest.mark.timeout(30)

PLAIN = Extensions()
EXTENDED = Extensions.from_headers({"envlink-protocol": "1", "envlink-session": "tok",
                                    "envlink-session-id": "s-1"})
RESUMED = Extensions.from_headers({"envlink-protocol": "1", "envlink-session": "tok",
                                   "envlink-session-id": "s-1", "envlink-resumed": "1"})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def obs_text(rid: str | None = None, **observation: Any) -> str:
    frame: dict[str, Any] = {"type": "observation", "data": {"observation": observation}}
    if rid is not None:
        frame["id"] = rid
    return json.dumps(frame)


def core(policy: str = "raise", ext: Extensions = PLAIN, *, episode: bool = False,
         clock: Clock | None = None, **kw: Any) -> SessionCore:
    c = SessionCore(policy=ReconnectPolicy(**kw), on_session_lost=policy,  # type: ignore[arg-type]
                    clock=clock or Clock(), id_prefix="p")
    c.on_connected(ext)
    if episode:
        reset = c.receive(obs_text(), None)
        assert not isinstance(reset, Dropped)
        c.answered("reset", {"seed": 1}, reset)
    return c


# The idempotency matrix: method x frame written or not x extensions x in an episode x
# recovery policy -> what the client does. One row per combination; the expected column
# is the design's rule, written out, not computed.
def expected(method: str, written: bool, ext: bool, episode: bool, policy: str) -> str:
    if episode and method != "reset":
        if policy == "resume" and ext:
            return "recover:envlink-resume"
        if policy == "replay":
            return "recover:replay"
        return "recover:raise"
    if not written or method in ("reset", "state"):
        return "resend"
    return "OutcomeUnknownError"


MATRIX = [
    # method, written, extensions, in episode, policy -> outcome
    ("reset", False, False, False, "raise", "resend"),
    ("reset", True, False, False, "raise", "resend"),
    ("reset", True, True, True, "resume", "resend"),
    ("reset", True, False, True, "replay", "resend"),
    ("state", True, False, False, "raise", "resend"),
    ("state", True, True, False, "resume", "resend"),
    ("state", True, False, True, "raise", "recover:raise"),
    ("state", False, True, True, "resume", "recover:envlink-resume"),
    ("step", False, False, False, "raise", "resend"),
    ("step", False, True, False, "resume", "resend"),
    ("step", True, False, False, "raise", "OutcomeUnknownError"),
    ("step", True, True, False, "resume", "OutcomeUnknownError"),
    ("step", True, True, False, "replay", "OutcomeUnknownError"),
    ("step", True, False, True, "raise", "recover:raise"),
    ("step", True, True, True, "raise", "recover:raise"),
    ("step", True, False, True, "resume", "recover:raise"),  # plain: nothing to resume
    ("step", True, True, True, "resume", "recover:envlink-resume"),
    ("step", False, True, True, "resume", "recover:envlink-resume"),
    ("step", True, False, True, "replay", "recover:replay"),
    ("step", False, False, True, "replay", "recover:replay"),
    ("step", True, True, True, "replay", "recover:replay"),
]


@pytest.mark.parametrize(("method", "written", "ext", "episode", "policy", "outcome"), MATRIX)
def test_idempotency_matrix(method: str, written: bool, ext: bool, episode: bool,
                            policy: str, outcome: str) -> None:
    """A lost connection leads to resend, recovery by the right strategy, or the right error."""
    c = core(policy, EXTENDED if ext else PLAIN, episode=episode)
    decision = c.after_failure(method, ConnectionLostError("lost"), written=written)
    if decision.action is Action.RESEND:
        got = "resend"
    elif decision.action is Action.RECOVER:
        got = f"recover:{decision.strategy}"
    else:
        assert decision.error is not None
        got = type(decision.error).__name__
    assert got == outcome


def test_matrix_covers_every_combination_by_the_rule() -> None:
    """Every combination of the five inputs agrees with the rule the table spells out."""
    for method, written, ext, episode, policy in itertools.product(
            ("reset", "state", "step"), (False, True), (False, True), (False, True),
            ("raise", "replay", "resume")):
        c = core(policy, EXTENDED if ext else PLAIN, episode=episode)
        d = c.after_failure(method, ConnectionLostError("lost"), written=written)
        got = ("resend" if d.action is Action.RESEND else
               f"recover:{d.strategy}" if d.action is Action.RECOVER else
               type(d.error).__name__)
        assert got == expected(method, written, ext, episode, policy), (
            method, written, ext, episode, policy)


def test_an_unreplayable_journal_recovers_by_raising() -> None:
    """replay with a truncated journal cannot rebuild the episode: it says why."""
    c = core("replay", episode=True)
    c.journal.max_steps = 0
    c.journal.record_step({"a": 1}, {"observation": {}})
    d = c.after_failure("step", ConnectionLostError("lost"), written=True)
    assert (d.action, d.strategy) == (Action.RECOVER, "raise")
    err = c.cannot_recover("step", None)
    assert "max_journal_steps=0" in str(err) and err.journal is not None


def test_outcome_unknown_is_a_connection_lost_error() -> None:
    """A step of unknown outcome is still a ConnectionLostError for callers that catch that."""
    d = core().after_failure("step", ConnectionLostError("x"), written=True)
    assert isinstance(d.error, OutcomeUnknownError)
    assert isinstance(d.error, ConnectionLostError)


# ------------------------------------------------------------------ late answers


def test_plain_protocol_deadline_after_sending_discards_the_connection() -> None:
    """Without ids a late answer would be read by the next call: the connection must go."""
    c = core()
    assert c.deadline_expired("step", {"a": 1}, None, sent=True) is False
    assert c.link is Link.NONE
    assert c.preflight("state", connection_open=True) is Preflight.CONNECT


def test_deadline_before_sending_keeps_everything() -> None:
    """A frame that was never sent leaves nothing to arrive late."""
    c = core(ext=EXTENDED)
    assert c.deadline_expired("step", {"a": 1}, "p-1", sent=False) is True
    assert c.link is Link.OPEN and not c.late


def test_with_ids_the_late_answer_is_dropped_and_the_next_answer_delivered() -> None:
    """Request ids: the connection is kept (suspect), the stale answer never delivered."""
    c = core(ext=EXTENDED)
    first = c.next_request_id()
    assert c.deadline_expired("step", {"a": 1}, first, sent=True) is True
    assert c.link is Link.SUSPECT and first in c.late
    assert c.preflight("step", connection_open=True) is Preflight.PROBE
    c.probed(True)
    second = c.next_request_id()
    assert second != first
    assert c.receive(obs_text(first, n=1), second) == Dropped(first)  # never delivered
    assert not c.late
    frame = c.receive(obs_text(second, n=2), second)
    assert isinstance(frame, ObservationFrame) and frame.data.observation == {"n": 2}


def test_an_abandoned_call_lets_the_connection_go_even_with_ids() -> None:
    """An interrupted caller gave up: its late answer is not waited for (the next call
    would queue behind it); mid-episode the next call recovers."""
    c = core(ext=EXTENDED, episode=True)
    rid = c.next_request_id()
    assert c.deadline_expired("step", {"a": 1}, rid, sent=True, abandoned=True) is False
    assert c.link is Link.NONE and rid not in c.late
    assert c.preflight("step", connection_open=False) is Preflight.RECOVER


def test_the_failure_that_let_the_connection_go_is_named_once() -> None:
    """call_failed keeps the error only when it left the episode without a connection;
    the next recovery takes it, the message names it, and a new connection forgets it."""
    c = core(episode=True)
    c.call_failed(ValueError("kept the link"))
    assert c.lost_by is None  # the connection is still open: nothing to name
    c.deadline_expired("step", {"a": 1}, None, sent=True)
    timeout = TimeoutError("step did not complete within 0.1 s")
    c.call_failed(timeout)
    earlier = c.take_lost_by()
    assert earlier is timeout and c.take_lost_by() is None
    error = c.cannot_recover("step", None, earlier)
    assert isinstance(error, SessionLostError)
    assert str(error).endswith("the connection was let go when an earlier call failed: "
                               "TimeoutError: step did not complete within 0.1 s")
    c.call_failed(timeout)
    c.on_connected(PLAIN)
    assert c.lost_by is None


def test_a_suspect_connection_is_replaced_for_reset_and_dropped_if_the_probe_fails() -> None:
    """reset never queues behind a late answer (its session is given up); a dead peer
    sends the call to a new link."""
    c = core(ext=EXTENDED)
    c.deadline_expired("step", None, c.next_request_id(), sent=True)
    assert c.preflight("reset", connection_open=True) is Preflight.REPLACE
    assert c.release_session() == "tok" and c.resume_token is None
    c.probed(False)
    assert c.link is Link.NONE
    assert c.preflight("state", connection_open=False) is Preflight.CONNECT


def test_a_probe_cut_short_leaves_the_connection_suspect() -> None:
    """Only a probe that answered clears suspicion."""
    c = core(ext=EXTENDED)
    c.deadline_expired("step", None, c.next_request_id(), sent=True)
    assert c.preflight("state", connection_open=True) is Preflight.PROBE
    # the probe was cancelled: probed() never called
    assert c.preflight("state", connection_open=True) is Preflight.PROBE


def test_unattributable_frames_while_answers_are_due_drop_the_stream() -> None:
    """A frame without id, or malformed, while a late answer is due: connection lost."""
    c = core(ext=EXTENDED)
    c.deadline_expired("step", None, c.next_request_id(), sent=True)
    with pytest.raises(ConnectionLostError, match="frame without request id"):
        c.receive(obs_text(None), "p-9")
    assert c.link is Link.NONE
    c = core(ext=EXTENDED)
    c.deadline_expired("step", None, c.next_request_id(), sent=True)
    with pytest.raises(ConnectionLostError, match="not valid JSON"):
        c.receive("{garbage", "p-9")


def test_without_late_answers_a_frame_without_id_is_ours_and_garbage_a_protocol_error() -> None:
    """Nothing due: an id-less answer can only be this call's; garbage is a ProtocolError."""
    c = core(ext=EXTENDED)
    assert isinstance(c.receive(obs_text(None, n=1), "p-1"), ObservationFrame)
    with pytest.raises(ProtocolError):
        c.receive("[1, 2]", "p-1")
    assert c.protocol_error() is False  # ids keep the stream aligned: the link stays
    plain = core()
    assert plain.protocol_error() is True and plain.link is Link.NONE


def test_a_new_connection_forgets_the_old_ones_late_answers() -> None:
    """Late answers belong to a connection; a new one starts with none due."""
    c = core(ext=EXTENDED)
    c.deadline_expired("step", None, c.next_request_id(), sent=True)
    c.on_connected(EXTENDED)
    assert not c.late and c.link is Link.OPEN


def test_request_ids_and_envelope_extensions_only_when_negotiated() -> None:
    """Plain servers get no id and no trace fields; negotiated ones get both."""
    plain = core()
    assert plain.next_request_id() is None
    assert json.loads(plain.encode("step", {"a": 1}, None, {"traceparent": "00-x"})) == {
        "type": "step", "data": {"a": 1}}
    ext = core(ext=EXTENDED)
    rid = ext.next_request_id()
    frame = json.loads(ext.encode("state", None, rid, {"traceparent": "00-x"}))
    assert frame == {"type": "state", "id": rid, "traceparent": "00-x"}
    with pytest.raises(TypeError, match="string keys"):
        plain.encode("step", {1: "x"}, None)  # type: ignore[dict-item]


# ------------------------------------------------------------------ episode loss


def test_a_fresh_server_session_mid_episode_loses_the_episode() -> None:
    """Reconnecting without resumption mid-episode: step/state raise until reset()."""
    c = core(episode=True)
    step = c.receive(obs_text(n=1), None)
    assert not isinstance(step, Dropped)
    c.answered("step", {"a": 1}, step)
    c.on_connected(PLAIN)  # a new connection, not resumed
    assert c.episode is Episode.LOST
    with pytest.raises(SessionLostError, match="after 1 steps") as info:
        c.check_call("step")
    assert info.value.journal is not None and info.value.journal.step_count == 1
    c.check_call("reset")  # reset is allowed
    reset = c.receive(obs_text(), None)
    assert not isinstance(reset, Dropped)
    c.answered("reset", {}, reset)
    assert c.episode is Episode.ACTIVE
    c.check_call("step")


def test_a_resumed_session_keeps_the_episode() -> None:
    """Re-attached to the same server session, the episode goes on."""
    c = core("resume", EXTENDED, episode=True)
    c.on_connected(RESUMED)
    assert c.episode is Episode.ACTIVE


def test_failed_recovery_marks_the_episode_lost_and_disconnect_clears_it() -> None:
    """After a failed recovery only reset works; ending the session forgets the loss."""
    c = core("replay", episode=True)
    c.recovery_failed()
    assert c.episode is Episode.LOST and c.link is Link.NONE
    with pytest.raises(SessionLostError):
        c.check_call("state")
    c.on_closed()
    c.check_call("state")
    assert c.episode is Episode.NONE


def test_no_connection_mid_episode_means_recovery_before_any_send() -> None:
    """Mid-episode, a call that finds no connection recovers instead of connecting."""
    c = core("replay", episode=True)
    c.on_dropped(DropReason.FAILED)
    assert c.preflight("step", connection_open=False) is Preflight.RECOVER
    assert c.preflight("reset", connection_open=False) is Preflight.CONNECT


def test_a_reset_resent_after_a_drop_reattaches_to_the_session_held() -> None:
    """A reset whose connection dropped after it was written is resent on the session the
    client holds (its token presented), not on a second one; the old episode is lost."""
    c = core("resume", EXTENDED, episode=True)
    c.on_dropped(DropReason.FAILED)
    assert c.after_failure("reset", ConnectionLostError("lost"), written=True).action \
        is Action.RESEND
    assert c.episode is Episode.LOST
    assert c.preflight("reset", connection_open=False) is Preflight.REATTACH
    assert c.resume_token == "tok"
    c.on_connected(RESUMED)
    assert c.session_id == "s-1" and c.resume_token == "tok"
    reset = c.receive(obs_text("p-1"), "p-1")
    assert not isinstance(reset, Dropped)
    c.answered("reset", {}, reset)
    assert c.episode is Episode.ACTIVE


def test_a_token_the_server_does_not_know_gets_a_fresh_session() -> None:
    """A token naming no session (its connection was refused, at capacity) is harmless:
    the server answers with a fresh session, whose token the client then holds."""
    c = core(ext=EXTENDED, episode=True)
    c.on_dropped(DropReason.FAILED)
    assert c.preflight("reset", connection_open=False) is Preflight.REATTACH
    c.on_connected(Extensions.from_headers({
        "envlink-protocol": "1", "envlink-session": "tok-2", "envlink-session-id": "s-2",
        "envlink-resumed": "0"}))
    assert (c.resume_token, c.session_id, c.episode) == ("tok-2", "s-2", Episode.LOST)


def test_a_reset_never_written_keeps_the_episode_and_plain_sessions_connect() -> None:
    """A reset that never left changes nothing on the server; without a token (the plain
    protocol, or the session given up) a new connection is a new session."""
    c = core("resume", EXTENDED, episode=True)
    c.on_dropped(DropReason.FAILED)
    c.after_failure("reset", ConnectionLostError("lost"), written=False)
    assert c.episode is Episode.ACTIVE
    assert c.preflight("state", connection_open=False) is Preflight.RECOVER
    c.release_session()
    assert c.preflight("reset", connection_open=False) is Preflight.CONNECT
    plain = core(episode=True)
    plain.on_dropped(DropReason.FAILED)
    plain.after_failure("reset", ConnectionLostError("lost"), written=True)
    assert plain.preflight("reset", connection_open=False) is Preflight.CONNECT


def test_the_journal_follows_answers_only_inside_an_episode() -> None:
    """Steps are recorded only in an episode; state's episode id is adopted."""
    c = core()
    step = c.receive(obs_text(n=1), None)
    assert not isinstance(step, Dropped)
    c.answered("step", {"a": 1}, step)
    assert c.journal.step_count == 0
    c = core(episode=True)
    c.answered("step", {"a": 1}, step)
    state = c.receive(json.dumps({"type": "state", "data": {"episode_id": "ep-9"}}), None)
    assert isinstance(state, StateFrame)
    c.answered("state", None, state)
    assert c.journal.step_count == 1 and c.journal.episode_id == "ep-9"


# ------------------------------------------------------------------ flapping


def test_flapping_continues_the_outage_count_and_is_reported_once() -> None:
    """Connections dying young share one attempt count; past it, one error, then afresh."""
    clock = Clock()
    c = core(clock=clock, max_attempts=3, stable_after=10.0)
    assert c.connect_attempts_used("ws://x") == 0
    for _ in range(3):
        clock.now += 1.0
        c.on_dropped(DropReason.FAILED)  # died 1 s after opening: short-lived
        used = c.connect_attempts_used("ws://x")
        c.connects_made(1)
        c.on_connected(PLAIN)
    assert used == 2
    clock.now += 1.0
    c.on_dropped(DropReason.FAILED)
    with pytest.raises(ConnectionLostError, match="keeps dropping: 3 reconnects"):
        c.connect_attempts_used("ws://x")
    assert c.connect_attempts_used("ws://x") == 0  # reported once; a new outage


def test_a_stable_connection_or_a_quiet_spell_starts_a_new_outage() -> None:
    """A drop after stable_after, or a quiet period that long, resets the count."""
    clock = Clock()
    c = core(clock=clock, max_attempts=3, stable_after=10.0)
    clock.now += 1.0
    c.on_dropped(DropReason.FAILED)
    c.connects_made(2)
    c.on_connected(PLAIN)
    clock.now += 1.0
    c.on_dropped(DropReason.FAILED)
    assert c.connect_attempts_used("ws://x") == 2
    clock.now += 11.0  # quiet since the last drop
    assert c.connect_attempts_used("ws://x") == 0
    c.on_connected(PLAIN)
    clock.now += 30.0  # lived longer than stable_after
    c.on_dropped(DropReason.FAILED)
    assert c.connect_attempts_used("ws://x") == 0


# ------------------------------------------------------------ the named inputs


@pytest.mark.parametrize(("policy", "release", "now", "count", "close"), [
    ("raise", "tok", False, False, "det"),
    ("replay", "tok", True, True, "det"),
    ("resume", None, False, False, None),
    ("auto", None, False, False, None),
])
def test_lost_mid_episode_decides_the_strategy_and_what_to_end(
        policy: str, release: str | None, now: bool, count: bool, close: str | None) -> None:
    """The loss decision names the mechanism and the server sessions the policy will not
    resume (forgotten by the core, hidden from repr); resuming policies keep them."""
    c = core(policy, EXTENDED, episode=True)
    c.on_detached_created("det")
    c.journal.record_unknown({"a": 1}, "p-9")
    mechanism = c.mechanism
    d = c.lost_mid_episode()
    assert (d.action, d.strategy) == (Action.RECOVER, mechanism)
    assert (d.release, d.release_now, d.count_released, d.close_detached) == (
        release, now, count, close)
    assert (c.resume_token, c.detached_id) == (("tok", "det") if release is None else (None, None))
    assert "tok" not in repr(d) and "det" not in repr(d)
    lost = c.after_failure("step", ConnectionLostError("x"), written=True)
    assert (lost.action, lost.strategy) == (Action.RECOVER, c.mechanism)


def test_restore_gives_the_core_an_episode_without_its_connection() -> None:
    """A restored session is mid-episode with no connection: the next step recovers it."""
    c = core("resume")
    journal = core("resume", episode=True).journal.snapshot()
    c.restore(journal, session_id="s-9", resume_token="tok", detached_id=None)
    assert (c.episode, c.link, c.journal, c.session_id) == (
        Episode.ACTIVE, Link.NONE, journal, "s-9")
    assert c.preflight("step", connection_open=False) is Preflight.RECOVER
    assert c.recovery_plan() == ["envlink-resume"]


@pytest.mark.parametrize("policy", ["resume", "auto", "replay"])
def test_the_first_loss_after_restore_is_planned_and_only_that_one(policy: str) -> None:
    """The attach's resume is decided as planned (reported as a recovery, not a loss);
    a loss after it is a loss again."""
    c = core(policy)
    c.restore(core(policy, episode=True).journal.snapshot(), session_id="s-9",
              resume_token="tok", detached_id=None)
    assert c.lost_mid_episode().planned
    assert not c.lost_mid_episode().planned
    assert not core(policy, episode=True).lost_mid_episode().planned


def test_detached_session_inputs() -> None:
    """Created, unavailable and gone move the detached session's state as named."""
    c = core("resume")
    assert c.wants_detached
    c.on_detached_created("det")
    assert (c.detached_id, c.detached_offered) == ("det", True)
    c.on_detached_gone()
    assert (c.detached_id, c.detached_offered) == (None, True)
    c.on_detached_unavailable()
    assert c.detached_offered is False and not c.wants_detached
    assert SessionCore(policy=ReconnectPolicy(), production=True).production


def test_a_detached_drop_and_a_fork_forget_the_server_session() -> None:
    """Handing the session off forgets its resume token and detached session; a forked
    child loses the episode and the token, the parent's."""
    c = core("resume", EXTENDED, episode=True)
    c.on_detached_created("det")
    c.on_dropped(DropReason.DETACHED)
    assert (c.link, c.resume_token, c.detached_id) == (Link.NONE, None, None)
    forked = core("resume", EXTENDED, episode=True)
    forked.on_forked()
    assert (forked.episode, forked.resume_token) == (Episode.LOST, None)
    kept = core("resume", EXTENDED, episode=True)
    kept.on_dropped(DropReason.INHERITED)
    assert kept.resume_token == "tok"


def test_the_settings_inputs() -> None:
    """The caller's settings go in through setters: the recovery policy (checked), the
    reconnect policy, and whether the journal keeps each step."""
    c = core("raise")
    assert c.set_recovery_policy("replay") == "replay" and c.record_steps
    with pytest.raises(ValueError, match="bogus"):
        c.set_recovery_policy("bogus")  # type: ignore[arg-type]
    c.set_record_steps(False)
    assert not c.record_steps
    c.set_record_steps(None)
    assert c.record_steps
    policy = ReconnectPolicy(max_attempts=2)
    c.set_reconnect_policy(policy)
    assert c.policy is policy
