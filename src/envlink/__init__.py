"""envlink: a hardened, traced client SDK for OpenEnv-compatible environment servers."""

from __future__ import annotations

__version__ = "0.1.0.dev0"
