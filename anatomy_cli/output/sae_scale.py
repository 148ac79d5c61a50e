"""The colour scale of `sae`'s tokens x features heatmap, shared by the PNG (:mod:`anatomy_cli.output.plots.sae`)
and the HTML page (:mod:`anatomy_cli.output.html.sae`): on real prompts the first token's activations (the
attention sink, about 3,600 against about 20 elsewhere on SmolLM2) would saturate a linear scale, so that
position is left out of it, clipped, and the caption says so."""

from __future__ import annotations

from dataclasses import dataclass

SINK_RATIO = 10.0  # position 0 above this many times every other position's largest activation: left out


@dataclass(frozen=True)
class ColourScale:
    """The heatmap's colour scale, 0 to ``top``; ``clipped``: the position left out of it (0, the attention
    sink, when it dwarfs the rest), its cells clipped at the top colour, ``clipped_max`` its largest value."""

    top: float
    clipped: int | None = None
    clipped_max: float = 0.0

    def note(self) -> str | None:
        """The caption's line saying what the scale leaves out (None when it leaves out nothing)."""
        if self.clipped is None:
            return None
        return (f"position {self.clipped}, the attention sink (max {self.clipped_max:.4g}, "
                f"{self.clipped_max / self.top:.0f}× the rest), is left out of the colour scale: clipped at its top")


def colour_scale(rows: list[list[float]]) -> ColourScale:
    """The colour scale of the tokens x features matrix ``rows`` ([pos][feature]): up to its largest value,
    or, when position 0's largest is over :data:`SINK_RATIO` times every later position's (the attention
    sink: about 3,600 against 20 on real prompts), up to the later positions' largest, position 0 clipped."""
    peaks = [max(row, default=0.0) for row in rows]
    top = max(peaks, default=0.0)
    rest = max(peaks[1:], default=0.0)
    if rest > 0 and peaks[0] > SINK_RATIO * rest:
        return ColourScale(rest, 0, peaks[0])
    return ColourScale(top if top > 0 else 1.0)
