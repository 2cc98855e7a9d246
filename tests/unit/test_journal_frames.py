"""Journal entries kept as the frames sent and received, read lazily."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import pickle
import threading
import tracemalloc
from typing import Any

import pytest

from envlink import EpisodeJournal, GenericEnvClient, JournalEntry, MockTransport

pytestmark = pytest.mark.timeout(30)

ACTION = {"tool": "echo", "args": {"text": "h\u00e9", "n": [1, 2.5, None, True]}}
DATA = {"observation": {"echo": "h\u00e9", "nested": {"x": [1, {"y": None}]}},
        "reward": 1.5, "done": False, "metadata": {"extra": 1}}


def _frames(request_id: str | None = "p-1") -> tuple[str, str]:
    envelope: dict[str, Any] = {"type": "step", "data": ACTION}
    answer: dict[str, Any] = {"type": "observation", "data": DATA}
    if request_id is not None:
        envelope.update(id=request_id, traceparent="00-" + "1" * 32 + "-" + "2" * 16 + "-01")
        answer["id"] = request_id
    return json.dumps(envelope), json.dumps(answer)


@pytest.mark.parametrize("binary", [False, True])
def test_entry_from_frames_equals_the_serialised_one(binary: bool) -> None:
    """An entry kept as frames reads exactly as one built by serialising action and answer."""
    sent, received = _frames()
    lazy, eager = EpisodeJournal(), EpisodeJournal()
    lazy.record_frames(sent, received.encode() if binary else received)
    eager.record_step(ACTION, DATA)
    assert lazy.entries == eager.entries
    (entry,) = lazy.entries
    assert entry.action == ACTION and entry.response == DATA
    assert (entry.action_json, entry.response_json) == (eager.entries[0].action_json,
                                                        eager.entries[0].response_json)
    assert hash(entry) == hash(eager.entries[0])
    assert repr(entry) == repr(eager.entries[0])
    assert lazy.steps_applied == 1


def test_entry_from_frames_keeps_the_dataclass_protocol() -> None:
    """Fields, asdict, pickling and immutability are those of a frozen dataclass."""
    sent, received = _frames(None)
    journal = EpisodeJournal()
    journal.record_frames(sent, received)
    entry = journal.entries[0]
    assert [f.name for f in dataclasses.fields(JournalEntry)] == ["action_json", "response_json"]
    assert dataclasses.asdict(pickle.loads(pickle.dumps(entry))) == {
        "action_json": json.dumps(ACTION, separators=(",", ":"), ensure_ascii=False),
        "response_json": json.dumps(DATA, separators=(",", ":"), ensure_ascii=False)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.action_json = "{}"  # type: ignore[misc]
    with pytest.raises(TypeError):
        JournalEntry()  # type: ignore[call-arg]
    assert JournalEntry('{"a":1}', None).response is None


def test_entry_from_frames_read_by_many_threads_gives_one_value() -> None:
    """Threads reading a fresh entry at once all get the same text (no lost extraction)."""
    sent, received = _frames()
    for _ in range(50):
        journal = EpisodeJournal()
        journal.record_frames(sent, received)
        entry = journal.entries[0]
        seen: list[tuple[str, str | None]] = []
        barrier = threading.Barrier(4)

        def read(entry: JournalEntry, barrier: threading.Barrier,
                 seen: list[tuple[str, str | None]]) -> None:
            barrier.wait()
            seen.append((entry.action_json, entry.response_json))

        threads = [threading.Thread(target=read, args=(entry, barrier, seen))
                   for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1 and len(seen) == 4


def test_record_frames_respects_the_bound() -> None:
    """Past max_steps the journal is truncated, as with record_step."""
    sent, received = _frames()
    journal = EpisodeJournal(max_steps=2)
    journal.record_reset({}, {"observation": {}})
    for _ in range(3):
        journal.record_frames(sent, received)
    assert journal.truncated and not journal.replayable and journal.steps_applied == 3


@pytest.mark.parametrize("extensions", [True, False])
def test_client_journal_holds_what_was_sent_and_is_immune_to_the_caller(
        extensions: bool) -> None:
    """A step's entry is the payload sent and the data answered, serialised only when
    read; mutating the action or the returned observation afterwards changes neither."""

    def handler(request: dict[str, Any]) -> dict[str, Any] | None:
        if request["type"] == "close":
            return None
        return {"type": "observation", "data": {**DATA, "observation": {"got": request.get(
            "data", {})}}}

    async def main() -> None:
        client = GenericEnvClient("http://env.test", on_session_lost="replay",
                                  transport=MockTransport(handler, extensions=extensions))
        await client.reset()
        action = json.loads(json.dumps(ACTION))
        result = await client.step(action)
        action["args"]["n"].append("later")
        result.observation["got"]["tool"] = "changed"
        entry = client.journal.entries[0]
        assert "action_json" not in vars(entry)  # nothing serialised at step time
        assert entry.action == ACTION
        assert entry.response == {**DATA, "observation": {"got": ACTION}}
        await client.close()

    asyncio.run(main())


def test_a_journal_without_keep_steps_counts_steps_and_keeps_none() -> None:
    """keep_steps=False: each step is counted, none is kept, and the journal is never
    replayable; its unknown steps still settle from a step count."""
    journal = EpisodeJournal(keep_steps=False)
    journal.record_reset({"seed": 1}, {"observation": {}})
    sent, received = _frames()
    for _ in range(1000):
        journal.record_frames(sent, received)
    journal.record_step({"a": 1}, {"observation": {}})
    assert (journal.entries, journal.steps_applied, journal.step_count) == ([], 1001, 1001)
    assert not journal.replayable and not journal.truncated
    journal.record_unknown({"a": 2}, "r-1")
    assert journal.settle_count(1001) and journal.unknown_steps == []
    copy = journal.snapshot()
    assert not copy.keep_steps and copy.steps_applied == 1001


@pytest.mark.parametrize(("policy", "kept"), [("raise", False), ("resume", False),
                                              ("replay", True), ("auto", True)])
def test_a_client_journal_keeps_steps_only_where_its_policy_replays(policy: str,
                                                                     kept: bool) -> None:
    """Steps are kept under replay and auto only; record_steps overrides from the next reset."""

    def handler(request: dict[str, Any]) -> dict[str, Any] | None:
        if request["type"] == "close":
            return None
        return {"type": "observation", "data": DATA}

    async def main() -> None:
        client = GenericEnvClient("http://env.test", on_session_lost=policy,  # type: ignore[arg-type]
                                  transport=MockTransport(handler))
        assert client.record_steps is kept
        await client.reset()
        await client.step(ACTION)
        assert (len(client.journal.entries), client.journal.steps_applied) == (int(kept), 1)
        client.record_steps = not kept
        await client.step(ACTION)  # the change applies from the next reset
        assert len(client.journal.entries) == 2 * int(kept)
        await client.reset()
        await client.step(ACTION)
        assert len(client.journal.entries) == int(not kept)
        with pytest.raises(TypeError, match="record_steps"):
            client.record_steps = 1  # type: ignore[assignment]
        await client.close()

    asyncio.run(main())


def test_a_kept_step_costs_one_small_object_beside_its_frames() -> None:
    """An entry recorded from frames is one slotted object (no instance dictionary):
    under 100 bytes per step beside the frames (the list's slot included), not 250."""
    sent, received = _frames()
    journal = EpisodeJournal(max_steps=5_000)
    journal.record_reset({}, {"observation": {}})
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for _ in range(2_000):
            journal.record_frames(sent, received)
        per_step = (tracemalloc.get_traced_memory()[0] - before) / 2_000
    finally:
        tracemalloc.stop()
    assert per_step < 100, per_step
    assert vars(journal.entries[0]) == {}  # nothing serialised at step time


def test_an_entry_read_then_copied_keeps_its_texts() -> None:
    """A read entry holds the texts: pickling and copying carry them, equal to the original."""
    sent, received = _frames()
    journal = EpisodeJournal()
    journal.record_frames(sent, received)
    entry = journal.entries[0]
    assert entry.action == ACTION
    assert set(vars(entry)) == {"action_json", "response_json"}
    for other in (pickle.loads(pickle.dumps(entry)), copy.copy(entry), copy.deepcopy(entry)):
        assert other == entry and vars(other) == vars(entry)
