"""Shared test configuration."""

from __future__ import annotations

import os
from typing import Any

import pytest

# tests/interop needs the real openenv package in its own virtualenv; .ci/interop.sh
# creates it and sets ENVLINK_OPENENV_PYTHON. Without it, the default run leaves
# the interop suite out (it is run, never skipped, by .ci/interop.sh).
collect_ignore_glob = [] if os.environ.get("ENVLINK_OPENENV_PYTHON") else ["interop/*"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("envlink chaos")
    group.addoption("--soak", action="store_true", default=False,
                    help="run the chaos suite in soak mode (>= 1,000 episodes, >= 500 "
                         "injected faults of every kind; also ENVLINK_CHAOS_SOAK=1)")
    group.addoption("--chaos-report", default=None, metavar="PATH",
                    help="where the chaos suite writes its JSON report (also "
                         "ENVLINK_CHAOS_REPORT; default: a temporary directory)")
    group.addoption("--chaos-seed", default=None, type=int, metavar="N",
                    help="seed of the chaos suite (also ENVLINK_CHAOS_SEED)")


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    # The chaos suite's summary tables (tests/chaos), printed even when output is captured.
    for text in getattr(config, "envlink_chaos_summaries", []):
        terminalreporter.write_sep("=", "envlink chaos")
        terminalreporter.write_line(text)
