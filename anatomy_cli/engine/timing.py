"""The rate a device runs float32 matrix products at, measured now: what the fit commands' cost lines turn FLOPs
into seconds with (``fit-sae``, ``fit-lens jacobian``)."""

from __future__ import annotations

import statistics
import time

import torch


def product_rate(rows: int, d_in: int, d_out: int, device: str | torch.device = "cpu", *, repeats: int = 3,
                 typical: bool = False) -> float:
    """FLOP/s of a ``[rows, d_in] @ [d_in, d_out]`` float32 product on ``device``, timed ``repeats`` times: the
    best (``typical`` False), or after a warm-up the median (``typical`` True: a machine other jobs share is
    measured as a long run will meet it). A generator of its own: the global RNG, which the caller owns, is left
    alone."""
    g = torch.Generator(device).manual_seed(0)
    a = torch.randn(rows, d_in, device=device, generator=g)
    b = torch.randn(d_in, d_out, device=device, generator=g)
    if typical:
        (a @ b).sum().item()  # warm-up
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        (a @ b).sum().item()
        times.append(time.perf_counter() - t)
    took = statistics.median(times) if typical else min(times)
    return 2.0 * rows * d_in * d_out / max(took, 1e-9)
