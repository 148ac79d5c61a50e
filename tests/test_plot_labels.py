"""Pictures name tokens exactly as the tables do (issue 32, item 5): one display function for tokens."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.output import plots
from anatomy_cli.output.plots._text import token_label

runner = CliRunner()


def test_token_label_keeps_the_tables_spelling():
    assert token_label("<e6 88>") == "<e6 88>"
    assert token_label("·much") == "·much" and token_label("↵") == "↵"
    assert token_label("a b") == "a b"  # a piece is displayed already: not made visible twice


@pytest.mark.usefixtures("cached_load")
def test_lens_plot_labels_byte_pieces_like_the_table(tmp_path, tiny_model_dir, monkeypatch):
    saved = []
    real = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path, index=None: (saved.append(fig), real(fig, path, index))[1])
    result = runner.invoke(app, ["lens", "我爱你", "--model", str(tiny_model_dir("gpt2")), "--format", "json",
                                 "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.stderr
    tokens = json.loads(result.stdout)["tokens"]
    assert "<e6 88>" in tokens  # GPT-2 splits 我 (e6 88 91) into byte pieces
    labels = [t.get_text() for t in saved[0].axes[0].get_xticklabels()]
    assert labels == [token_label(t) for t in tokens]
    assert "<e6 88>" in labels and not any("·" in label for label in labels)


def _grid(target_id=None):
    import torch

    from anatomy_cli.analyses.lens import lens_grid

    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 20, generator=g)
    return lens_grid(torch.randn(3, 4, 8, generator=g), lambda h: h @ w, describe=lambda i: (f"·t{i}", f" t{i}"),
                     k=5, target_id=target_id)


@pytest.mark.parametrize("stat", ["prob", "logprob", "entropy", "kl", "rank"])
def test_png_and_html_name_each_lens_statistic_alike(stat):
    # One table of labels (output/statistics.py): the PNG's colour bar and the HTML's colour bar say the same.
    import html
    import re

    from anatomy_cli.analyses.lens import STATS
    from anatomy_cli.output import statistics
    from anatomy_cli.output.html import lens as html_lens
    from anatomy_cli.output.plots import lens as png_lens

    assert set(STATS) <= set(statistics.LENS)
    grid, tokens, cap = _grid(3 if stat == "rank" else None), ["a", "b", "c", "d"], plots.Caption("lens", "m", "p")
    fig = png_lens.figure(grid, stat, tokens, cap)
    png = fig.axes[-1].get_ylabel()  # the colour bar's axis
    page = html_lens.figure(grid, stat, tokens, cap).parts[0].html
    (heat,) = json.loads(re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*(\[.*?\]),\s*\{', page, re.S).group(1))
    assert png == html.unescape(heat["colorbar"]["title"]["text"]) == statistics.LENS[stat].label
    scale = heat["colorscale"][0][1]
    viridis_low = "#440154"  # viridis' dark end: bright = confident, for every statistic
    assert (scale == viridis_low) == statistics.LENS[stat].high_is_bright
    assert fig.axes[0].images[0].get_cmap().name.startswith(statistics.LENS[stat].cmap)


def test_png_and_html_name_each_head_score_alike():
    from anatomy_cli.output import statistics
    from anatomy_cli.output.html import heads as html_heads
    from anatomy_cli.output.plots import corpus
    from anatomy_cli.output.plots import heads

    assert set(heads.SCORES) == set(html_heads.SCORES) == set(statistics.HEADS)
    assert heads._LABELS == html_heads._LABELS == {k: s.label for k, s in statistics.HEADS.items()}
    assert [s for _, s in corpus.HEAD_SCORES] == [statistics.HEADS[k] for k in ("entropy", "first_token", "prev_token")]


@pytest.mark.parametrize("kind", ["logit", "jacobian", "tuned"])
def test_png_and_html_say_which_lens_each_cell_reads(kind):
    # A Jacobian lens grid once carried the logit lens' formula in its footer.
    import dataclasses

    from anatomy_cli.output.html import lens as html_lens
    from anatomy_cli.output.plots import lens as png_lens

    grid = dataclasses.replace(_grid(None), lens=kind)
    fig = png_lens.figure(grid, "prob", ["a", "b", "c", "d"], plots.Caption("lens", "m", "p"))
    footer = " ".join(t.get_text() for t in fig.texts)
    page = html_lens.figure(grid, "prob", ["a", "b", "c", "d"], plots.Caption("lens", "m", "p")).render()
    want = {"logit": "final_norm(h))) (the logit lens)", "jacobian": "final_norm(J_l h))) (the Jacobian lens)",
            "tuned": "final_norm(h + A_l h + b_l))) (the tuned lens)"}[kind]
    assert want in footer.replace("\n", " ")
    assert want in page
    others = {"logit lens", "Jacobian lens", "tuned lens"} - {want.rsplit("the ", 1)[1].rstrip(")")}
    assert not any(f"(the {o})" in footer or f"(the {o})" in page for o in others)
