"""Section 2 of `anatomy verify`: identities that hold exactly, up to float rounding.

* the residual decomposition ``resid_post = resid_pre + attn_out + mlp_out`` per block (the same sum for a
  parallel block, whose attention and MLP both read resid_pre), and ``resid_mid = resid_pre + attn_out`` where
  the block has a resid_mid; post-LN blocks (BERT, RoBERTa, OPT-350m) renormalize after each add: skipped;
* the logit lens at the last layer (``engine.unembed`` of ``blocks.{L-1}.hook_resid_post``) equals the model's
  own logits;
* a Jacobian lens of identities and a tuned lens of zero translators read exactly the logit lens
  (:mod:`anatomy_cli.analyses.verify.fitted`);
* the direct logit attribution rows (``analyses.dla.logit_attribution``, by head) add up to the logit
  difference of the top two tokens;
* patching a run into itself changes nothing (``engine.patch_grid`` with clean = corrupt);
* in a mixture-of-experts block, ``mlp_out`` = the chosen experts' outputs weighted as the router weights them,
  plus the gated shared expert (Qwen2-MoE) (:func:`anatomy_cli.engine.experts.rebuild`);
* the prompts in one padded batch equal the prompts run one by one, at every hook point;
* attribution patching equals exact patching on a metric linear in the patched site: the final norm's output
  (``ln_final.hook_normalized``; without a final norm the last block's output) of CORRUPT replaced by CLEAN's,
  metric the logit difference, which the (linear) LM head makes an affine function of that site.
"""

from __future__ import annotations

import torch

from anatomy_cli.analyses.dla import logit_attribution
from anatomy_cli.analyses.patch import logit_metric
from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.fitted import fitted_lens_checks
from anatomy_cli.analyses.verify.runs import Runs
from anatomy_cli.engine import experts
from anatomy_cli.engine import lens
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.forwarding import pad_batch
from anatomy_cli.engine.forwarding import run_batch
from anatomy_cli.engine.gradients import metric_gradients
from anatomy_cli.engine.hooks import attach
from anatomy_cli.engine.interventions import patch_grid
from anatomy_cli.errors import AnatomyError
from anatomy_cli.models import sites


def identities(runs: Runs) -> C.SectionResult:
    lm, tol = runs.lm, C.IDENTITY[runs.dtype]
    rows = decomposition(runs, tol)
    if lm.has_unembed:
        rows.append(C.worst([C.tensor_check("lens == logits", lens.unembed(lm, c["resid_post", -1]), c.logits, tol,
                                            layer=lm.n_layers - 1) for c in runs.batched]))
        rows += fitted_lens_checks(runs, tol)
        rows.append(dla_sum(runs, C.RELATIVE[runs.dtype]))  # a float32 sum of some hundred rows
        rows.append(self_patch(runs, tol))
    if lm.info.moe is not None:
        rows += moe_sums(runs, tol)
    rows.append(batched_single(runs))
    if lm.has_unembed:
        rows.append(attribution_exact(runs, tol))
    return C.SectionResult("identities", "identities (exact up to rounding)", tuple(rows),
                           note=f"tolerance {tol:g} at {runs.dtype}")


def decomposition(runs: Runs, tol: float) -> list[C.Check]:
    lm = runs.lm
    if lm.adapter.post_ln:
        return [C.skipped("resid_post = pre + attn + mlp", f"{lm.adapter.name} is post-LN: each sub-layer's add "
                          "is followed by a LayerNorm, so the block output is no plain sum")]
    rows = []
    for layer in range(lm.n_layers):
        rows.append(C.worst([C.tensor_check("resid_post = pre + attn + mlp", c["resid_post", layer],
                                            c["resid_pre", layer] + c["attn_out", layer] + c["mlp_out", layer],
                                            tol, layer=layer) for c in runs.batched]))
        if lm.has_resid_mid:
            rows.append(C.worst([C.tensor_check("resid_mid = pre + attn", c["resid_mid", layer],
                                                c["resid_pre", layer] + c["attn_out", layer], tol, layer=layer)
                                 for c in runs.batched]))
    return rows


MOE_SUM = "mlp_out = Σ weight · expert (+ shared)"


def moe_sums(runs: Runs, tol: float) -> list[C.Check]:
    """Per MoE block: its output against the chosen experts' outputs (from their weights, on the block's input)
    times the weights the router gave them, plus the gated shared expert (Qwen2-MoE)."""
    rebuilt = [experts.rebuild(runs.lm, enc) for enc in runs.encoded]
    return [C.worst([C.tensor_check(MOE_SUM, r[block][0], r[block][1], tol, layer=block) for r in rebuilt])
            for block in rebuilt[0]]


def _top2(logits: torch.Tensor) -> tuple[int, int]:
    top = logits.float().topk(2).indices.tolist()
    return int(top[0]), int(top[1])


