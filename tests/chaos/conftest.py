"""Configuration of the chaos suite: bounded by default, soak with ``--soak``.

- bounded (every ``pytest`` run): a fixed seed, every face x policy x protocol, every
  fault kind, in well under a minute or two on two cores;
- soak (``pytest tests/chaos --soak`` or ``ENVLINK_CHAOS_SOAK=1``): at least 1,000
  episodes and 500 injected faults of every kind, over worker processes
  (``ENVLINK_CHAOS_WORKERS``, default 3).

``--chaos-seed`` / ``ENVLINK_CHAOS_SEED`` changes the seed; ``--chaos-report`` /
``ENVLINK_CHAOS_REPORT`` says where the JSON report goes (default: the test's temporary
directory under pytest's, which pytest cleans; printed in the summary).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

BOUNDED_SEED = 9


@pytest.fixture
def chaos_seed(request: pytest.FixtureRequest) -> int:
    """The seed of this chaos run."""
    seed = request.config.getoption("--chaos-seed")
    if seed is None:
        seed = int(os.environ.get("ENVLINK_CHAOS_SEED", BOUNDED_SEED))
    return int(seed)


@pytest.fixture
def chaos_report(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], Path]:
    """The report path asked for (a label is appended for each run), else one in the
    test's own temporary directory (pytest's, which pytest cleans): the suite never
    writes outside it."""
    base = request.config.getoption("--chaos-report") or os.environ.get("ENVLINK_CHAOS_REPORT")

    def path(label: str) -> Path:
        if not base:
            return tmp_path / f"chaos-{label}.json"
        target = Path(base)
        return target.with_name(f"{target.stem}-{label}{target.suffix or '.json'}")

    return path


@pytest.fixture
def chaos_summary(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Hand a summary table to the terminal summary (printed even when captured)."""
    def add(text: str) -> None:
        config = request.config
        summaries: list[str] = getattr(config, "envlink_chaos_summaries", [])
        summaries.append(text)
        config.envlink_chaos_summaries = summaries  # type: ignore[attr-defined]
        print(text)

    return add
