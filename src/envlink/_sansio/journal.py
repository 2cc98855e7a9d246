"""The episode journal: what an episode did, enough to replay or rebuild it. No I/O."""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, overload

from pydantic_core import PydanticSerializationError, to_json

from envlink._config import check_count
from envlink._errors import ProtocolError

__all__ = ["EpisodeJournal", "JournalEntry", "encode_payload"]


def encode_payload(value: dict[str, Any] | str) -> str:
    """A payload as the journal keeps it: compact JSON text (text is kept as it is).

    Raises:
        ProtocolError: the payload cannot be serialised.
    """
    # Actions and answers are kept as JSON text, which is immutable and cheaper than a
    # deep copy. Nothing the caller does to an action or an observation can change the
    # record, nor what replay resends. pydantic's encoder is used because it is one C
    # call. NaN and infinities are kept as the JSON constants json.loads reads back.
    if isinstance(value, str):
        return value
    try:
        return to_json(value, inf_nan_mode="constants").decode()
    except PydanticSerializationError:
        pass  # deeper than pydantic's serialiser goes (255 levels): the stdlib's goes further
    try:
        return json.dumps(value, separators=(",", ":"))
    except (RecursionError, ValueError, TypeError) as exc:
        raise ProtocolError(f"a payload could not be recorded in the journal: {exc}") from exc


class _Text:
    """A :class:`JournalEntry` field: JSON text, cut out of the entry's frames on first read.

    An entry recorded by the client holds the request frame it sent and the answer
    frame it received, as they were on the wire; the payloads' JSON text is cut out of
    them only when someone reads a field (replay, an error's journal, ``to_dict``). A
    step thus costs the journal one small object, not two serialisations.
    """

    __slots__ = ("index", "name")

    def __init__(self, index: int) -> None:
        self.index = index
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> NoReturn: ...
    @overload
    def __get__(self, obj: JournalEntry, owner: type | None = None) -> str | None: ...

    def __get__(self, obj: JournalEntry | None, owner: type | None = None) -> str | None:
        if obj is None:
            raise AttributeError(self.name)  # no default (dataclass field protocol)
        return _texts(obj)[self.index]


def _frame_data(frame: str | bytes) -> str:
    """The ``data`` of a frame's JSON text, as compact JSON text."""
    return encode_payload(json.loads(frame)["data"])


def _texts(entry: JournalEntry) -> tuple[str, str | None]:
    """The entry's two fields, cut out of its frames (once) if it still holds them."""
    try:
        texts: tuple[str, str | None] = _TEXTS.__get__(entry)
        return texts
    except AttributeError:
        pass
    try:
        sent, received = _SENT.__get__(entry), _RECEIVED.__get__(entry)
    except AttributeError:  # another thread cut them just now
        texts = _TEXTS.__get__(entry)
        return texts
    texts = (_frame_data(sent), _frame_data(received))
    _TEXTS.__set__(entry, texts)
    # The texts are what is kept from now on; another thread may have dropped the frames.
    with contextlib.suppress(AttributeError):
        _SENT.__delete__(entry)
        _RECEIVED.__delete__(entry)
    return texts


@dataclass(frozen=True, init=False)
class JournalEntry:
    """One applied step: the action payload sent and the ``data`` the server answered.

    Attributes:
        action_json: the action payload that was sent, as JSON text.
        response_json: the answer's ``data`` as JSON text; ``None`` for a step the
            server is known to have applied but whose answer was lost (settled from
            a resumed session's ``step_count``).
    """

    # Slots, not a __dict__: a long episode keeps one entry per step (56 bytes each,
    # where an instance dictionary took 240). The client's entries hold the frames
    # (_sent, _received) until a field is read; then the fields' texts (_texts).
    __slots__ = ("_received", "_sent", "_texts")

    if TYPE_CHECKING:  # plain required fields, as far as type checkers go
        action_json: str
        response_json: str | None
    else:
        action_json: str = _Text(0)
        response_json: str | None = _Text(1)

    def __init__(self, action_json: str, response_json: str | None) -> None:
        _TEXTS.__set__(self, (action_json, response_json))

    @property
    def __dict__(self) -> dict[str, Any]:  # type: ignore[override]
        """The fields serialised so far: none while the entry still holds its frames."""
        try:
            action_json, response_json = _TEXTS.__get__(self)
        except AttributeError:
            return {}
        return {"action_json": action_json, "response_json": response_json}

    def __getstate__(self) -> tuple[str | bytes, str | bytes | None, bool]:
        try:
            action_json, response_json = _TEXTS.__get__(self)
        except AttributeError:
            try:  # still the frames: they travel as they are
                return _SENT.__get__(self), _RECEIVED.__get__(self), True
            except AttributeError:  # another thread cut them just now
                action_json, response_json = _TEXTS.__get__(self)
        return action_json, response_json, False

    def __setstate__(self, state: tuple[str | bytes, str | bytes | None, bool]) -> None:
        first, second, frames = state
        if frames:
            _SENT.__set__(self, first)
            _RECEIVED.__set__(self, second)
        else:
            _TEXTS.__set__(self, (first, second))

    @property
    def action(self) -> dict[str, Any]:
        """The action payload (a fresh copy each time)."""
        data: dict[str, Any] = json.loads(self.action_json)
        return data

    @property
    def response(self) -> dict[str, Any] | None:
        """The answer's ``data`` (a fresh copy each time); ``None`` if it was lost."""
        if self.response_json is None:
            return None
        data: dict[str, Any] = json.loads(self.response_json)
        return data


