"""The statistics pictures colour or plot, described once: label, unit, colour direction, limits.

The PNG renderers (``plots/lens.py``, ``plots/heads.py``, ``plots/corpus.py``) and the HTML ones
(``html/lens.py``, ``html/heads.py``) read their axis and colour-bar labels and their colour scales from here,
so one statistic reads the same in every picture. Bright = confident for every lens statistic: a scale is
reversed where a low value is the confident one (entropy, KL, rank). Also ``params``' category colours and names,
the same in its PNG and its HTML page. No matplotlib or plotly here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from anatomy_cli.analyses.dla import Row


@dataclass(frozen=True)
class Statistic:
    """``name`` and ``unit`` (None: a probability, weight or count) make the ``label``; ``high_is_bright``:
    the colour scale's bright end is at high values (False: reversed); ``limits``: fixed colour limits, else
    None (the data's range); ``log``: drawn on a log scale."""

    name: str
    unit: str | None = None
    high_is_bright: bool = True
    limits: tuple[float, float] | None = None
    log: bool = False

    @property
    def label(self) -> str:
        """``entropy of the distribution (nats)``, ``rank of the target (1 = top), log scale``."""
        return self.name + (f" ({self.unit})" if self.unit else "") + (", log scale" if self.log else "")

    @property
    def cmap(self) -> str:
        """matplotlib's name of the colour scale: ``viridis`` or ``viridis_r``."""
        return "viridis" if self.high_is_bright else "viridis_r"

    @property
    def colorscale(self) -> str:
        """plotly's name of the same scale: ``Viridis`` or ``Viridis_r``."""
        return "Viridis" if self.high_is_bright else "Viridis_r"


# `lens --stat` (one value per layer and position) and the per-layer curves of `corpus`.
LENS = {
    "prob": Statistic("probability of the top token", limits=(0.0, 1.0)),
    "logprob": Statistic("log-probability of the top token", "nats"),
    "entropy": Statistic("entropy of the distribution", "nats", high_is_bright=False),
    "kl": Statistic("KL(final layer ‖ this layer)", "nats", high_is_bright=False),
    "rank": Statistic("rank of the target (1 = top)", high_is_bright=False, log=True),
    "ce": Statistic("cross-entropy", "bits per token", high_is_bright=False),
}

# `heads` scores (one value per layer and head), also `corpus --heads`. Weights share the scale [0, 1].
HEADS = {
    "entropy": Statistic("entropy", "nats", high_is_bright=False),
    "first_token": Statistic("first token (sink) mass", limits=(0.0, 1.0)),
    "prev_token": Statistic("previous-token weight", limits=(0.0, 1.0)),
    "induction": Statistic("induction score", limits=(0.0, 1.0)),
    "duplicate_token": Statistic("duplicate-token weight", limits=(0.0, 1.0)),
}


# `corpus --experts --plot`: one value per MoE block and expert, from 0 to the largest seen.
EXPERTS = {
    "load": Statistic("share of the block's token slots"),
}

EXPERT_COLOURS = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd",
                  "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d",
                  "#17becf", "#9edae5")
"""`route --plot`: one colour per expert (matplotlib's tab20, in the PNG as its colormap, in HTML as these hex
values); experts i and i + 20 share a colour, and each cell names its expert."""


def by_component(rows: Sequence[Row]) -> dict[str, float]:
    """`dla`'s rows by component name, for its pictures; with ``--by expert`` each MoE block's ``L{l}.mlp`` is
    the sum of its experts' rows (``L{l}.E{e}``, ``L{l}.shared_expert``)."""
    out = {r.component: r.contribution for r in rows}
    for r in rows:
        part = r.component.split(".", 1)[-1]
        if r.layer is not None and r.head is None and (part[:1] == "E" and part[1:].isdigit()
                                                       or part == "shared_expert"):
            out[f"L{r.layer}.mlp"] = out.get(f"L{r.layer}.mlp", 0.0) + r.contribution
    return out


LENS_READING = {  # what a lens grid's cell reads, per lens kind (LensGrid.lens); the PNG and the page say the same
    "logit": "softmax(unembed(final_norm(h))) (the logit lens)",
    "jacobian": "softmax(unembed(final_norm(J_l h))) (the Jacobian lens)",
    "tuned": "softmax(unembed(final_norm(h + A_l h + b_l))) (the tuned lens)",
}


def lens_reading(kind: str) -> str:
    """``softmax(...) (the ... lens)``: what a cell of a ``kind`` lens grid reads."""
    return LENS_READING.get(kind, LENS_READING["logit"])


# `params`' pictures (the PNG and the HTML page): one colour per category of a block, the same in both panels, and
# the legend's name of each category of a block.
PARAMS_COLOURS = {"token_embedding": "#4c72b0", "position_embedding": "#64b5cd", "attention": "#dd8452",
                  "ffn": "#55a868", "router": "#8172b3", "routed_experts": "#55a868", "shared_experts": "#937860",
                  "norm_other": "#8c8c8c"}
PARAMS_LABELS = {"attention": "attention", "ffn": "FFN", "router": "router", "routed_experts": "routed experts",
                 "shared_experts": "shared experts", "norm_other": "norms + other"}
