"""Fixtures: no backoff waits; a rollout directory and a checker of its records."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envlink import set_testing

SCHEMA = json.loads((Path(__file__).resolve().parents[2] / "docs" / "rollout.schema.json")
                    .read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Iterator[None]:
    with set_testing():
        yield


@pytest.fixture(autouse=True)
def _structlog_as_a_new_process_has_it() -> Iterator[None]:
    """structlog unconfigured, as in a new ``envlink`` process: envlink then logs to stderr.

    An earlier test's ``capture_logs()`` leaves structlog "configured" with its default
    console renderer on stdout, which would mix log lines into a command's ``--json``.
    """
    import structlog

    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def load(directory: Path) -> list[dict[str, Any]]:
    """Every record in ``directory``, each checked against docs/rollout.schema.json."""
    import jsonschema

    records = []
    for file in sorted(directory.glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            jsonschema.validate(record, SCHEMA)
            records.append(record)
    return records
