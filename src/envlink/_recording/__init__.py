"""Rollouts on disk: every episode a client runs, one JSON object per line.

A recorder is given to a client, which records into it; a background thread per process
writes finished episodes as lines. Imported only where a recorder is used: ``import
envlink`` does not load it. Which module owns which rule is in ``docs/architecture.md``
("Rollouts on disk").
"""

from __future__ import annotations

__all__: list[str] = []
