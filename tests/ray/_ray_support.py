"""Whether the envlink.ray tests can run here; imported first by each of them."""

from __future__ import annotations

import importlib.util
import os

import pytest

__all__ = ["require_ray"]


def require_ray() -> None:
    """Skip the calling module when Ray is missing; fail under ``ENVLINK_REQUIRE_RAY=1``."""
    spec = importlib.util.find_spec("ray")
    # tests/ray itself would be found as a namespace package "ray" (it has no origin).
    if spec is not None and spec.origin is not None:
        return
    reason = ("Ray is not installed (pip install 'envlink[ray]', or the dev extra); the "
              "envlink.ray tests need it")
    if os.environ.get("ENVLINK_REQUIRE_RAY") == "1":
        pytest.fail(f"ENVLINK_REQUIRE_RAY=1: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
