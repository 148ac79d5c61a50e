"""`generate --plot` (the coefficient sweep; the --lens block x step grid) in PNG and HTML, and the API's
`anatomy.generate` / `anatomy.steer`, on a tiny llama: the numbers drawn are the command's JSON values, and
the API's to_dict() is the command's --format json."""

from __future__ import annotations

import json
import re

import pytest
import torch
from test_html import figure_data
from typer.testing import CliRunner

import anatomy_cli as anatomy
from anatomy_cli.cli.main import app
from anatomy_cli.engine.steering import SteeringVector
from anatomy_cli.engine.steering import save
from anatomy_cli.output import plots

runner = CliRunner()
PROMPT = "The capital of France is"


@pytest.fixture
def figures(monkeypatch):
    """The figures the command saved (still written by the real ``plots.save``)."""
    real, saved = plots.save, []

    def keep(fig, path, index=None):
        saved.append(fig)
        return real(fig, path, index)

    monkeypatch.setattr(plots, "save", keep)
    return saved


@pytest.fixture
def model(tiny_model_dir, cached_load):
    return str(tiny_model_dir("llama"))


def cli_json(*args):
    result = runner.invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_sweep_plot_png_and_html_are_the_sweep_and_the_api_is_the_cli(model, tmp_path, figures):
    vec = tmp_path / "v.safetensors"
    save(SteeringVector({1: torch.randn(32, generator=torch.Generator().manual_seed(0))},
                        meta={"model": {"model_type": "llama"}}), vec)
    args = ["--max-new-tokens", "2", "--steer", str(vec), "--target", " Paris"]
    data = cli_json("generate", PROMPT, "-m", model, *args, "--coef", "4,-4,0", "--plot", str(tmp_path / "s.png"))
    rows = sorted(data["sweep"], key=lambda r: r["coef"])
    shift_ax, kl_ax = figures[0].axes
    for ax, key in ((shift_ax, "target_shift"), (kl_ax, "kl")):
        line = ax.lines[0]
        assert list(line.get_xdata()) == [r["coef"] for r in rows]
        assert list(line.get_ydata()) == [r[key] for r in rows]
    assert "·Paris" in shift_ax.get_ylabel()

    r = anatomy.generate(model, PROMPT, max_new_tokens=2, steer=vec, target=" Paris", coef=[4, -4, 0])
    assert r.to_dict() == data and r.rows_key == "sweep"
    r.plot(html=True).write(tmp_path / "s.html")
    shift, kl = figure_data(tmp_path / "s.html")[0]
    assert shift["x"] == kl["x"] == [r["coef"] for r in rows]
    assert shift["y"] == [r["target_shift"] for r in rows] and kl["y"] == [r["kl"] for r in rows]

    bad = runner.invoke(app, ["generate", PROMPT, "-m", model, "--plot", str(tmp_path / "x.png")])
    assert bad.exit_code == 2 and bad.output.strip().splitlines()[-1].startswith("error: --plot draws")


def test_lens_grid_png_and_html_are_the_steps_and_the_api_is_the_cli(model, tmp_path, figures):
    from anatomy_cli.output.plots._text import token_label

    data = cli_json("generate", PROMPT, "-m", model, "--max-new-tokens", "4", "--lens",
                    "--plot", str(tmp_path / "g.html"))
    steps = data["steps"]
    grid = [[st["lens"][b] for st in steps] for b in range(len(steps[0]["lens"]))]  # [blocks][steps]
    (heat,) = figure_data(tmp_path / "g.html")[0]
    assert heat["z"] == grid
    # issue 51 item 9: the cells the footer calls framed are framed, not shaded (the simple_white template's
    # shape defaults fill a rectangle black at opacity 0.3 unless the shape says otherwise)
    page = (tmp_path / "g.html").read_text(encoding="utf-8")
    layout = json.loads(re.search(r'Plotly\.newPlot\(\s*"[^"]+",\s*\[.*?\],\s*(\{.*?\}),\s*\{"displaylogo"',
                                  page, re.S).group(1))
    shapes = layout["shapes"]
    assert {(round(sh["x0"] + 0.5), round(sh["y0"] + 0.5)) for sh in shapes} == \
        {(s, st["first_top1_layer"]) for s, st in enumerate(steps) if st["first_top1_layer"] is not None}
    defaults = layout["template"]["layout"].get("shapedefaults", {})
    for sh in shapes:
        fill = sh.get("fillcolor", defaults.get("fillcolor"))
        assert fill == "rgba(0,0,0,0)" or sh.get("opacity", defaults.get("opacity", 1)) == 0, sh
        assert sh["line"]["width"] > 0
    assert "framed: the first block" in page

    r = anatomy.generate(model, PROMPT, max_new_tokens=4, lens=True)
    assert r.to_dict() == data and r.rows_key == "steps" and r.text == data["continuation"]
    fig = r.plot()
    ax = fig.axes[0]
    assert ax.images[0].get_array().tolist() == grid
    assert [t.get_text() for t in ax.get_xticklabels()] == [token_label(st["token"]) for st in steps]
    framed = {(round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in ax.patches}
    assert framed == {(s, st["first_top1_layer"]) for s, st in enumerate(steps) if st["first_top1_layer"] is not None}


def test_the_lens_grid_caption_stays_inside_the_picture(model, tmp_path):
    # issue 61 item 10: docs/img/generate-lens.png's first footer line ran off the right edge; a long note now
    # wraps between words to the figure's width, every word of it kept
    from anatomy_cli.output.plots.generate import LENS_NOTE

    fig = anatomy.generate(model, PROMPT, max_new_tokens=3, lens=True).plot()
    fig.savefig(tmp_path / "g.png")  # lays the figure out as the file does
    renderer = fig.canvas.get_renderer()
    for t in fig.texts:
        box = t.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1, (t.get_text(), box.x1, fig.bbox.x1)
    footer = sorted((t for t in fig.texts if t.get_position()[1] < 0.5), key=lambda t: -t.get_position()[1])
    assert len(footer) > 2  # the note took more than one line
    assert LENS_NOTE in " ".join(t.get_text() for t in footer)  # top line first


def test_steer_api_is_the_cli(model, tmp_path):
    pairs = ["--positive", "I love this", "--positive", "What a joy", "--negative", "I hate this",
             "--negative", "What a pain"]
    data = cli_json("steer", "-m", model, *pairs, "--layer", "1", "--method", "pca")
    r = anatomy.steer(model, positive=["I love this", "What a joy"], negative=["I hate this", "What a pain"], layer=1, method="pca")
    assert r.to_dict() == data
    assert r.vector.layers == [1] and float(r.directions[0].vector.norm()) == pytest.approx(1.0)
