"""Shared test configuration."""

from __future__ import annotations

import os

# tests/interop needs the real openenv package in its own virtualenv; .ci/interop.sh
# creates it and sets ENVLINK_OPENENV_PYTHON. Without it, the default run leaves
# the interop suite out (it is run, never skipped, by .ci/interop.sh).
collect_ignore_glob = [] if os.environ.get("ENVLINK_OPENENV_PYTHON") else ["interop/*"]
