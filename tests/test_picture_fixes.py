"""Pictures that read (issue 42, item 8), asserted on the figure objects: the corpus picture's legends below their
panels, its KL axis logarithmic, its ± SE drawn so it shows (band opacity, error bars) and no empty panel; the
diff weights picture without a column that is blank in every block (named in the footer instead); plotly's
toolbar (top right, about 30 px high) clear of the `heads` buttons and of the `dla` panel titles; `attn` pages
naming the shown head once."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from anatomy_cli.output.plots import Caption

MODEBAR_PX = 36  # plotly's toolbar: its buttons sit in the top 30-odd pixels of the figure


def corpus_stats(heads: bool = True) -> SimpleNamespace:
    """A 4-block model's corpus figures: KL falling by orders of magnitude from the embedding, small SEs."""
    kl = [8.0, 0.9, 0.2, 0.04, 0.0]
    layers = [{"layer": l, "kl_nats": kl[l], "kl_nats_se": kl[l] / 50, "ce_bits": 12.0 - l, "ce_bits_se": 0.01,
               "resid_norm": 3.0 + 4 * l, "resid_norm_se": 0.05, "max_abs": 20.0 * (l + 1)} for l in range(5)]
    rows = [{"layer": l, "head": h, "entropy_nats": 1.0 + h, "first_token": 0.5, "prev_token": 0.1}
            for l in range(4) for h in range(2)] if heads else []
    return SimpleNamespace(layers=tuple(layers), lenses=(), heads=tuple(rows), windows=12, tokens=1200, loss_bits=8.0,
                           perplexity=256.0)


@pytest.mark.parametrize("heads", [True, False])
def test_corpus_legends_below_log_kl_visible_se_no_empty_panel(heads):
    from matplotlib.collections import PolyCollection

    from anatomy_cli.output.plots import corpus

    fig = corpus.figure(corpus_stats(heads), Caption("corpus", "tiny", None, "docs · 1,200 tokens"))
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    curves = [ax for ax in fig.axes if ax.lines]
    assert len(curves) == 3
    for ax in curves:
        legend = ax.get_legend()
        assert legend is not None
        assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0  # below the panel
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert bands and all(c.get_alpha() >= 0.3 for c in bands)
        assert ax.containers  # error bars with caps at every point, so a narrow band still shows
    kl = curves[0]
    assert "KL" in kl.get_ylabel() and kl.get_yscale() == "log"
    assert all(ax.get_visible() for ax in fig.axes)
    assert all(ax.lines or ax.images or ax.collections for ax in fig.axes)  # no empty panel


def weights_diff(norm_change: float) -> SimpleNamespace:
    rows = [SimpleNamespace(layer=l, component=c, rel_change=v)
            for l in range(3) for c, v in (("attention", 0.006), ("ffn", 0.005), ("norm_other", norm_change))]
    rows += [SimpleNamespace(layer=None, component="token_embedding", rel_change=0.0)]
    return SimpleNamespace(rows=rows, total=SimpleNamespace(rel_change=0.005, cosine=0.99998))


def _footer(fig) -> str:
    return "\n".join(t.get_text() for t in fig.texts)


def test_diff_weights_drops_a_column_blank_in_every_block_and_says_why():
    from anatomy_cli.output.plots import diff

    fig = diff.weights_figure(weights_diff(0.0), Caption("diff", "A vs B", None, "weights"))
    heat, lines = fig.axes[0], fig.axes[1]
    assert [t.get_text() for t in heat.get_xticklabels()] == ["attention", "FFN"]
    assert [ln.get_label() for ln in lines.get_lines()] == ["attention", "FFN"]
    assert "norms + other: unchanged in every block" in _footer(fig)
    kept = diff.weights_figure(weights_diff(1e-4), Caption("diff", "A vs B", None, "weights"))
    assert [t.get_text() for t in kept.axes[0].get_xticklabels()] == ["attention", "FFN", "norms + other"]
    assert "unchanged in every block" not in _footer(kept)


def _top_px(layout, y_paper: float) -> float:
    """Pixels from the figure's top edge to paper y ``y_paper`` (1 = the plot area's top)."""
    plot_h = layout["height"] - layout["margin"]["t"] - layout["margin"]["b"]
    return layout["margin"]["t"] - (y_paper - 1) * plot_h


def _figure_json(part_html: str) -> dict:
    import json

    return json.loads(re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*(\{.*?\})\s*,\s*\{\"displaylogo",
                                part_html, re.S).group(2))


def test_heads_buttons_and_title_sit_below_plotlys_toolbar():
    from anatomy_cli.output.html import heads

    rows = [SimpleNamespace(layer=l, head=h, entropy=1.0, first_token=0.2, prev_token=0.1, induction=0.0,
                            duplicate_token=0.0) for l in range(2) for h in range(2)]
    result = SimpleNamespace(rows=rows, sort=None, n_heads_total=4, measured_on="prompt", seq_len=50, seed=0)
    layout = _figure_json(heads.part(result, 2, 2).html)
    [menu] = layout["updatemenus"]
    assert menu["yanchor"] == "top"
    buttons_top = _top_px(layout, menu["y"])
    assert buttons_top >= MODEBAR_PX  # the whole row of buttons is under the toolbar's band
    assert buttons_top + 30 <= layout["margin"]["t"]  # ... and above the plot
    title = layout["title"]
    assert title["yref"] == "container" and title["yanchor"] == "top"
    assert (1 - title["y"]) * layout["height"] + 22 <= buttons_top  # the title above the buttons, not under them
    assert title["xanchor"] == "left" and title["x"] < 0.2  # left, where the (right-aligned) toolbar is not


def test_dla_panel_titles_sit_below_plotlys_toolbar():
    from anatomy_cli.output.html import dla

    rows = [SimpleNamespace(component="embed", contribution=0.1, layer=None, head=None)]
    rows += [SimpleNamespace(component=f"L{l}.mlp", contribution=0.2, layer=l, head=None) for l in range(2)]
    rows += [SimpleNamespace(component=f"L{l}.H{h}", contribution=0.1, layer=l, head=h)
             for l in range(2) for h in range(2)]
    layout = _figure_json(dla.part(SimpleNamespace(rows=rows), 2, 2, "logit(·Berlin)").html)
    titles = [a for a in layout["annotations"] if a.get("yref") == "paper" and a.get("y") == 1]
    assert len(titles) == 3
    assert all(a["yanchor"] == "bottom" for a in titles)  # each sits on the plot area's top edge, ~20 px high
    assert _top_px(layout, 1) - 22 >= MODEBAR_PX


def test_attn_page_names_the_shown_head_once():
    import torch

    from anatomy_cli.output.html import attn

    patterns = torch.softmax(torch.randn(2, 2, 3, 3), -1)
    cap = Caption("attn", "tiny", "a b c", "layer 0 head 0")
    page = attn.figure(patterns, ["a", "·b", "·c"], cap, causal=False)
    body = "".join(part.html for part in page.parts)  # the page without plotly.js
    static = re.sub(r"<script.*?</script>", "", body, flags=re.S)
    assert "layer 0 head 0" not in " ".join(page.lines) + static  # the caption line does not repeat it ...
    assert "R.textContent = title();" in body  # ... the line under the pickers says it (and follows them) ...
    assert "'title.text'" not in body and '"title":{"text":"layer' not in body.replace(" ", "")  # ... no plot title
