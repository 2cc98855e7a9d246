"""What both fuzz targets share: run the seeds, seed an empty corpus, hand over to atheris."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Callable, Sequence

import atheris

__all__ = ["fuzz"]


def fuzz(test_one: Callable[[bytes], None], seeds: Sequence[bytes]) -> None:
    """Fuzz ``test_one`` from ``seeds``, written into the corpus directory given (if empty)."""
    for seed in seeds:
        test_one(seed)
    for arg in sys.argv[1:]:
        corpus = pathlib.Path(arg)
        if not arg.startswith("-") and corpus.is_dir() and not any(corpus.iterdir()):
            for i, seed in enumerate(seeds):
                (corpus / f"seed-{i}").write_bytes(seed)
    atheris.Setup(sys.argv, test_one)
    atheris.Fuzz()
