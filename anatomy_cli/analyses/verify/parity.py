"""Section 1 of `anatomy verify`: the engine's hook points against transformers' own forward on the same
weights and ids.

transformers' ``hidden_states[l]`` is the input of block l (``hidden_states[0]``: the embedding, position
embedding and Gemma's scale included), so it is compared with ``blocks.{l}.hook_resid_pre`` and with
``blocks.{l-1}.hook_resid_post``. The family rule for the last entry: where the model has a final norm,
``hidden_states[L]`` is the last block's output after it, so it is compared with
``ln_final.hook_normalized`` and with the engine's final norm applied to ``blocks.{L-1}.hook_resid_post``;
without one (BERT, RoBERTa, OPT-350m: post-LN) it is the raw last block. The engine's run batches the prompts,
right-padded; the reference runs each prompt alone, so padding and batching are checked too. Each row is the
worst prompt.
"""

from __future__ import annotations

import torch

from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.runs import Runs
from anatomy_cli.engine import lens
from anatomy_cli.engine.attention import attention_patterns
from anatomy_cli.errors import AnatomyError
from anatomy_cli.models import sites


def parity(runs: Runs) -> C.SectionResult:
    """Every residual point per layer, the final norm, the logits and the attention patterns."""
    lm, tol = runs.lm, C.RELATIVE[runs.dtype]
    L = lm.n_layers
    final = sites.Whole.ln_final in lm.points
    rows: list[C.Check] = []

    def worst(name: str, layer: int | None, pairs, note: str = "") -> None:
        rows.append(C.worst([C.tensor_check(name, a, b, tol, layer=layer, note=note) for a, b in pairs]))

    hs = [out.hidden_states for out in runs.reference]
    for layer in range(L):
        worst("resid_pre", layer, [(c["resid_pre", layer], h[layer][0]) for c, h in zip(runs.batched, hs)],
              "hidden_states[0]" if layer == 0 else "")
        if layer < L - 1:
            worst("resid_post", layer, [(c["resid_post", layer], h[layer + 1][0]) for c, h in zip(runs.batched, hs)])
    last = [c["resid_post", L - 1] for c in runs.batched]
    if final:
        worst("resid_post", L - 1, [(lens.final_norm(lm, a), h[L][0]) for a, h in zip(last, hs)],
              "final norm applied: hidden_states[L] has it")
        worst("ln_final", None, [(c[sites.Whole.ln_final], h[L][0]) for c, h in zip(runs.batched, hs)])
    else:
        worst("resid_post", L - 1, [(a, h[L][0]) for a, h in zip(last, hs)], "no final norm: hidden_states[L] is raw")
    if lm.has_unembed:
        worst("logits", None, [(c.logits, out.logits[0]) for c, out in zip(runs.batched, runs.reference)])
        top1 = [bool((c.logits[-1].argmax() == out.logits[0, -1].argmax()).item())
                for c, out in zip(runs.batched, runs.reference)]
        disagree = sum(not t for t in top1)
        rows.append(C.scalar_check("top-1", float(disagree), 0.0, note=f"{len(top1) - disagree}/{len(top1)} prompts "
                                   "agree at the last position"))
    rows += attention_rows(runs)
    return C.SectionResult("parity", "parity with transformers' own forward", tuple(rows),
                           note=f"error: relative ||a - b|| / ||b|| (tolerance {tol:g} at {runs.dtype}); "
                                "rows are the worst prompt")


def attention_rows(runs: Runs) -> list[C.Check]:
    """``engine.attention_patterns`` (batched) against ``output_attentions`` under eager attention, per layer."""
    lm, tol = runs.lm, C.PATTERN[runs.dtype]
    try:
        mine = engine_patterns(runs)
        theirs = runs.reference_attentions
    except AnatomyError as exc:
        return [C.skipped("attention", str(exc))]
    rows = []
    for layer in range(lm.n_layers):
        pairs = []
        for i, enc in enumerate(runs.encoded):
            ref = theirs[i][layer] if theirs[i] and theirs[i][layer] is not None else None
            if ref is None:
                return [C.skipped("attention", f"{lm.name} returns no output_attentions under eager attention")]
            n = len(enc)
            pairs.append((mine[i][layer], ref[0, :, :n, :n].float()))
        rows.append(C.worst([C.abs_check("attention", a, b, tol, layer=layer) for a, b in pairs]))
    return rows


def engine_patterns(runs: Runs) -> list[torch.Tensor]:
    return attention_patterns(runs.lm, runs.encoded, batch_size=runs.batch_size)
