"""How many threads torch's CPU ops use: one on a machine that is already busy (:func:`machine_threads`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def machine_threads() -> Iterator[int]:
    """torch's intra-op threads for a long CPU loop (a fit, a generation, a graph's backward passes), set for the
    block and restored after: one where the machine is already busy (its 1-minute load average at or over its
    CPUs), else torch's own count. Every op of such a loop (thousands per training step, small ones) is an OpenMP
    region whose threads wait for each other at its end: on a busy machine one of them is often not scheduled,
    and each op waits a time slice (measured on 2 shared cores at load 5-7: a cross-layer transcoder step of
    SmolLM2, 30 blocks x 1,024 features, 30-58 s with 2 threads, 6-8 s with 1). Yields the count used."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    before = torch.get_num_threads()
    threads = 1 if os.getloadavg()[0] >= cores else before
    torch.set_num_threads(threads)
    try:
        yield threads
    finally:
        torch.set_num_threads(before)
