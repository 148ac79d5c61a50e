"""glibc's malloc told to keep the memory a training step frees for the next step (issue 62 item 2).

A fit's step allocates and frees the same few tensors every step (the ``[rows, d_sae]`` pre-activations, two
``[d_sae, d]`` gradients, the backward's temporaries: about 20 MB for a TopK transcoder of SmolLM2's width). glibc
serves blocks that large with ``mmap`` or trims them off the heap's top when they are freed, so the next step gets
fresh pages from the kernel: about 4,900 page faults a step there, each a kernel entry and a page zeroed, which
took 15 of the step's 52 CPU ms (measured: 0.15 faults a step with the heap kept). :func:`kept_pages` sets the two
thresholds for the block (blocks up to 32 MiB from the heap, the heap's top never trimmed) and, after it, returns
the heap's free memory to the system (``malloc_trim``) and leaves the thresholds where glibc's own sliding ones
end at most (32 MiB; the top trimmed past 64 MiB): setting them turns the sliding off for the process, and its
128 KiB start would map every later large tensor afresh. Elsewhere (no glibc: macOS, musl) it does nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
_LARGEST_HEAP_BLOCK = 32 * 1024 * 1024  # the most mallopt accepts for M_MMAP_THRESHOLD on 64-bit glibc
_NEVER = 2**31 - 1  # mallopt takes an int
_depth = [0]  # kept_pages blocks open now (the outermost one sets and restores)


def _glibc() -> Any:
    """The process's C library where it is glibc with ``mallopt`` and ``malloc_trim``, else None."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        libc = ctypes.CDLL(None)
    except (ValueError, OSError, AttributeError):
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


@contextmanager
def kept_pages() -> Iterator[None]:
    """During the block, blocks of up to 32 MiB come from glibc's heap and its top is never trimmed, so that
    memory freed by one training step serves the next without page faults; after it, the heap's free memory is
    returned and the top trimmed past 64 MiB (see the module docstring)."""
    libc = None if _depth[0] else _glibc()
    if libc is not None:
        libc.mallopt(_M_MMAP_THRESHOLD, _LARGEST_HEAP_BLOCK)
        libc.mallopt(_M_TRIM_THRESHOLD, _NEVER)
    _depth[0] += 1
    try:
        yield
    finally:
        _depth[0] -= 1
        if libc is not None:
            libc.mallopt(_M_TRIM_THRESHOLD, 2 * _LARGEST_HEAP_BLOCK)
            libc.malloc_trim(0)
