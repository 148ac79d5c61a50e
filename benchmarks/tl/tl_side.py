"""What a TransformerLens user writes to get the numbers anatomy's commands print (issue 20).

Nothing from anatomy_cli is imported: only torch, transformers and transformer_lens, so
``benchmarks/tl/run.py`` measures TransformerLens doing the same job. Each function takes a
booted ``TransformerBridge`` and token ids ``[1, pos]`` (a tensor: TL's string input would
prepend a BOS, which anatomy does not) and returns plain JSON-ready data whose keys match
anatomy's ``--format json`` output, so the two can be compared number by number.

    python benchmarks/tl/tl_side.py trace DIR PROMPT          # load + the quantities of `anatomy trace`
    python benchmarks/tl/tl_side.py heads DIR PROMPT IDS      # IDS: the random tokens, comma-separated
    python benchmarks/tl/tl_side.py dla DIR PROMPT TARGET_ID FOIL_ID      # decompose_resid + logit_attrs
    python benchmarks/tl/tl_side.py patch DIR CLEAN CORRUPT TARGET_ID FOIL_ID   # get_act_patch_resid_pre

The bridge is booted with ``TransformerBridge.boot_transformers(DIR, tokenizer=...)`` from a local
directory; it forces eager attention (anatomy runs transformers' default, sdpa).
"""

from __future__ import annotations

import json
import sys

import torch


def boot(model_dir: str):
    """``(bridge, tokenizer)``: the checkpoint in ``model_dir`` on the CPU, fp32, eval mode."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    bridge = TransformerBridge.boot_transformers(model_dir, tokenizer=tokenizer, device="cpu")
    bridge.eval()
    return bridge, tokenizer


def tokens(tokenizer, text: str) -> torch.Tensor:
    """Token ids ``[1, pos]`` with no BOS (the tokenizer's own ids, as anatomy encodes decoder prompts)."""
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)


def _top(logits: torch.Tensor, k: int) -> list[dict]:
    probs = torch.softmax(logits.double(), dim=-1)
    values, ids = torch.topk(probs, k)
    return [{"token_id": int(i), "probability": float(p)} for p, i in zip(values, ids)]


# ---------------------------------------------------------------- trace

def trace_names(n_layers: int) -> list[str]:
    """The hooks `trace` needs: resid_pre of every block and the last resid_post (accumulated_resid),
    attn_out and mlp_out of every block."""
    return ([f"blocks.{l}.hook_resid_pre" for l in range(n_layers)] + [f"blocks.{n_layers - 1}.hook_resid_post"]
            + [f"blocks.{l}.hook_attn_out" for l in range(n_layers)]
            + [f"blocks.{l}.hook_mlp_out" for l in range(n_layers)])


def trace(bridge, ids: torch.Tensor, k: int = 5) -> dict:
    """The residual stream at the last position, layer by layer, with the logit lens (final norm
    recomputed per layer) and the top-k next tokens: `anatomy trace`'s numbers."""
    n_layers = bridge.cfg.n_layers
    with torch.no_grad():
        logits, cache = bridge.run_with_cache(ids, names_filter=trace_names(n_layers))
        resid = cache.accumulated_resid(pos_slice=-1)[:, 0]                      # [L + 1, d_model]
        attn = torch.stack([cache["attn_out", l][0, -1] for l in range(n_layers)])
        mlp = torch.stack([cache["mlp_out", l][0, -1] for l in range(n_layers)])
        lens = torch.softmax(bridge.unembed(bridge.ln_final(resid)).double(), dim=-1)  # [L + 1, vocab]
    h = resid.double()
    lens_p, lens_id = lens.max(dim=-1)
    cos_emb = _cos(h, h[:1]).tolist()
    cos_prev = [None, *_cos(h[1:], h[:-1]).tolist()]
    norms = h.norm(dim=-1).tolist()
    attn_n = [None, *attn.double().norm(dim=-1).tolist()]
    mlp_n = [None, *mlp.double().norm(dim=-1).tolist()]
    layers = [{"layer": l, "cos_to_embedding": cos_emb[l], "cos_to_previous": cos_prev[l], "resid_norm": norms[l],
               "attn_norm": attn_n[l], "mlp_norm": mlp_n[l], "lens_token_id": int(lens_id[l]),
               "lens_probability": float(lens_p[l])} for l in range(n_layers + 1)]
    return {"layers": layers, "top": _top(logits[0, -1], k)}


# ---------------------------------------------------------------- heads

def _pattern_scores(pattern: torch.Tensor) -> torch.Tensor:
    """[3, n_heads]: entropy (nats), first-token mass, previous-token weight over queries 1..n-1."""
    a = pattern.double()[:, 1:]
    entropy = -(a * torch.where(a > 0, a.log(), torch.zeros_like(a))).sum(-1).mean(-1)
    return torch.stack([entropy, a[:, :, 0].mean(-1), torch.diagonal(a, dim1=1, dim2=2).mean(-1)])


def _repeat_scores(pattern: torch.Tensor, seq_len: int) -> torch.Tensor:
    """[2, n_heads]: induction and duplicate-token weights on ``r r`` (r = seq_len tokens)."""
    j = torch.arange(seq_len)
    q = seq_len + j
    return torch.stack([pattern[:, q, j + 1].double().mean(-1), pattern[:, q, j].double().mean(-1)])