# The slots' own descriptors: the frozen dataclass refuses ordinary assignment.
_TEXTS: Any = vars(JournalEntry)["_texts"]
_SENT: Any = vars(JournalEntry)["_sent"]
_RECEIVED: Any = vars(JournalEntry)["_received"]
_new = object.__new__
_set_sent = _SENT.__set__
_set_received = _RECEIVED.__set__


@dataclass
class EpisodeJournal:
    """Reset kwargs, then each step's action and answer, in order.

    Only what recovery needs: with ``keep_steps`` false (a client's journal under
    ``on_session_lost="raise"`` or ``"resume"``, which never replay) a step is
    counted in ``steps_applied`` and nothing of it is kept, so an episode's memory
    does not grow with its length; such a journal is never ``replayable``.

    Bounded: past ``max_steps`` entries the journal is marked ``truncated`` and can
    no longer be replayed (the episode is still usable; only ``replay`` recovery is
    lost).

    Steps of unknown outcome: a step whose deadline expired (or that was cancelled)
    after its frame may have reached the server is kept in ``unknown_steps``, after
    ``entries``, until the client learns what the server did: its late answer
    (matched by request id) moves it into ``entries``; an error answer, or the
    server's step count showing it was never applied, removes it. While any is
    left, the journal is not ``replayable``: a replay could silently diverge.

    Attributes:
        reset_kwargs: the kwargs of the reset that began the episode.
        reset_response: the ``data`` of the reset's observation frame.
        entries: the steps applied so far (none kept without ``keep_steps``).
        max_steps: the bound on ``entries``.
        truncated: whether steps were dropped because of the bound.
        episode_id: the episode id, when known.
        unknown_steps: action payloads (JSON text) of steps sent whose outcome the
            client does not know yet, in the order they were sent.
        steps_applied: steps the server applied since the reset, as far as the
            client knows (also those dropped past ``max_steps`` or not kept).
        keep_steps: whether each applied step's action and answer are kept in
            ``entries`` (what replay needs), or only counted.
    """

    reset_kwargs: dict[str, Any] = field(default_factory=dict)
    reset_response_json: str | None = None
    entries: list[JournalEntry] = field(default_factory=list)
    max_steps: int = 10_000
    truncated: bool = False
    episode_id: str | None = None
    unknown_steps: list[str] = field(default_factory=list)
    # The request id of each unknown step (None on the plain protocol), to match its
    # late answer.
    _unknown_ids: list[str | None] = field(default_factory=list, repr=False, compare=False)
    steps_applied: int = 0
    keep_steps: bool = True

    @property
    def reset_response(self) -> dict[str, Any] | None:
        """The ``data`` of the reset's observation frame (a fresh copy each time)."""
        if self.reset_response_json is None:
            return None
        data: dict[str, Any] = json.loads(self.reset_response_json)
        return data

    @property
    def step_count(self) -> int:
        """Steps recorded (not counting dropped ones); without ``keep_steps``, applied."""
        return len(self.entries) if self.keep_steps else self.steps_applied

    @property
    def replayable(self) -> bool:
        """Whether the whole episode is recorded, so replay can rebuild it."""
        return (self.keep_steps and self.reset_response_json is not None
                and not self.truncated and not self.unknown_steps)

    def __post_init__(self) -> None:
        self.max_steps = check_count(self.max_steps, "max_steps")

    def record_reset(self, kwargs: dict[str, Any], response: dict[str, Any] | str,
                     *, keep_steps: bool | None = None) -> None:
        """Start a new episode.

        Args:
            kwargs: the reset kwargs.
            response: the answer's ``data``, as a dict or as JSON text.
            keep_steps: whether this episode's steps are kept (default: as before).
        """
        if keep_steps is not None:
            self.keep_steps = keep_steps
        self.reset_kwargs = copy.deepcopy(kwargs)
        self.reset_response_json = encode_payload(response)
        self.entries = []
        self.truncated = False
        self.unknown_steps = []
        self._unknown_ids = []
        self.steps_applied = 0

    def record_unknown(self, action: dict[str, Any], request_id: str | None) -> None:
        """A step was sent but its outcome is unknown (deadline or cancellation).

        Args:
            action: the action payload sent.
            request_id: its request id, to recognise its late answer (``None``: none).
        """
        self.unknown_steps.append(encode_payload(action))
        self._unknown_ids.append(request_id)

    def carry_unknown(self, payloads: Iterable[str]) -> None:
        """Take the unknown steps of a copy of this journal kept in another process.

        The request ids do not travel with them: no late answer can be matched here,
        and the steps keep the journal from being replayable until a new reset.

        Args:
            payloads: the action payloads (JSON text), as in ``unknown_steps``.
        """
        self.unknown_steps = list(payloads)
        self._unknown_ids = [None] * len(self.unknown_steps)

    def settle(self, request_id: str, response: dict[str, Any] | str | None) -> bool:
        """The late answer of an unknown step arrived: record it or forget the step.

        Args:
            request_id: the answer's request id.
            response: the observation's ``data`` (the step was applied), or ``None``
                (the server answered with an error: it was not applied).

        Returns:
            whether ``request_id`` was one of the unknown steps.
        """
        try:
            index = self._unknown_ids.index(request_id)
        except ValueError:
            return False
        action = self.unknown_steps[index]
        # The server answers in order: earlier unknown steps without an answer by now
        # never got one (they cannot have been applied after this one).
        del self.unknown_steps[:index + 1]
        del self._unknown_ids[:index + 1]
        if response is not None:
            self.record_step(json.loads(action), response)
        return True

    def settle_count(self, applied: int) -> bool:
        """Settle the unknown steps from the server's count of steps in this episode.

        Args:
            applied: steps the server says it applied since the reset.

        Returns:
            ``True`` if no unknown step is left: the count showed that none of them
            was applied, so they are dropped. ``False`` if some were applied (their
            answers are lost, so the journal still cannot be replayed) or the count
            does not fit the journal.
        """
        if self.truncated or not self.unknown_steps:
            return not self.unknown_steps
        if applied == self.steps_applied:
            self.unknown_steps = []
            self._unknown_ids = []
            return True
        return False

    def record_step(self, action: dict[str, Any] | str,
                    response: dict[str, Any] | str | None) -> None:
        """Append one applied step (or mark the journal truncated past the bound).

        Args:
            action: the action payload sent.
            response: the answer's ``data``, as a dict or as JSON text; ``None`` when
                the step is known to be applied but its answer was lost.
        """
        self.steps_applied += 1
        if self.truncated or not self.keep_steps:
            return
        if len(self.entries) >= self.max_steps:
            self.truncated = True
            self.entries = []
            return
        self.entries.append(JournalEntry(
            encode_payload(action), None if response is None else encode_payload(response)))

    def record_frames(self, sent: str | bytes, received: str | bytes) -> None:
        """Append one applied step from its request and answer frames, as on the wire.

        What :meth:`record_step` does, without serialising anything: the entry keeps
        both frames and cuts the payloads out of them when they are first read.

        Args:
            sent: the step's request frame (its ``data`` is the action payload).
            received: the observation frame that answered it.
        """
        self.steps_applied += 1
        if self.truncated or not self.keep_steps:
            return
        entries = self.entries
        if len(entries) >= self.max_steps:
            self.truncated = True
            self.entries = []
            return
        # Built in place rather than by a constructor, as this runs on every step.
        entry = _new(JournalEntry)
        _set_sent(entry, sent)
        _set_received(entry, received)
        entries.append(entry)

    def settle_applied(self, count: int) -> int | None:
        """Settle the unknown steps from the session's ``step_count`` (steps since reset).

        The server applies a session's steps in order, so the first
        ``count - steps_applied`` unknown steps were applied (their answers are
        lost: recorded with no response) and the others never were (dropped).

        Returns:
            how many unknown steps were applied, or ``None`` if the count does not
            fit the journal (nothing is changed then).
        """
        applied = count - self.steps_applied
        if not 0 <= applied <= len(self.unknown_steps):
            return None
        pending = self.unknown_steps
        self.unknown_steps = []
        self._unknown_ids = []
        for action in pending[:applied]:
            self.record_step(action, None)
        return applied

    def snapshot(self) -> EpisodeJournal:
        """An independent copy (handed to the caller inside errors)."""
        # Entries are immutable (frozen, JSON text): sharing them is safe.
        return EpisodeJournal(
            reset_kwargs=copy.deepcopy(self.reset_kwargs),
            reset_response_json=self.reset_response_json,
            entries=list(self.entries),
            max_steps=self.max_steps,
            truncated=self.truncated,
            episode_id=self.episode_id,
            unknown_steps=list(self.unknown_steps),
            _unknown_ids=list(self._unknown_ids),
            steps_applied=self.steps_applied,
            keep_steps=self.keep_steps,
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable form, to persist or rebuild the episode elsewhere."""
        return {
            "episode_id": self.episode_id,
            "reset_kwargs": self.reset_kwargs,
            "reset_response": self.reset_response,
            "steps": [{"action": e.action, "response": e.response} for e in self.entries],
            "truncated": self.truncated,
            "unknown_steps": [json.loads(a) for a in self.unknown_steps],
            "steps_applied": self.steps_applied,
            "keep_steps": self.keep_steps,
        }
