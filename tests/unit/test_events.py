"""The client's EVENTS table matches what the library emits, name by name, field by field."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from envlink import names
from envlink._events.client_events import EVENTS

pytestmark = pytest.mark.timeout(30)

SRC = Path(__file__).resolve().parents[2] / "src" / "envlink"


def emitted() -> dict[str, set[str]]:
    """Every ``ClientEvent(NAME, session, {fields})`` built in the library."""
    found: dict[str, set[str]] = {}
    for path in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id == "ClientEvent"):
                continue
            name, fields = node.args[0], node.args[2]
            assert isinstance(name, ast.Name), (path, ast.unparse(node))
            assert isinstance(fields, ast.Dict), (path, ast.unparse(node))
            keys = {k.value for k in fields.keys if isinstance(k, ast.Constant)}
            assert len(keys) == len(fields.keys), (path, ast.unparse(node))
            found.setdefault(getattr(names, name.id), set()).update(keys)
    return found


def test_every_emitted_event_is_listed_with_its_fields() -> None:
    """Each event the client emits is in EVENTS, with exactly the fields it is sent with."""
    sent = emitted()
    assert sent
    assert set(sent) == set(EVENTS)
    assert {name: set(fields) for name, fields in EVENTS.items()} == sent
