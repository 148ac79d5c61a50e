"""Counting parameters on a model built on PyTorch's meta device (:mod:`params_build`).

Every unique parameter tensor (``model.named_parameters()``, which yields a tied tensor once)
is classified by :mod:`anatomy_cli.analyses.params.breakdown`'s rules into the breakdown's rows, with
per-layer rows, mixture-of-experts active counts and notes. Used for presets, config-only
directories and Hub ids; a checkpoint on disk is read from its headers instead
(:mod:`params_headers`); ``--max-memory`` adds accelerate's plan (:mod:`params_placement`).

Entry points: :func:`count_parameters`, and :func:`analyse_meta`, which chains
:func:`params_build.resolve_config`, :func:`params_build.build_meta_model`, :func:`count_parameters`
and :func:`params_placement.plan_placement`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from typing import TYPE_CHECKING

from anatomy_cli.analyses.params.breakdown import _EXPERT_INDEX_RE
from anatomy_cli.analyses.params.breakdown import _LAYER_RE
from anatomy_cli.analyses.params.breakdown import _N_EXPERTS_ATTRS
from anatomy_cli.analyses.params.breakdown import _TOP_K_ATTRS
from anatomy_cli.analyses.params.breakdown import ATTENTION
from anatomy_cli.analyses.params.breakdown import BLOCK_CATEGORIES
from anatomy_cli.analyses.params.breakdown import CATEGORIES
from anatomy_cli.analyses.params.breakdown import DTYPE_BITS
from anatomy_cli.analyses.params.breakdown import EMBEDDINGS
from anatomy_cli.analyses.params.breakdown import FFN
from anatomy_cli.analyses.params.breakdown import GENERIC
from anatomy_cli.analyses.params.breakdown import HEAD
from anatomy_cli.analyses.params.breakdown import LABELS
from anatomy_cli.analyses.params.breakdown import NORM
from anatomy_cli.analyses.params.breakdown import POSITION
from anatomy_cli.analyses.params.breakdown import ROUTED
from anatomy_cli.analyses.params.breakdown import TOKEN
from anatomy_cli.analyses.params.breakdown import TOKEN_TYPE
from anatomy_cli.analyses.params.breakdown import Family
from anatomy_cli.analyses.params.breakdown import MoEInfo
from anatomy_cli.analyses.params.breakdown import ParamsResult
from anatomy_cli.analyses.params.breakdown import Row
from anatomy_cli.analyses.params.breakdown import _fmt
from anatomy_cli.analyses.params.breakdown import _layer_rows
from anatomy_cli.analyses.params.breakdown import _outside_rows
from anatomy_cli.analyses.params.breakdown import _short_list
from anatomy_cli.analyses.params.breakdown import _Tensor
from anatomy_cli.analyses.params.breakdown import classify
from anatomy_cli.analyses.params.breakdown import family_for
from anatomy_cli.analyses.params.breakdown import memory_bytes
from anatomy_cli.analyses.params.breakdown import rule_notes
from anatomy_cli.analyses.params.build import ResolvedConfig
from anatomy_cli.analyses.params.build import build_meta_model
from anatomy_cli.analyses.params.build import resolve_config
from anatomy_cli.analyses.params.placement import config_dtype
from anatomy_cli.analyses.params.placement import plan_placement
from anatomy_cli.analyses.params.shipped import dtype_note
from anatomy_cli.errors import UsageError
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Sequence

    import torch
    from transformers import PreTrainedModel
    from transformers.configuration_utils import PreTrainedConfig


def _classify_all(model: PreTrainedModel, family: Family, n_experts: int | None) -> list[_Tensor]:
    input_emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    try:
        output_emb = model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        output_emb = None
    by_identity: dict[int, str] = {}
    if output_emb is not None:
        for p in output_emb.parameters():
            by_identity[id(p)] = HEAD
    if input_emb is not None and getattr(input_emb, "weight", None) is not None:
        by_identity[id(input_emb.weight)] = TOKEN
    tensors = []
    for name, p in model.named_parameters():  # remove_duplicate=True: a tied tensor appears once
        category = classify(name, family)
        recognised = category is not None
        if category is None and id(p) in by_identity:
            category, recognised = by_identity[id(p)], True
        if category is None:
            category = NORM
        m = _LAYER_RE.search(name)
        t = _Tensor(name, p.numel(), category, m.group(1) if m else None, int(m.group(2)) if m else None,
                    recognised)
        if category == ROUTED:
            t.per_expert = _per_expert(name, p, n_experts)
        tensors.append(t)
    return tensors


def _per_expert(name: str, p: torch.Tensor, n_experts: int | None) -> dict[int, int]:
    """Parameters each routed expert holds in tensor ``p``: one expert per
    ``experts.<i>.`` module, or a slice along dim 0 of a fused [n_experts, ...] tensor.
    A fused tensor whose dim 0 is not the config's expert count (e.g. [n_experts * d_ff, d])
    is split evenly into that many experts."""
    m = _EXPERT_INDEX_RE.search(name)
    if m:
        return {int(m.group(1)): p.numel()}
    if p.dim() == 0:
        return {0: p.numel()}
    if n_experts and p.shape[0] != n_experts and p.numel() % n_experts == 0:
        return dict.fromkeys(range(n_experts), p.numel() // n_experts)
    per = p[0].numel()  # one slice along the expert dimension (meta: no data touched)
    return dict.fromkeys(range(p.shape[0]), per)


def _config_int(config: PreTrainedConfig, attrs: tuple[str, ...]) -> int | None:
    for attr in attrs:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _top_k(config: PreTrainedConfig, model: PreTrainedModel) -> int | None:
    value = _config_int(config, _TOP_K_ATTRS)
    if value is not None:
        return value
    for module in model.modules():  # e.g. routers that keep their own top_k
        value = getattr(module, "top_k", None)
        if isinstance(value, int) and value > 0 and hasattr(module, "num_experts"):
            return value
    return None


def _tied_pairs(model: PreTrainedModel) -> list[tuple[str, str]]:
    seen: dict[int, str] = {}
    pairs = []
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            pairs.append((name, seen[id(p)]))
        else:
            seen[id(p)] = name
    return pairs


def count_parameters(model: PreTrainedModel, resolved: ResolvedConfig, *, dtype: str | None = None,
                     per_layer: bool = False) -> ParamsResult:
    """Break ``model``'s unique parameters into rows (see the module docstring).

    ``dtype`` (a key of :data:`DTYPE_BITS`) adds memory in bytes for the resident
    weights (all parameters, every expert included). ``per_layer`` adds one
    :class:`LayerRow` per block. Raises UsageError for an unknown dtype.
    """
    if dtype is not None and dtype not in DTYPE_BITS:
        raise UsageError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPE_BITS)})")
    config = resolved.config
    model_type = getattr(config, "model_type", "") or ""
    family = family_for(model_type)
    tensors = _classify_all(model, family, _config_int(config, _N_EXPERTS_ATTRS))
    total = sum(t.numel for t in tensors)

    sums: dict[str, int] = defaultdict(int)
    layers_of: dict[str, set[str]] = defaultdict(set)
    for t in tensors:
        sums[t.category] += t.numel
        if t.layer is not None:
            layers_of[t.category].add(t.layer)

    moe, routed_active_by_layer = _moe(tensors, config, model, sums, layers_of, total)

    def mem(n: int) -> int | None:
        return memory_bytes(n, dtype) if dtype else None

    rows = _category_rows(sums, layers_of, moe, routed_active_by_layer, total, mem, family, model)

    n_layers = (int(getattr(config, "num_hidden_layers", 0) or 0)
                or len({t.layer for t in tensors if t.layer is not None}))
    excluded = [t for t in tensors if t.category in (*EMBEDDINGS, HEAD)]
    non_embedding = total - sum(t.numel for t in excluded)
    tied = _tied_pairs(model)
    unrecognised = [t.name for t in tensors if not t.recognised]

    layer_rows = outside = None
    if per_layer:
        layer_rows = tuple(_layer_rows(tensors, total, routed_active_by_layer, moe, mem))
        outside = tuple(_outside_rows(tensors, total, routed_active_by_layer, moe, mem))

    notes = _notes(resolved, family, total, non_embedding, excluded, tied, unrecognised, moe, dtype, model)
    return ParamsResult(
        model=resolved.spec, source=resolved.source, location=resolved.location, model_type=model_type,
        architecture=type(model).__name__, family=family.name, n_layers=n_layers, total=total, rows=tuple(rows),
        non_embedding=non_embedding, non_embedding_excludes=tuple(t.name for t in excluded), tied=tuple(tied),
        unrecognised=tuple(unrecognised), moe=moe, dtype=dtype, memory_bytes=mem(total), layers=layer_rows,
        outside_layers=outside,
        notes=tuple(notes),
    )



def _moe(tensors: Sequence[_Tensor], config: PreTrainedConfig, model: PreTrainedModel, sums: dict[str, int],
         layers_of: dict[str, set[str]], total: int) -> tuple[MoEInfo | None, dict[str | None, int]]:
    """Routed experts: per layer, the top-k experts run; the rest are idle for this token. The MoE summary
    (None for a dense model) and the routed parameters active per layer."""
    routed_active_by_layer: dict[str | None, int] = {}
    expert_sizes: dict[str | None, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for t in tensors:
        if t.per_expert:
            for e, n in t.per_expert.items():
                expert_sizes[t.layer][e] += n
    if not expert_sizes:
        return None, routed_active_by_layer
    k = _top_k(config, model)
    n_experts = max(len(sizes) for sizes in expert_sizes.values())
    unselected = None
    if k is not None:
        for layer, sizes in expert_sizes.items():
            routed_active_by_layer[layer] = sum(sorted(sizes.values(), reverse=True)[:k])
        unselected = sums[ROUTED] - sum(routed_active_by_layer.values())
    dense_layers = len(layers_of[FFN] - set(expert_sizes))
    moe = MoEInfo(n_experts=n_experts, top_k=k, moe_layers=len(expert_sizes), dense_layers=dense_layers,
                  active=None if unselected is None else total - unselected, unselected=unselected)
    return moe, routed_active_by_layer


def _category_rows(sums: dict[str, int], layers_of: dict[str, set[str]], moe: MoEInfo | None,
                   routed_active_by_layer: dict[str | None, int], total: int, mem: Callable[[int], int | None],
                   family: Family, model: PreTrainedModel) -> list[Row]:
    """One row per category, in :data:`CATEGORIES` order (empty ones left out, but the always-shown)."""
    rows = []
    for category in CATEGORIES:
        n = sums.get(category, 0)
        if n == 0 and category not in (TOKEN, ATTENTION, NORM) and not (category == FFN and moe is None):
            continue
        label = LABELS[category]
        n_layers = len(layers_of[category]) or None
        if category in BLOCK_CATEGORIES and n_layers:
            detail = counted(n_layers, "layer")
            if category == FFN and moe is not None:
                detail = counted(n_layers, "dense layer")
            if category == ROUTED and moe is not None and moe.top_k is not None:
                detail += f", top-{moe.top_k} of {moe.n_experts}"
            label = f"{label} ({detail})"
        if category == HEAD and family.name == "bert" and _is_tied_head(model):
            label = "LM head (untied parts)"
        active = (None if moe is None or moe.active is None else
                  sum(routed_active_by_layer.values()) if category == ROUTED else n)
        rows.append(Row(category, label, n, n / total if total else 0.0,
                        n_layers if category in BLOCK_CATEGORIES else None, active, mem(n)))
    return rows

def _is_tied_head(model: PreTrainedModel) -> bool:
    try:
        out = model.get_output_embeddings()
        inp = model.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return False
    return out is not None and inp is not None and getattr(out, "weight", None) is getattr(inp, "weight", False)


def _notes(resolved, family, total, non_embedding, excluded, tied, unrecognised, moe, dtype, model) -> list[str]:
    notes = ["Counted on the meta device from the config alone (no weights): every unique parameter tensor "
             "once, buffers never."]
    if _is_tied_head(model):
        notes.append("The LM head shares the token embedding (tied weights); it is counted once, under "
                     "Token Embedding.")
    other_ties = [(a, b) for a, b in tied if not (_is_tied_head(model) and b == _input_weight_name(model))]
    if other_ties:
        notes.append("Also tied (counted once): " + _short_list([f"{a} = {b}" for a, b in other_ties]) + ".")
    if excluded:
        tied_head = _is_tied_head(model)
        roles = {TOKEN: "token embedding" + (", also the LM head" if tied_head else ""),
                 POSITION: "position embedding", TOKEN_TYPE: "token-type embedding", HEAD: "LM head"}
        names = [f"{t.name} ({roles[t.category]})" for t in excluded]
        notes.append(f"Non-embedding parameters: {_fmt(non_embedding)} = the total minus {_short_list(names, 6)}.")
    notes += rule_notes(unrecognised, family is GENERIC, getattr(resolved.config, "model_type", ""), family.name)
    if moe is not None:
        if moe.top_k is None:
            notes.append("Mixture of experts: the config does not say how many experts a token uses, "
                         "so no active count.")
        else:
            dense = f"; {counted(moe.dense_layers, 'dense FFN layer')}" if moe.dense_layers else ""
            notes.append(f"Active = parameters used for one token: everything except the routed experts the "
                         f"router does not pick (top-{moe.top_k} of {moe.n_experts} in each of "
                         f"{counted(moe.moe_layers, 'MoE layer')}{dense}). Active {_fmt(moe.active)} of "
                         f"{_fmt(total)}.")
    if dtype:

        notes.append(dtype_note(dtype, moe is not None))
    return notes


def _input_weight_name(model: PreTrainedModel) -> str | None:
    inp = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    weight = getattr(inp, "weight", None)
    for name, p in model.named_parameters():
        if p is weight:
            return name
    return None


def analyse_meta(spec, source, dtype, per_layer, trust_remote_code, max_memory) -> ParamsResult:

    resolved = resolve_config(spec, trust_remote_code=trust_remote_code, source=source)
    model = build_meta_model(resolved.config, trust_remote_code=trust_remote_code)
    result = count_parameters(model, resolved, dtype=dtype, per_layer=per_layer)
    if max_memory is not None:
        plan_dtype = dtype or config_dtype(resolved.config)
        placement = plan_placement(model, max_memory, plan_dtype)
        no_split = ", ".join(getattr(model, "_no_split_modules", None) or []) or "none"
        note = (f"Placement: accelerate's infer_auto_device_map on the meta model at {plan_dtype} (never split: "
                f"{no_split}); GPU budgets are taken as given; 'disk' holds what fits no budget: with --device-map it "
                "is read from disk at every forward (docs/big-models.md).")
        result = dataclasses.replace(result, placement=placement, notes=(*result.notes, note))
    return result


