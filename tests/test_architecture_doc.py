"""docs/architecture.md names real modules, and every client module has its place in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "envlink"
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
NAMED = set(re.findall(r"`((?:_bridge/|server/)?_?[a-z_]+\.py)`", DOC))
#: The bridge and server modules (split on their seams by the other half of issue 10).
SPLIT = {n for n in NAMED if n.startswith(("_bridge/",
         "server/")) or n == "_telemetry/bridge_hook.py"}


def test_every_client_and_telemetry_module_the_doc_names_exists() -> None:
    """Each `module.py` the doc names outside the bridge and server is a file in src/envlink."""
    missing = sorted(n for n in NAMED - SPLIT if not (SRC / n).exists())
    assert NAMED - SPLIT and missing == []


def test_every_bridge_and_server_module_the_doc_names_exists() -> None:
    """Each bridge and server module the doc names is a file in src/envlink."""
    missing = sorted(n for n in SPLIT if not (SRC / n).exists())
    assert SPLIT and missing == []


def test_every_client_and_telemetry_module_owns_something() -> None:
    """No module of the client or its telemetry is left out of the tables."""
    owners = set(re.findall(r"^\| [^|]+ \| `([^`]+\.py)`", DOC, re.M))
    for name in ["_sansio/session.py", "_sansio/retry.py", "_client/recovery.py",
                 "_client/connector.py", "_client/driver.py", "_client/client.py",
                 "_transports/base.py", "_deadlines.py", "_config.py", "_sansio/protocol.py",
                 "_sansio/journal.py", "_errors.py", "_client/events.py",
                 "_telemetry/client_hook.py", "names.py", "_telemetry/instruments.py",
                 "_telemetry/logs.py", "telemetry.py", "_client/sync_client.py"]:
        assert name in owners, name
