"""Helpers for the tests of dashboards/ and deploy/: tools that may be missing locally.

promtool and prometheus come from the Debian package ``prometheus``. Without them the
tests that need them skip, saying why; CI installs the package and sets
``ENVLINK_REQUIRE_PROMETHEUS=1``, which turns that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
PROMETHEUS_DIR = ROOT / "deploy" / "prometheus"
RULES = PROMETHEUS_DIR / "rules" / "envlink.rules.yml"
WORKLOAD = ROOT / "deploy" / "workload" / "workload.py"


def require_tool(name: str) -> str:
    """The path of ``name``; skip (or fail, when CI requires it) if it is not installed."""
    path = shutil.which(name)
    if path is None:
        message = (f"{name} is not installed (Debian package 'prometheus': "
                   "apt-get install prometheus)")
        if os.environ.get("ENVLINK_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"ENVLINK_REQUIRE_PROMETHEUS=1 but {message}")
        pytest.skip(message)
    return path
