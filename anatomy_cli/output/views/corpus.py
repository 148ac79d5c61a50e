"""`corpus`'s view: the per-layer and per-head tables, the JSON record, the picture's arguments."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models.resolve import short_name
from anatomy_cli.output import plots
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks import records
from anatomy_cli.tasks.session import model_label

if TYPE_CHECKING:
    from anatomy_cli.corpus.summary import CorpusStats
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.corpus import CorpusRun

# On a narrow terminal the standard errors (and CE in nats beside CE in bits) are left out first.
LAYER_COLUMNS = (
    Column("layer", "layer", "int"),
    Column("kl_nats", "KL nats", "float", 4), Column("kl_nats_se", "±", "float", 4, priority=-1),
    Column("top1_agree", "top-1 agree", "pct", 1), Column("top1_agree_se", "±", "pct", 1, priority=-1),
    Column("ce_bits", "CE bits", "float", 3), Column("ce_bits_se", "±", "float", 3, priority=-1),
    Column("ce_nats", "CE nats", "float", 3, priority=-1),  # CE bits x ln 2
    Column("resid_norm", "|resid|", "float", 2), Column("resid_norm_se", "±", "float", 2, priority=-1),
    Column("cos_to_embedding", "cos emb", "float", 3), Column("cos_to_embedding_se", "±", "float", 3, priority=-1),
    Column("attn_out_norm", "|attn_out|", "float", 2), Column("attn_out_norm_se", "±", "float", 2, priority=-1),
    Column("mlp_out_norm", "|mlp_out|", "float", 2), Column("mlp_out_norm_se", "±", "float", 2, priority=-1),
    Column("max_abs", "max |h|", "float", 1), Column("max_abs_dim", "dim", "id"),
    Column("max_abs_dim_share", "dim share", "pct", 1),
    Column("lens_positions", "lens pos", "int"), Column("ce_positions", "CE pos", "int"),
)
LENS_COLUMNS = (
    Column("lens", "lens", "text"), Column("layer", "layer", "int"),
    Column("kl_nats", "KL nats", "float", 4), Column("kl_nats_se", "±", "float", 4, priority=-1),
    Column("kl_bits_per_byte", "KL bits/byte", "float", 4),
    Column("ce_nats", "CE nats", "float", 3), Column("ce_nats_se", "±", "float", 3, priority=-1),
    Column("ce_bits_per_byte", "CE bits/byte", "float", 3),
    Column("entropy_nats", "entropy nats", "float", 3), Column("entropy_nats_se", "±", "float", 3, priority=-1),
    Column("entropy_bits_per_byte", "entropy bits/byte", "float", 3),
    Column("top1_agree", "top-1 agree", "pct", 1), Column("lens_positions", "lens pos", "int"),
)
HEAD_COLUMNS = (
    Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("entropy_nats", "entropy nats", "float", 3), Column("entropy_nats_se", "±", "float", 3, priority=-1),
    Column("first_token", "first tok", "float", 3), Column("first_token_se", "±", "float", 3, priority=-1),
    Column("prev_token", "prev tok", "float", 3), Column("prev_token_se", "±", "float", 3, priority=-1),
)
EXPERT_BLOCK_COLUMNS = (
    Column("block", "block", "int"), Column("tokens", "tokens", "int"), Column("top_k", "k", "int"),
    Column("n_experts", "experts", "int"), Column("load_max_over_mean", "max/mean", "float", 3),
    Column("load_cv", "CV", "float", 3), Column("busiest_expert", "busiest", "id"),
    Column("idle_experts", "idle", "int"),
)
EXPERT_COLUMNS = (
    Column("block", "block", "int"), Column("expert", "expert", "id"), Column("slots", "slots", "int"),
    Column("load", "load", "pct", 2), Column("mean_weight", "mean weight", "float", 4),
)
PAIR_COLUMNS = (
    Column("block", "block", "int"), Column("expert_a", "expert", "id"), Column("expert_b", "with", "id"),
    Column("count", "together", "int"), Column("share", "of tokens", "pct", 2),
)
PAIRS_SHOWN = 10
EXPERT_NOTE = ("experts: load = the share of the block's token slots (tokens × k) routed to the expert; mean weight "
               "= its mean weight as the block applied it, when chosen; max/mean and CV (std/mean) of the slots over "
               f"experts. The table lists each block's {PAIRS_SHOWN} most frequent pairs; --format json and "
               "expert_pairs.parquet hold every pair chosen together")
NOTE = ("mean over every measured position of every window, ± its standard error over windows; row embed the "
        "embedding, row N block N's output (the last: the model's output). KL(final || lens) in nats; CE: "
        "-log2 p(next token) through the lens in bits (ce_bits; ce_nats = ce_bits × ln 2, the unit of sae and verify; "
        "the last row: the model's loss); max |h|: the largest |activation| "
        "seen, dim share: how often that dimension holds a position's largest |activation|. "
        "See docs/commands/corpus.md")
ROWS = "layers"
LN2 = math.log(2.0)


def with_nats(stats: dict[str, Any]) -> dict[str, Any]:
    """``stats`` (CorpusStats.to_dict()) with the cross-entropy in nats beside bits: ``ce_nats``/``ce_nats_se``
    after each row's ``ce_bits_se`` and ``loss_nats`` after ``loss_bits`` (the documented keys stay)."""
    def nats(bits: float | None) -> float | None:
        return None if bits is None else bits * LN2

    layers = []
    for row in stats["layers"]:
        out: dict[str, Any] = {}
        for key, value in row.items():
            out[key] = value
            if key == "ce_bits_se":
                out["ce_nats"], out["ce_nats_se"] = nats(row.get("ce_bits")), nats(value)
        layers.append(out)
    top: dict[str, Any] = {}
    for key, value in stats.items():
        top[key] = layers if key == "layers" else value
        if key == "loss_bits":
            top["loss_nats"] = nats(value)
    return top


