"""`generate --plot`: a coefficient sweep (the target's log-probability shift and the KL from the unsteered
distribution against the coefficient), or with ``--lens`` the block x step grid of the chosen token's
probability."""

from __future__ import annotations

from typing import TYPE_CHECKING

from matplotlib.patches import Rectangle

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.plots._base import as_array
from anatomy_cli.output.plots._base import caption
from anatomy_cli.output.plots._base import grid_size
from anatomy_cli.output.plots._base import heatmap
from anatomy_cli.output.plots._base import new_figure
from anatomy_cli.output.plots._base import token_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from anatomy_cli.analyses.generate import Continuation
    from anatomy_cli.analyses.generate import Sweep

KL_COLOUR, SHIFT_COLOUR = "#4c72b0", "#dd8452"
LENS_NOTE = ("each cell: the probability of the token chosen at that step under the lens of that block's output "
             "(the logit lens softmax(unembed(final_norm(h))), or a fitted lens' map first; blank: a block the "
             "fitted lens was not fitted at); the last block's is the model's own")


def figure(result: Continuation | Sweep, cap: Caption) -> Figure:
    """Draw an :class:`~anatomy_cli.analyses.generate.Sweep` (lines over the coefficients) or a
    :class:`~anatomy_cli.analyses.generate.Continuation` run with ``--lens`` (a heatmap, block 0 at the bottom,
    one column per generated token, the first block that ranks the token first framed). Returns a Figure."""
    from anatomy_cli.analyses.generate import Sweep

    if isinstance(result, Sweep):
        return _sweep(result, cap)
    return _lens(result, cap)


def _sweep(sweep: Sweep, cap: Caption) -> Figure:
    coefs, kls, shifts = sweep.points()
    has_target = sweep.target is not None
    fig = new_figure(10.5 if has_target else 6.5, 4.6)
    axes = fig.subplots(1, 2 if has_target else 1, squeeze=False)[0]
    if has_target:
        ax = axes[0]
        ax.plot(coefs, [float("nan") if s is None else s for s in shifts], "o-", color=SHIFT_COLOUR)
        ax.axhline(0, color="black", lw=0.8)
        ax.set_ylabel(f"shift of log p({token_label(sweep.target, 24)}) from coefficient 0 (nats)")
        ax.set_title("target log-probability shift")
    ax = axes[-1]
    ax.plot(coefs, kls, "o-", color=KL_COLOUR)
    ax.set_ylabel("KL(P_coef ‖ P_0) (nats)")
    ax.set_title("KL from the unsteered distribution")
    for a in axes:
        a.set_xlabel("steering coefficient")
        a.set_xticks(coefs)
        a.grid(alpha=0.3)
    notes = ["both at the first generated position: the next-token distribution right after the prompt"]
    caption(fig, cap, notes)
    return fig


def _lens(c: Continuation, cap: Caption) -> Figure:
    values = as_array(c.lens_grid())
    n_rows, n_cols = values.shape
    width, height, cw, ch = grid_size(n_rows, n_cols)
    fig = new_figure(width, height)
    ax = fig.subplots()
    notes = heatmap(fig, ax, values, cell=(cw, ch), xlabels=[token_label(st.chosen.token) for st in c.steps],
                    ylabels=[str(b) for b in range(n_rows)], cmap="viridis", vmin=0.0, vmax=1.0,
                    colorbar="probability of the chosen token", xlabel="token generated at each step",
                    ylabel="block (its output, resid_post)")
    for s, st in enumerate(c.steps):
        if st.first_top1_layer is not None:
            ax.add_patch(Rectangle((s - 0.5, st.first_top1_layer - 0.5), 1, 1, fill=False, edgecolor="white",
                                   lw=1.6))
    caption(fig, cap, [LENS_NOTE, "framed: the first block whose lens ranks the chosen token first", *notes])
    return fig
