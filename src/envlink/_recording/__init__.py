"""Rollouts on disk: every episode a client runs, one JSON object per line.

:mod:`envlink._recording.recorder` is what a client is given (``RolloutRecorder``) and
what each client records into (a tape per session); :mod:`envlink._recording.writer`
turns finished episodes into lines on a background thread, one per process;
:mod:`envlink._recording.rollouts` is the format (its schema version, reading files
back, the summary). Imported only where a recorder is used: ``import envlink`` does
not load it.
"""

from __future__ import annotations

__all__: list[str] = []