def heads(bridge, ids: torch.Tensor, random_ids: list[int]) -> dict:
    """Five scores per head, `anatomy heads PROMPT`'s numbers: entropy, first_token and prev_token on
    ``ids``, induction and duplicate_token on ``random_ids`` repeated twice; the patterns come from
    ``run_with_cache`` with the ``hook_pattern`` of every layer, one run per sequence."""
    n_layers = bridge.cfg.n_layers
    names = [f"blocks.{l}.attn.hook_pattern" for l in range(n_layers)]
    rand = torch.tensor([list(random_ids) * 2])
    with torch.no_grad():
        _, on_prompt = bridge.run_with_cache(ids, names_filter=names)
        _, on_random = bridge.run_with_cache(rand, names_filter=names)
    rows = []
    for l in range(n_layers):
        a = _pattern_scores(on_prompt[names[l]][0])
        b = _repeat_scores(on_random[names[l]][0], len(random_ids))
        for h in range(a.shape[1]):
            rows.append({"layer": l, "head": h, "entropy": float(a[0, h]), "first_token": float(a[1, h]),
                         "prev_token": float(a[2, h]), "induction": float(b[0, h]),
                         "duplicate_token": float(b[1, h])})
    return {"heads": rows}


# ---------------------------------------------------------------- dla

def dla_names(bridge) -> list[str]:
    """What decompose_resid and logit_attrs read: the embeddings, every attn_out and mlp_out, the final
    norm's scale."""
    n_layers = bridge.cfg.n_layers
    return (["hook_embed", "hook_pos_embed", "ln_final.hook_scale"]
            + [f"blocks.{l}.hook_attn_out" for l in range(n_layers)]
            + [f"blocks.{l}.hook_mlp_out" for l in range(n_layers)])


def dla(bridge, ids: torch.Tensor, target: int, foil: int) -> dict:
    """Direct logit attribution of logit(target) - logit(foil) at the last position, by layer:
    ``cache.decompose_resid`` + ``cache.logit_attrs`` (the final norm's scale frozen at the final
    residual, TL's ``apply_ln_to_stack``). ``bridge`` must be in compatibility mode
    (:func:`boot_folded`): logit_attrs dots with ``W_U``, which holds the final norm's weight only
    once it is folded in."""
    with torch.no_grad():
        _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in set(dla_names(bridge)))
        stack, labels = cache.decompose_resid(layer=-1, pos_slice=-1, return_labels=True)
        attrs = cache.logit_attrs(stack, tokens=torch.tensor([target]), incorrect_tokens=torch.tensor([foil]),
                                  pos_slice=-1)
    values = attrs.reshape(len(labels), -1)[:, 0].double().tolist()
    return {"rows": [{"component": _component(label), "contribution": v} for label, v in zip(labels, values)]}


def _component(label: str) -> str:
    """TL's decompose_resid labels in anatomy's names: ``3_attn_out`` -> ``L3.attn``."""
    if label[0].isdigit():
        layer, kind = label.split("_", 1)
        return f"L{layer}.{kind.removesuffix('_out')}"
    return label


def boot_folded(model_dir: str):
    """``(bridge, tokenizer)`` in compatibility mode (final norm folded into ``W_U``, unembedding centred):
    what TransformerLens's docs use for logit attribution."""
    bridge, tokenizer = boot(model_dir)
    bridge.enable_compatibility_mode()
    return bridge, tokenizer


# ---------------------------------------------------------------- patch

def patch(bridge, clean: torch.Tensor, corrupt: torch.Tensor, target: int, foil: int) -> dict:
    """``get_act_patch_resid_pre`` over every (layer, position): one forward per cell. The metric is
    the normalized logit difference at the last position, (m - m_corrupt) / (m_clean - m_corrupt)."""
    from transformer_lens import patching

    def logit_diff(logits: torch.Tensor) -> torch.Tensor:
        return logits[0, -1, target].double() - logits[0, -1, foil].double()

    with torch.no_grad():
        clean_logits, clean_cache = bridge.run_with_cache(
            clean, names_filter=lambda n: n.endswith("hook_resid_pre"))
        m_clean = float(logit_diff(clean_logits))
        m_corrupt = float(logit_diff(bridge(corrupt)))
        grid = patching.get_act_patch_resid_pre(
            bridge, corrupt, clean_cache, lambda logits: (logit_diff(logits) - m_corrupt) / (m_clean - m_corrupt))
    cells = [{"layer": l, "position": p, "value": float(grid[l, p])}
             for l in range(grid.shape[0]) for p in range(grid.shape[1])]
    return {"clean_metric": m_clean, "corrupt_metric": m_corrupt, "cells": cells}


def main(argv: list[str]) -> None:
    command, model_dir, *rest = argv
    bridge, tokenizer = boot_folded(model_dir) if command == "dla" else boot(model_dir)
    if command == "trace":
        out = trace(bridge, tokens(tokenizer, rest[0]))
    elif command == "heads":       # PROMPT RANDOM_IDS (comma-separated, one copy)
        out = heads(bridge, tokens(tokenizer, rest[0]), [int(x) for x in rest[1].split(",")])
    elif command == "dla":         # PROMPT TARGET_ID FOIL_ID
        out = dla(bridge, tokens(tokenizer, rest[0]), int(rest[1]), int(rest[2]))
    elif command == "patch":       # CLEAN CORRUPT TARGET_ID FOIL_ID
        out = patch(bridge, tokens(tokenizer, rest[0]), tokens(tokenizer, rest[1]), int(rest[2]), int(rest[3]))
    else:
        sys.exit(f"unknown command {command!r}")
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
