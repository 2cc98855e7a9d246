"""Fixtures for the sync-bridge tests: bridges that are always closed."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from envlink import Bridge
from envlink._sync.default_bridge import DEFAULT_BRIDGE_NAME


def envlink_threads() -> set[threading.Thread]:
    """Live threads started by envlink, except the process-wide default bridge's (which
    serves every facade open on it, of this test or not)."""
    return {t for t in threading.enumerate()
            if t.name.startswith("envlink") and not t.name.startswith(DEFAULT_BRIDGE_NAME)}


@pytest.fixture
def bridge() -> Iterator[Bridge]:
    b = Bridge()
    try:
        yield b
    finally:
        b.close()


class SpyBridge(Bridge):
    """Records the timeout the facade asks the bridge to wait for."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[tuple[str | None, float | None]] = []

    def _call_packed(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     timeout: float | None, method: str | None) -> Any:
        # Every bridged call, Bridge.call's and the facades' alike, goes through here.
        self.waits.append((method, timeout))
        return super()._call_packed(fn, args, kwargs, timeout, method)
