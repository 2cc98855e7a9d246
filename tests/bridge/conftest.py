"""Fixtures for the sync-bridge tests: bridges that are always closed."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from envlink._bridge import Bridge


def envlink_threads() -> set[threading.Thread]:
    """Live threads started by envlink."""
    return {t for t in threading.enumerate() if t.name.startswith("envlink")}


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    try:
        yield b
    finally:
        b.close()