def report(run: CorpusRun) -> Report:
    """``run``: a :class:`anatomy_cli.tasks.corpus.CorpusRun`."""
    stats, settings, identity, result = run.result.stats, run.settings, run.identity, run.result
    model = records.model_record(run.lm) if run.lm is not None else records.spec_record(run.spec)
    name = model_label(run.lm) if run.lm is not None else run.spec.model
    data = {**model, "source": identity, "settings": settings.to_dict(), "shards": result.shards,
            "resumed_shards": result.resumed, **with_nats(stats.to_dict())}
    loss = f" · loss {stats.loss_bits:.4f} bits/token ({stats.loss_bits * LN2:.4f} nats), " \
        f"perplexity {stats.perplexity:.2f}" if stats.loss_bits is not None else ""
    heading = [f"corpus · {name} · {identity['path']} · {stats.tokens:,} tokens in {stats.windows:,} windows of "
               f"≤ {settings.ctx}{' (BOS first)' if settings.bos else ''}{loss}"]
    notes = [NOTE]
    if settings.lens_every > 1:
        notes.append(f"lenses at every {settings.lens_every}th position only (--lens-every)")
    sections = [Section(LAYER_COLUMNS, data["layers"], title="per layer")]
    if len(stats.lenses) > 1 or any(lens["lens"] != "logit" for lens in stats.lenses):
        notes += lens_notes(stats.lenses)
        rows = [{"lens": lens["lens"], **r} for lens in stats.lenses for r in lens["layers"]]
        sections.append(Section(LENS_COLUMNS, rows, title="per lens"))
    if stats.heads:
        sections.append(Section(HEAD_COLUMNS, list(stats.heads), title="per head"))
    if stats.expert_blocks:
        sections += expert_sections(stats)
        notes.append(EXPERT_NOTE)
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def lens_notes(lenses: Any) -> list[str]:
    """What the per-lens table's units are, and which rows a fitted lens does not read (null there)."""
    out = ["per lens: KL(final || lens), CE and entropy in nats per token and in bits per byte (tuned-lens' "
           "conversion: nats / ln 2 × tokens / UTF-8 bytes of the text the windows cover)"]
    for lens in lenses:
        if lens["unfitted"]:
            rows = ", ".join(map(str, lens["unfitted"]))
            out.append(f"the {lens['lens']} lens {lens['source']} is not fitted at {rows}: null there")
    return out


def expert_sections(stats: CorpusStats) -> list[Section]:
    """``--experts``: per MoE block, per expert, and each block's most frequent pairs (by count, then ids)."""
    shown = []
    for b in dict.fromkeys(r["block"] for r in stats.expert_pairs):
        rows = [r for r in stats.expert_pairs if r["block"] == b]
        shown += sorted(rows, key=lambda r: -r["count"])[:PAIRS_SHOWN]
    return [Section(EXPERT_BLOCK_COLUMNS, list(stats.expert_blocks), title="per MoE block"),
            Section(EXPERT_COLUMNS, list(stats.experts), title="per expert"),
            Section(PAIR_COLUMNS, shown, title="experts chosen together")]


def figure(run: CorpusRun) -> FigureArgs:
    """:func:`anatomy_cli.output.plots.corpus.figure`'s arguments: the stats and the caption."""
    stats = run.result.stats
    cap = plots.Caption("corpus", short_name(run.spec.model), None,
                        f"{run.identity['path']} · {stats.tokens:,} tokens", untrained=run.spec.init == "random")
    return (stats, cap), {}
