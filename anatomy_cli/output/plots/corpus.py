"""`corpus --plot`: the lens curves (KL and cross-entropy against layer; one per ``--lens``: the logit lens and
each fitted lens), the residual stream's size and its largest activation, with --heads the head grid, and with
--experts the expert load per MoE block."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import numpy as np
from matplotlib.ticker import PercentFormatter

from anatomy_cli.models.sites import residual_row
from anatomy_cli.output import statistics
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from anatomy_cli.corpus.summary import CorpusStats

# Each head grid: (its key in the corpus rows, the statistic it is)
HEAD_SCORES = (("entropy_nats", statistics.HEADS["entropy"]), ("first_token", statistics.HEADS["first_token"]),
               ("prev_token", statistics.HEADS["prev_token"]))
BAND_ALPHA = 0.35  # the ± SE band; error bars with caps on every point too, so a narrow band still shows
LENS_COLOURS = ("C0", "C1", "C4", "C5", "C6", "C8", "C9", "C7")  # one per lens (C2/C3: the residual panel's)
# ... and a marker and line style each, so that a lens reading what another reads (J = I) still shows over it
LENS_STYLES = (("o", "-"), ("s", "--"), ("D", ":"), ("v", "-."), ("^", "--"), ("P", ":"), ("X", "-."), ("*", "--"))
LENS_NAMES = {"logit": "logit lens", "tuned": "tuned lens", "jacobian": "Jacobian lens"}
LN2 = math.log(2.0)


def figure(stats: CorpusStats, cap: Caption) -> Figure:
    """Draw a :class:`anatomy_cli.corpus.summary.CorpusStats`.

    Top row, against the residual row (``embed``, then block N's output N; the last the model's output;
    docs/engine.md#layers), each mean with ± one standard error over
    windows as a band and error bars: KL(final || lens) in nats on a log scale (it falls by orders of magnitude
    from the embedding to the last blocks, so a linear axis set by the ``embed`` row squashes the rest; the last
    block's output is 0 by definition and not drawn), the lens' cross-entropy in bits per token with the model's
    own loss dashed (one curve per lens in both panels when ``corpus --lens`` gave a fitted lens:
    :func:`lens_curves`), and the residual stream's mean norm with the largest |activation| seen (log). Legends
    sit below their panels.
    With per-head rows, a second row of layer x head heatmaps (entropy, first-token mass, previous-token mass;
    layer 0 at the bottom). With per-expert rows (``--experts``), a last row across the page: MoE block x expert,
    coloured by the expert's load (:func:`expert_load`). Returns a matplotlib Figure.
    """
    rows = stats.layers
    has_heads = bool(stats.heads)
    experts = tuple(getattr(stats, "experts", ()))
    expert_h = _expert_height(experts)
    fig = new_figure(13.0, (9.4 if has_heads else 5.4) + expert_h)
    n_rows = (2 if has_heads else 1) + bool(experts)
    spec = fig.add_gridspec(n_rows, 3, height_ratios=[4.2] * (n_rows - bool(experts)) + ([expert_h] if experts else []))
    grid = [[fig.add_subplot(spec[r, c]) for c in range(3)] for r in range(n_rows - bool(experts))]
    kl, ce, resid = grid[0]
    last = rows[-1]["layer"] if rows else 0
    lenses = lens_curves(stats)
    for (label, curve), colour, style in zip(lenses, LENS_COLOURS, LENS_STYLES):
        name = label if len(lenses) > 1 else None
        _curve(kl, curve, "kl_nats", statistics.LENS["kl"].label, colour, skip=last, log=True, name=name, style=style)
        _curve(ce, curve, "ce_bits", statistics.LENS["ce"].label, colour, name=name, style=style)
    which = "logit lens" if len(lenses) <= 1 else "lenses"
    if len(lenses) > 1:
        for ax in (kl, ce):
            ax.fill_between([], [], color="grey", alpha=BAND_ALPHA, lw=0,
                            label="± 1 standard error over windows (bands and bars)")
    kl.set_title(f"{which}: KL to the output (log; layer {last} is 0)")
    if stats.loss_bits is not None:
        ce.axhline(stats.loss_bits, ls="--", color="grey", lw=1,
                   label=f"model's loss {stats.loss_bits:.3f} bits (perplexity {stats.perplexity:.1f})")
    ce.set_title(f"{which}: cross-entropy of the next token")
    _curve(resid, rows, "resid_norm", "‖h‖, mean norm of the residual stream", "C2", log=True)
    layers = [residual_row(r["layer"]) for r in rows]
    resid.plot(layers, [math.nan if r.get("max_abs") is None else r["max_abs"] for r in rows], marker="^", ms=4,
               color="C3", label="largest |activation| seen (one dimension)")
    resid.set_ylabel("size (log scale)")
    resid.set_title("residual stream: norm and largest activation")
    for ax in grid[0]:
        _row_ticks(ax, rows)
        ax.set_xlabel("layer (embed = the embedding; N = block N's output)")
        ax.grid(alpha=0.3)
        if not ax.lines:  # --no-lens: no lens was read
            ax.text(0.5, 0.5, "no lens measured (--no-lens)", ha="center", va="center", transform=ax.transAxes,
                    color="grey")
            ax.set_yticks([])
            continue
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), frameon=False)  # below: never on a curve
    if has_heads:
        _head_grids(fig, grid[1], stats.heads)
    notes = [f"{stats.tokens:,} tokens in {stats.windows:,} windows; means over every measured position"]
    if experts:
        notes += expert_load(fig, fig.add_subplot(spec[-1, :]), experts, getattr(stats, "expert_blocks", ()))
    caption(fig, cap, notes)
    return fig


def _expert_cells(experts: Any) -> tuple[int, int, float, float]:
    """MoE blocks, experts, and the heatmap's cell width and height in inches (the row spans ~11 in)."""
    n_blocks = len({r["block"] for r in experts})
    n_experts = max(r["expert"] for r in experts) + 1
    return n_blocks, n_experts, min(0.6, 11.0 / n_experts), min(0.32, 6.0 / n_blocks)


def _expert_height(experts: Any) -> float:
    """The expert row's height in inches (0 without experts): its cells, the axis labels and the title."""
    if not experts:
        return 0.0
    n_blocks, _, _, ch = _expert_cells(experts)
    return n_blocks * ch + 1.5


def expert_load(fig: Figure, ax: Axes, experts: Any, blocks: Any = ()) -> list[str]:
    """MoE block (rows, the first at the bottom; a dense block has no row) x expert, each cell the share of the
    block's token slots (tokens x k) routed to that expert: the ``load`` of ``corpus --experts``' rows; named in
    the cells when they are wide enough. Returns footer notes."""
    _, n_experts, cw, ch = _expert_cells(experts)
    order = sorted({r["block"] for r in experts})
    row_of = {b: i for i, b in enumerate(order)}
    values = [[None] * n_experts for _ in order]
    for r in experts:
        values[row_of[r["block"]]][r["expert"]] = r["load"]
    array = as_array(values)
    load = statistics.EXPERTS["load"]
    named = cw >= 0.42 and ch >= 0.2
    cells = [[None if v is None else f"{100 * v:.0f}%" for v in row] for row in values] if named else None
    notes = heatmap(fig, ax, array, cell=(cw, ch), xlabels=[str(e) for e in range(n_experts)],
                    ylabels=[str(b) for b in order], cmap=load.cmap, vmin=0.0,
                    vmax=float(max(1e-9, np.nanmax(array))), colorbar=load.label, cells=cells, xlabel="expert",
                    ylabel="MoE block", x_rotation=0)
    colorbar = ax.images[0].colorbar
    assert colorbar is not None  # heatmap(colorbar=...) drew one
    colorbar.ax.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    top_k = {b["block"]: b["top_k"] for b in blocks}
    ks = sorted(set(top_k.values()))
    ax.set_title("expert load: the share of each MoE block's token slots (tokens × k) routed to each expert")
    idle = sum(1 for r in experts if r["slots"] == 0)
    return [*notes, f"expert load: an even router gives every expert 1/{n_experts} = {100 / n_experts:.1f}% of a "
                    f"block's slots{f' (k = {ks[0]})' if len(ks) == 1 else ''}; "
                    f"{idle} (block, expert) pair(s) never chosen, at 0"]


def lens_curves(stats: CorpusStats) -> list[tuple[str, list[dict[str, Any]]]]:
    """What the KL and cross-entropy panels draw: per lens (``stats.lenses``, in ``--lens`` order) its legend
    label and rows ``{layer, kl_nats, kl_nats_se, ce_bits, ce_bits_se}`` (CE in bits per token: the per-lens
    table's ``ce_nats`` / ln 2; None where the lens does not read a row). Only the logit lens (or none): the
    per-layer rows, as the picture has always drawn them."""
    if not stats.lenses or [lens["lens"] for lens in stats.lenses] == ["logit"]:
        return [("logit lens", list(stats.layers))]

    def bits(nats: float | None) -> float | None:
        return None if nats is None else nats / LN2

    out = []
    for lens in stats.lenses:
        label = LENS_NAMES.get(lens["lens"], lens["lens"])
        if lens["source"]:
            label += f" {Path(lens['source']).name}"
        if lens["unfitted"]:
            label += f" (not fitted: {', '.join(map(str, lens['unfitted']))})"
        out.append((label, [{"layer": r["layer"], "kl_nats": r["kl_nats"], "kl_nats_se": r["kl_nats_se"],
                             "ce_bits": bits(r["ce_nats"]), "ce_bits_se": bits(r["ce_nats_se"])}
                            for r in lens["layers"]]))
    return out


def _curve(ax: Axes, rows: Any, key: str, label: str, colour: str, skip: int | None = None, log: bool = False,
           name: str | None = None, style: tuple[str, str] = ("o", "-")) -> None:
    """``key``'s mean against layer with its ± 1 SE as a band and as error bars (``skip``: a layer not drawn).
    ``log``: a log y axis, the band's lower edge kept above a tenth of the mean (a log axis has no 0). ``name``:
    the curve's legend label when the panel has several (then ``label`` is the axis' only, and the band unnamed);
    ``style``: its marker and line style."""
    points = [(residual_row(r["layer"]), r[key], r[f"{key}_se"] or 0.0) for r in rows
              if r[key] is not None and r["layer"] != skip and (r[key] > 0 or not log)]
    if not points:
        return
    layers, mean, se = zip(*points)
    low = [max(m - s, m / 10) if log else m - s for m, s in zip(mean, se)]
    high = [m + s for m, s in zip(mean, se)]
    marker, line = style
    ax.plot(layers, mean, marker=marker, ms=3 if marker == "o" else 5, ls=line, mfc="none" if name and marker != "o"
            else colour, color=colour, label=name or label)
    band = f"± 1 standard error over windows (largest {max(se):.3g})"
    ax.fill_between(layers, low, high, color=colour, alpha=BAND_ALPHA, lw=0, label=f"_{band}" if name else band)
    ax.errorbar(layers, mean, yerr=[[m - lo for m, lo in zip(mean, low)], [h - m for m, h in zip(mean, high)]],
                fmt="none", ecolor=colour, elinewidth=1, capsize=3)
    ax.set_ylabel(label)
    if log:
        ax.set_yscale("log")


def _row_ticks(ax: Axes, rows: Any) -> None:
    """The x axis at the residual rows' positions 0..L, named ``embed``, 0, …, L−1 (at most ~13 ticks)."""
    step = max(1, math.ceil(len(rows) / 13))
    blocks = rows[1:][::-1][::step][::-1]  # every step-th block, the last one always named
    # ``embed`` is wider than a number: the first block tick keeps its distance from it.
    blocks = [r for r in blocks if step == 1 or residual_row(r["layer"]) >= 1.5 * step]
    shown = [*rows[:1], *blocks]
    ax.set_xticks([residual_row(r["layer"]) for r in shown], [str(r["layer"]) for r in shown])


def _head_grids(fig: Figure, axes: Sequence[Axes], heads: Any) -> None:
    n_layers = max(r["layer"] for r in heads) + 1
    n_heads = max(r["head"] for r in heads) + 1
    for ax, (key, score) in zip(axes, HEAD_SCORES):
        values = [[math.nan] * n_heads for _ in range(n_layers)]
        for r in heads:
            values[r["layer"]][r["head"]] = r[key]
        array = as_array(values)
        top = float(max(1e-9, array.max())) if key == "entropy_nats" else 1.0
        cw = min(0.5, 3.2 / n_heads)
        ch = min(0.4, 3.4 / n_layers)
        heatmap(fig, ax, array, cell=(cw, ch), xlabels=[str(h) for h in range(n_heads)],
                ylabels=[str(layer) for layer in range(n_layers)], cmap=score.cmap, vmin=0.0, vmax=top,
                colorbar=score.label, xlabel="head", ylabel="layer", x_rotation=0)
        ax.set_title(score.label)
