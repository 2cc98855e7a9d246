"""Whether an optional framework is installed here; imported first by the tests that need it."""

from __future__ import annotations

import importlib.util
import os

import pytest

__all__ = ["require"]


def require(module: str, variable: str, hint: str) -> None:
    """Skip the calling module when ``module`` is missing; fail when ``variable`` is ``1``.

    Args:
        module: the import name of the framework.
        variable: the ``ENVLINK_REQUIRE_*`` variable that makes a skip a failure.
        hint: how to install it, for the skip reason.
    """
    if importlib.util.find_spec(module) is not None:
        return
    reason = f"{module} is not installed ({hint})"
    if os.environ.get(variable) == "1":
        pytest.fail(f"{variable}=1: {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)
