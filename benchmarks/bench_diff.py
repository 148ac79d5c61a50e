"""`diff` memory: peak RSS of `anatomy diff A B PROMPT` against one model's `anatomy next PROMPT`, as a ratio, and
of the weights comparison.

The activations mode runs A, keeps what the comparison needs (the residual stream and the lens at the position),
frees A and hands its pages back to the system, then loads B: its peak should be one model's (the larger), not
two. Each command runs in its own process; the peak is that child's ``ru_maxrss`` (``os.wait4``), as
``/usr/bin/time -v`` reports it. The ratio's reference is ``next`` on each of A and B (the larger peak of the
two). The load average (``os.getloadavg``) is printed before and after: on a shared machine the wall times
mean little, the peaks are steadier.

    python benchmarks/bench_diff.py A B ["The capital of Germany is"] [--skip-weights] [--json FILE]

e.g. ``A = SmolLM2-135M-Instruct.Q4_1.gguf``, ``B = a directory of its weights saved by save_pretrained``.
"""

from __future__ import annotations

import argparse
import json
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


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("prompt", nargs="?", default="The capital of Germany is")
    parser.add_argument("--skip-weights", action="store_true", help="leave out the weights comparison")
    parser.add_argument("--json", metavar="FILE", help="also write the figures to FILE")
    args = parser.parse_args()
    print(f"load average before (1, 5, 15 min): {load()}  ({os.cpu_count()} cores)")
    rows: dict[str, dict[str, float]] = {}
    for name, path in (("next A", args.a), ("next B", args.b)):
        mib, wall = peak(["next", args.prompt, "-m", path, "--device", "cpu", "--format", "json"])
        rows[name] = {"peak_mib": mib, "wall_s": wall}
    one = max(rows["next A"]["peak_mib"], rows["next B"]["peak_mib"])
    runs = [("diff on a prompt", ["diff", args.a, args.b, args.prompt, "--device", "cpu", "--format", "json"])]
    if not args.skip_weights:
        runs.append(("diff on the weights", ["diff", args.a, args.b, "--format", "json"]))
    for name, argv in runs:
        mib, wall = peak(argv)
        rows[name] = {"peak_mib": mib, "wall_s": wall}
    for name, row in rows.items():
        row["ratio_to_one_model"] = row["peak_mib"] / one
        print(f"{name + ':':22s} peak {row['peak_mib']:6.0f} MiB  {row['wall_s']:6.1f} s  "
              f"ratio to one model's next {row['ratio_to_one_model']:.2f}")
    after = load()
    print(f"load average after (1, 5, 15 min): {after}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"a": args.a, "b": args.b, "prompt": args.prompt, "rows": rows, "load_after": after,
                       "cores": os.cpu_count()}, f, indent=2)


if __name__ == "__main__":
    main()
