"""`diff` memory: peak RSS of `anatomy diff A B PROMPT` against one model's `anatomy next PROMPT`, and of the
weights comparison.

The activations mode runs A, keeps its activations, frees it, then loads B: its peak should be one model's
(the larger), not two. Each command runs in its own process; the peak is that child's ``ru_maxrss``
(``os.wait4``), as ``/usr/bin/time -v`` reports it.

    python benchmarks/bench_diff.py A.gguf B.gguf ["The capital of Germany is"]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time


def peak(args: list[str]) -> tuple[float, float]:
    """(peak RSS in MiB, wall seconds) of ``anatomy ARGS`` in a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "anatomy_cli", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"anatomy {' '.join(args)} failed ({status})")
    return usage.ru_maxrss / 1024, time.perf_counter() - start


def main() -> None:
    a, b = sys.argv[1], sys.argv[2]
    prompt = sys.argv[3] if len(sys.argv) > 3 else "The capital of Germany is"
    one, t_one = peak(["next", prompt, "-m", a, "--device", "cpu", "--format", "json"])
    act, t_act = peak(["diff", a, b, prompt, "--device", "cpu", "--format", "json"])
    wts, t_wts = peak(["diff", a, b, "--format", "json"])
    print(f"next (one model):     peak {one:8.0f} MiB  {t_one:6.1f} s")
    print(f"diff on a prompt:     peak {act:8.0f} MiB  {t_act:6.1f} s  ratio to one model {act / one:.2f}")
    print(f"diff on the weights:  peak {wts:8.0f} MiB  {t_wts:6.1f} s  ratio to one model {wts / one:.2f}")


if __name__ == "__main__":
    main()