def dla_sum(runs: Runs, tol: float) -> C.Check:
    """The DLA rows by head at the last position against the model's own logit difference of its top two."""
    name = "DLA rows sum to logit diff"
    lm = runs.lm
    if lm.adapter.post_ln or not lm.is_causal:
        return C.skipped(name, f"{lm.adapter.name}: direct logit attribution needs a pre-norm decoder")
    if runs.dtype != "fp32":
        return C.skipped(name, "the decomposition is checked to 1e-4, which bf16/fp16 rounding exceeds: "
                         "see the fp32 control in the precision section")
    out = []
    for cache in runs.batched:
        target, foil = _top2(cache.logits[-1])
        note = ""
        try:
            att = logit_attribution(lm, cache, target, foil, by_head=True, row=-1)
        except AnatomyError:
            # A norm after attention (Gemma 2/3, OLMo 2: sandwich norms): the heads do not add up to attn_out,
            # the layers still add up to the final residual.
            note = "by layer (a norm after attention: heads do not add up to attn_out); "
            try:
                att = logit_attribution(lm, cache, target, foil, by_head=False, row=-1)
            except AnatomyError as exc:
                return C.Check(name, passed=False, note=str(exc))
        own = cache.logits[-1].double()
        diff = float(own[target] - own[foil])
        if lm.logit_softcap is not None:
            note += "logits soft-capped: against the head's raw output; "
        reference = att.logit if lm.logit_softcap is not None else diff
        out.append(C.scalar_check(name, abs(att.total - reference) / max(1.0, abs(reference)), tol,
                                  note=f"{note}{len(att.rows)} rows, {att.total:.6g} vs {reference:.6g}"))
    return C.worst(out)


def self_patch(runs: Runs, tol: float) -> C.Check:
    """``patch_grid`` of the first prompt into itself, resid_pre at the first, middle and last block."""
    lm, enc = runs.lm, runs.encoded[0]
    target, _ = _top2(runs.batched[0].logits[-1])
    layers = sorted({0, lm.n_layers // 2, lm.n_layers - 1})
    run = patch_grid(lm, enc.ids, enc.ids, "resid_pre", reduce=logit_metric(target), layers=layers)
    base = float(run.corrupt)
    err = float((run.grid.double() - base).abs().max()) / max(1.0, abs(base))
    return C.scalar_check("self-patch changes nothing", err, tol,
                          note=f"resid_pre at layers {', '.join(map(str, layers))} x {len(enc)} positions")


def batched_single(runs: Runs) -> C.Check:
    """Every hook point of every prompt, batched against alone; the row is the worst point."""
    tol = C.RELATIVE[runs.dtype]
    worst: C.Check | None = None
    for b, s in zip(runs.batched, runs.single):
        for name in b.names:
            check = C.tensor_check("batched == one by one", b[name], s[name], tol, note=name)
            worst = check if worst is None else C.worst([worst, check])
    assert worst is not None
    return worst


def attribution_exact(runs: Runs, tol: float) -> C.Check:
    """Attribution patching (one forward and backward, ``engine.gradients.metric_gradients``) against the exact
    patched run, on the final norm's output (or the last block's output) and the logit difference."""
    name = "attribution patching == exact (linear metric)"
    lm = runs.lm
    if lm.logit_softcap:
        return C.skipped(name, "logits are soft-capped: no metric on them is linear in the final residual")
    final = sites.Whole.ln_final.value
    point = final if final in lm.points else sites.name(lm.n_layers - 1, sites.Point.resid_post)
    if point != final and not lm.is_causal:
        return C.skipped(name, "an encoder's MLM head is not linear in the last block's output")
    if len(runs.encoded) < 2:
        return C.skipped(name, "needs two prompts")
    n = min(len(runs.encoded[0]), len(runs.encoded[1]))
    clean, corrupt = runs.encoded[0].ids[:n], runs.encoded[1].ids[:n]
    with torch.inference_mode():
        logits = head_logits(lm, run_batch(lm, pad_batch(lm, [clean, corrupt]))[:, -1])
    target, foil = int(logits[0].argmax()), int(logits[1].argmax())
    if target == foil:
        foil = _top2(logits[1])[1]
    metric = logit_metric(target, foil)
    grads = metric_gradients(lm, corrupt, [point], metric, companion=clean)
    a_clean, a_corrupt, g = grads.companion_acts[point], grads.acts[point], grads.grads[point]
    estimate = float(((a_clean - a_corrupt).double() * g.double()).sum())
    value = a_clean.to(lm.dtype)[None]
    with torch.inference_mode(), attach(lm, {point: lambda _t: value}):
        patched = float(metric(head_logits(lm, run_batch(lm, pad_batch(lm, [corrupt]))[:, -1]))[0])
    exact = patched - grads.metric
    err = abs(estimate - exact) / max(1.0, abs(exact))
    return C.scalar_check(name, err, tol, note=f"{point}: estimate {estimate:.6g}, exact {exact:.6g}")
