"""`corpus --plot`: the logit-lens curve (KL and cross-entropy against layer) and, with --heads, the head grid."""

from __future__ import annotations

import math
from typing import Any

from anatomy_cli.output import statistics
from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array, caption, heatmap, new_figure

# Each head grid: (its key in the corpus rows, the statistic it is)
HEAD_SCORES = (("entropy_nats", statistics.HEADS["entropy"]), ("first_token", statistics.HEADS["first_token"]),
               ("prev_token", statistics.HEADS["prev_token"]))


def figure(stats: Any, cap: Caption) -> Any:
    """Draw a :class:`anatomy_cli.corpus.summary.CorpusStats`.

    Top row: KL(final || lens) in nats and the lens' cross-entropy in bits per token against layer
    (0 = embedding, L = the model's output), each with a band of ± one standard error over windows, and the
    model's own loss as a dashed line. With per-head rows, a second row of layer x head heatmaps
    (entropy, first-token mass, previous-token mass; layer 0 at the bottom). Returns a matplotlib Figure.
    """
    rows = stats.layers
    layers = [r["layer"] for r in rows]
    has_heads = bool(stats.heads)
    fig = new_figure(12.0, 8.6 if has_heads else 4.8)
    grid = fig.subplots(2 if has_heads else 1, 3 if has_heads else 2, squeeze=False)
    panels = (("kl_nats", statistics.LENS["kl"].label, "C0"), ("ce_bits", statistics.LENS["ce"].label, "C1"))
    for ax, (key, label, colour) in zip(grid[0], panels):
        mean = [math.nan if r[key] is None else r[key] for r in rows]
        se = [0.0 if r[f"{key}_se"] is None else r[f"{key}_se"] for r in rows]
        ax.plot(layers, mean, marker="o", ms=3, color=colour, label=label)
        ax.fill_between(layers, [m - s for m, s in zip(mean, se)], [m + s for m, s in zip(mean, se)],
                        color=colour, alpha=0.25, lw=0, label="± 1 standard error")
        if key == "ce_bits" and stats.loss_bits is not None:
            ax.axhline(stats.loss_bits, ls="--", color="grey", lw=1,
                       label=f"model's loss {stats.loss_bits:.3f} bits (perplexity {stats.perplexity:.1f})")
        ax.set_xlabel("layer (0 = embedding, L = output)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    if has_heads:
        grid[0][2].set_visible(False)
        n_layers = max(r["layer"] for r in stats.heads) + 1
        n_heads = max(r["head"] for r in stats.heads) + 1
        for ax, (key, score) in zip(grid[1], HEAD_SCORES):
            label, cmap = score.label, score.cmap
            values = [[math.nan] * n_heads for _ in range(n_layers)]
            for r in stats.heads:
                values[r["layer"]][r["head"]] = r[key]
            array = as_array(values)
            top = float(max(1e-9, array.max())) if key == "entropy_nats" else 1.0
            cw = min(0.5, 3.2 / n_heads)
            ch = min(0.4, 3.4 / n_layers)
            heatmap(fig, ax, array, cell=(cw, ch), xlabels=[str(h) for h in range(n_heads)],
                    ylabels=[str(layer) for layer in range(n_layers)], cmap=cmap, vmin=0.0, vmax=top,
                    colorbar=label, xlabel="head", ylabel="layer", x_rotation=0)
            ax.set_title(label)
    caption(fig, cap, [f"{stats.tokens:,} tokens in {stats.windows:,} windows; means over every measured position"])
    return fig
