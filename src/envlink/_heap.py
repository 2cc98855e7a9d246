"""Per-process allocator warm-up for asyncio's socket read buffers (client and server).

asyncio's socket transport reads with ``sock.recv(256 KiB)`` for every frame. Above
glibc's malloc mmap threshold (128 KiB until the process frees a larger block) each
such buffer is a fresh mmap, shrunk with mremap and unmapped. That is three system
calls and a page fault per message received; docs/performance.md ("read buffers from
the heap") has the cost. glibc raises the threshold
to the size of the first mmapped block a program frees; heavy programs do that by
accident at import time, a lean process never does. Freeing one block larger than
the read buffer once makes every later read buffer come from the heap. Harmless where
the allocator works otherwise; costs one allocation per process.
"""

from __future__ import annotations

__all__ = ["warm_read_buffers"]

_READ_BUFFER_WARMUP = 384 * 1024
_warmed = False


def warm_read_buffers() -> None:
    """Allocate and free one block larger than asyncio's read buffer, once per process."""
    global _warmed
    if not _warmed:
        _warmed = True
        block = bytes(_READ_BUFFER_WARMUP)  # allocated, then freed at once
        del block
