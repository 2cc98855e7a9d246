"""Rollouts as a table: one row per episode (its parts joined) or per step.

A recording's observations, actions, reset kwargs and extra fields may have a
different shape on every line (a ``call_tool`` answer beside a ``list_tools`` one,
files written by different processes), which a loader that infers one schema from
the data cannot unify. Here they become JSON text columns, so every row has the same
columns of the same types, whatever the environment answered: the table loads with
``datasets``, ``pandas`` or ``pyarrow`` as it is. ``json.loads`` gives a value back.

Parquet needs ``pyarrow`` (``pip install 'envlink[dataset]'``); JSON lines need
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "EPISODE_COLUMNS",
    "FORMATS",
    "STEP_COLUMNS",
    "Per",
    "episode_row",
    "export",
    "format_of",
    "rows",
    "step_rows",
]

#: A row for each ``episode`` or each ``step``.
Per = Literal["episode", "step"]

#: The export formats, by the output file's suffix.
FORMATS: dict[str, str] = {".parquet": "parquet", ".jsonl": "jsonl", ".json": "jsonl"}

#: An episode row's columns and their types (``json``: JSON text of any value).
EPISODE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("episode_id", "string"), ("session_id", "string"), ("server", "string"),
    ("pid", "int"), ("start", "float"), ("end", "float"), ("outcome", "string"),
    ("return", "float"), ("steps", "int"), ("parts", "int"), ("redacted", "bool"),
    ("recovered_steps", "int"),
    ("reset_kwargs", "json"), ("reset_observation", "json"), ("reset_extra", "json"),
    ("actions", "json"), ("observations", "json"), ("rewards", "floats"),
    ("dones", "bools"), ("extras", "json"), ("unknown_steps", "json"), ("where", "string"),
)

#: A step row's columns and their types.
STEP_COLUMNS: tuple[tuple[str, str], ...] = (
    ("episode_id", "string"), ("session_id", "string"), ("pid", "int"),
    ("episode_start", "float"), ("outcome", "string"), ("index", "int"),
    ("action", "json"), ("observation", "json"), ("reward", "float"), ("done", "bool"),
    ("extra", "json"), ("start", "float"), ("latency", "float"), ("retries", "int"),
    ("recovered", "bool"), ("recovery", "string"), ("trace_id", "string"),
    ("span_id", "string"), ("where", "string"),
)

#: Rows written to a Parquet file at once.
_BATCH = 1024


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def episode_row(episode: Mapping[str, Any]) -> dict[str, Any]:
    """One episode (its parts joined) as a row of :data:`EPISODE_COLUMNS`."""
    steps = list(episode.get("steps") or ())
    reset = episode.get("reset") or {}
    return {
        "episode_id": episode.get("episode_id"),
        "session_id": episode.get("session_id"),
        "server": episode.get("server"),
        "pid": episode.get("pid"),
        "start": _float(episode.get("start")),
        "end": _float(episode.get("end")),
        "outcome": episode.get("outcome"),
        "return": _float(episode.get("return")),
        "steps": len(steps),
        "parts": int(episode.get("parts") or 1),
        "redacted": bool(episode.get("redacted")),
        "recovered_steps": sum(1 for s in steps if s.get("recovered")),
        "reset_kwargs": _json(reset.get("kwargs", {})),
        "reset_observation": _json(reset.get("observation")),
        "reset_extra": _json(reset.get("extra")),
        "actions": _json([s.get("action") for s in steps]),
        "observations": _json([s.get("observation") for s in steps]),
        "rewards": [_float(s.get("reward")) for s in steps],
        "dones": [bool(s.get("done")) for s in steps],
        "extras": _json([s.get("extra") for s in steps]),
        "unknown_steps": _json(list(episode.get("unknown_steps") or ())),
        "where": episode.get("where"),
    }


def step_rows(episode: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Each applied step of an episode as a row of :data:`STEP_COLUMNS`."""
    for step in episode.get("steps") or ():
        yield {
            "episode_id": episode.get("episode_id"),
            "session_id": episode.get("session_id"),
            "pid": episode.get("pid"),
            "episode_start": _float(episode.get("start")),
            "outcome": episode.get("outcome"),
            "index": step.get("index"),
            "action": _json(step.get("action")),
            "observation": _json(step.get("observation")),
            "reward": _float(step.get("reward")),
            "done": bool(step.get("done")),
            "extra": _json(step.get("extra")),
            "start": _float(step.get("start")),
            "latency": _float(step.get("latency")),
            "retries": int(step.get("retries") or 0),
            "recovered": bool(step.get("recovered")),
            "recovery": step.get("recovery"),
            "trace_id": step.get("trace_id"),
            "span_id": step.get("span_id"),
            "where": episode.get("where"),
        }


def rows(episodes: Iterable[Mapping[str, Any]], per: Per = "episode"
         ) -> Iterator[dict[str, Any]]:
    """The rows of ``episodes``: one per episode, or one per step."""
    for episode in episodes:
        if per == "episode":
            yield episode_row(episode)
        else:
            yield from step_rows(episode)


def format_of(path: str | Path) -> str:
    """The format an output path's suffix names (``parquet`` or ``jsonl``).

    Raises:
        ValueError: another suffix.
    """
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"--export writes {', '.join(FORMATS)} files; got {str(path)!r}")
    return FORMATS[suffix]


def _arrow_schema(columns: tuple[tuple[str, str], ...]) -> Any:
    import pyarrow as pa

    types = {"string": pa.string(), "json": pa.string(), "int": pa.int64(),
             "float": pa.float64(), "bool": pa.bool_(), "floats": pa.list_(pa.float64()),
             "bools": pa.list_(pa.bool_())}
    return pa.schema([(name, types[kind]) for name, kind in columns])


def export(episodes: Iterable[Mapping[str, Any]], path: str | Path,
           per: Per = "episode") -> int:
    """Write the rows of ``episodes`` to ``path`` (Parquet or JSON lines, by its
    suffix); the number of rows written.

    Raises:
        ValueError: the suffix names no format.
        ImportError: Parquet without ``pyarrow``.
        OSError: the file cannot be written.
    """
    kind = format_of(path)
    out = Path(path)
    count = 0
    if kind == "jsonl":
        with out.open("w", encoding="utf-8") as stream:
            for row in rows(episodes, per):
                stream.write(_json(row) + "\n")
                count += 1
        return count
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ImportError("--export to Parquet needs pyarrow: pip install "
                          "'envlink[dataset]' (or export to a .jsonl file)") from exc
    schema = _arrow_schema(EPISODE_COLUMNS if per == "episode" else STEP_COLUMNS)
    with pq.ParquetWriter(str(out), schema) as writer:
        batch: list[dict[str, Any]] = []
        for row in rows(episodes, per):
            batch.append(row)
            if len(batch) >= _BATCH:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
                batch = []
        if batch or not count:
            writer.write_table(pa.Table.from_pylist(batch, schema=schema))
            count += len(batch)
    return count
