"""``python -m envlink.server``: same as ``envlink serve``."""

from __future__ import annotations

from envlink.server._command import main

raise SystemExit(main())
