"""Fixtures: no backoff waits (the servers come from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from envlink import set_testing


@pytest.fixture(autouse=True)
def _no_backoff_waits() -> Iterator[None]:
    with set_testing():
        yield
