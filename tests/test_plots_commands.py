"""`--plot FILE` on every command, on tiny models: the file is written in the format its suffix names,
and the numbers read back from the matplotlib figure (image arrays, line data, bar heights) are the
command's own JSON values. Each command is run once with ``--format json --plot``.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from test_plots import file_type
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.output import plots

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("cached_load")  # each tiny model loads once
PROMPT = "Thank you very"


@pytest.fixture
def figures(monkeypatch):
    """The figures the command saved, in order (still written to disk by the real ``plots.save``)."""
    real = plots.save
    saved = []

    def save(fig, path, index=None):
        saved.append(fig)
        return real(fig, path, index)

    monkeypatch.setattr(plots, "save", save)
    return saved


def run_json(*args, input=None):
    result = runner.invoke(app, [*args, "--format", "json"], input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout), result


def nan_to_none(values):
    return [None if (isinstance(v, float) and math.isnan(v)) else float(v) for v in values]


def close(a, b, tol=1e-9):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        if x is None or y is None:
            assert x is None and y is None, (a, b)
        else:
            assert abs(x - y) <= tol * max(1, abs(y)), (a, b)


# ---------------------------------------------------------------- params, trace, drift

def test_params_bars_are_the_rows(tmp_path, figures):
    data, result = run_json("params", "--plot", str(tmp_path / "p.png"))
    assert file_type(tmp_path / "p.png") == ".png"
    assert result.stderr.strip().splitlines()[-1] == f"wrote {tmp_path / 'p.png'}"
    ax = figures[0].axes[0]
    widths = [bar.get_width() for bar in ax.patches]
    assert widths == [row["parameters"] for row in data["rows"]]
    assert sum(widths) == data["total"] == 124_439_808
    assert [t.get_text() for t in ax.get_yticklabels()] == [row["label"] for row in data["rows"]]


def test_params_per_layer_stacks_each_block(tmp_path, figures):
    data, _ = run_json("params", "--per-layer", "--plot", str(tmp_path / "p.svg"))
    assert file_type(tmp_path / "p.svg") == ".svg"
    ax = figures[0].axes[1]
    per_block: dict[int, float] = {}
    for bar in ax.patches:  # stacked: each block's segments share its y
        block = round(bar.get_y() + bar.get_height() / 2)
        per_block[block] = per_block.get(block, 0) + bar.get_width()
    assert per_block == {layer["index"]: layer["total"] for layer in data["layers"]}


def test_trace_lines_are_the_json_columns(tmp_path, tiny_model_dir, figures):
    data, _ = run_json("trace", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--plot", str(tmp_path / "t.pdf"))
    assert file_type(tmp_path / "t.pdf") == ".pdf"
    top, bottom = figures[0].axes[:2]
    rows = data["layers"]
    for line, key in zip(top.lines, ("cos_to_embedding", "cos_to_previous")):
        assert list(line.get_xdata()) == list(range(len(rows)))  # one x per row, labelled embed, 0, 1, ...
        close(nan_to_none(line.get_ydata()), [r[key] for r in rows])
    for line, key in zip(bottom.lines, ("resid_norm", "attn_norm", "mlp_norm")):
        close(nan_to_none(line.get_ydata()), [r[key] for r in rows])
    assert [t.get_text() for t in bottom.get_xticklabels()] == [str(r["layer"]) for r in rows] == ["embed", "0", "1"]
    lens_axis = top.child_axes[0]  # the secondary x axis along the top: the lens's top tokens
    labels = {round(t.get_position()[0]): t.get_text() for t in lens_axis.get_xticklabels()}
    from anatomy_cli.output.plots._base import token_label

    assert labels and all(labels[l] == token_label(rows[l]["lens_token"]) for l in labels)
    assert "trace · " in figures[0]._suptitle.get_text() and "'Thank you very'" in figures[0]._suptitle.get_text()


def test_drift_lines_and_baseline_band(tmp_path, tiny_model_dir, figures):
    model = str(tiny_model_dir("gpt2"))
    args = ["drift", "bank", "-c", "I paid at the bank.", "-c", "We swam to the bank.", "-c", "The bank closed.",
            "--matrix", "1", "--model", model, "--plot", str(tmp_path / "d.png")]
    data, _ = run_json(*args)
    ax, matrix_ax = figures[0].axes[:2]
    pairs = data["pairs"]
    for line, pair in zip(ax.lines, pairs):
        close(nan_to_none(line.get_ydata()), pair["similarity"])
    close(nan_to_none(ax.lines[len(pairs)].get_ydata()), [r["similarity"] for r in data["layers"]])
    close(nan_to_none(ax.lines[len(pairs) + 1].get_ydata()), [r["baseline"] for r in data["layers"]])
    band = ax.collections[0].get_paths()[0].vertices[:, 1]
    by_context = np.array(data["baseline_by_context"])
    assert band.min() == pytest.approx(by_context.min()) and band.max() == pytest.approx(by_context.max())
    image = matrix_ax.images[0].get_array()
    assert np.allclose(image, np.array(data["matrix"]["values"]))


# ---------------------------------------------------------------- batches, bad paths, same bytes, untrained

def test_a_stdin_batch_writes_one_numbered_file_per_prompt(tmp_path, tiny_model_dir, figures):
    data, result = run_json("trace", "-", "--model", str(tiny_model_dir("gpt2")), "--plot", str(tmp_path / "t.png"),
                            input="Thank you very\nThe capital of\n")
    assert len(data["results"]) == 2 == len(figures)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t-1.png", "t-2.png"]
    assert [line for line in result.stderr.splitlines() if line.startswith("wrote ")] == \
        [f"wrote {tmp_path / 't-1.png'}", f"wrote {tmp_path / 't-2.png'}"]
    assert "'The capital of'" in figures[1]._suptitle.get_text()


@pytest.mark.parametrize("command", [
    ["params"], ["trace", PROMPT], ["drift", "bank"], ["lens", PROMPT], ["attn", PROMPT], ["heads"],
    ["dla", PROMPT, "--target", " much"], ["ablate", PROMPT, "--target", " much"],
    ["patch", "Thank you very", "Thank you so", "--target", " much"],
])
def test_bad_plot_paths_fail_before_the_model_loads(tmp_path, tiny_model_dir, monkeypatch, command, fixed_load):
    if command[0] not in {c.name for c in app.registered_commands}:
        pytest.skip(f"no {command[0]} command")
    from anatomy_cli.analyses import params as params

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    fixed_load(never)
    monkeypatch.setattr(params, "analyse", never)
    extra = [] if command[0] == "params" else ["--model", str(tiny_model_dir("gpt2"))]
    result = runner.invoke(app, [*command, *extra, "--plot", str(tmp_path / "out.jpg")])
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip() == (f"error: --plot '{tmp_path / 'out.jpg'}': the suffix chooses the format and "
                                     "must be .png, .svg, .pdf or .html ('.jpg')")
    result = runner.invoke(app, [*command, *extra, "--plot", str(tmp_path / "nowhere" / "out.png")])
    assert result.exit_code == 1, result.stderr
    assert result.stderr.strip() == (f"error: cannot write --plot '{tmp_path / 'nowhere' / 'out.png'}': the "
                                     f"directory '{tmp_path / 'nowhere'}' does not exist")


def test_two_svg_runs_are_byte_identical(tmp_path, tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    for name in ("a.svg", "b.svg"):
        result = runner.invoke(app, ["trace", PROMPT, "--model", model, "--plot", str(tmp_path / name)])
        assert result.exit_code == 0, result.stderr
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_random_weights_are_labelled_in_the_picture(tmp_path, tiny_model_dir, figures):
    run_json("trace", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--init", "random",
             "--plot", str(tmp_path / "r.png"))
    assert "untrained (random weights)" in [t.get_text() for t in figures[0].texts]


# ---------------------------------------------------------------- lens, attn, heads, dla, ablate, patch

def image(ax):
    """The heatmap's values as a float array, blank (masked or NaN) cells as NaN."""
    return np.ma.filled(ax.images[0].get_array().astype(float), np.nan)


@pytest.mark.parametrize("stat, key", [("prob", "probability"), ("kl", "kl"), ("rank", "target_rank")])
def test_lens_heatmap_is_the_cells(tmp_path, tiny_model_dir, figures, stat, key):
    data, _ = run_json("lens", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--stat", stat, "--target", " much",
                       "--plot", str(tmp_path / "l.png"))
    ax = figures[0].axes[0]
    layers, positions = data["layers"], data["positions"]
    expected = np.array([c[key] for c in data["cells"]], dtype=float).reshape(len(layers), len(positions))
    assert np.allclose(image(ax), expected, rtol=1e-12, atol=0)
    from anatomy_cli.output.plots._base import drawable

    texts = {(round(t.get_position()[1]), round(t.get_position()[0])): t.get_text() for t in ax.texts}
    for c in data["cells"]:  # each cell names its top token (cut with "…" only when too long)
        shown = texts[(layers.index(c["layer"]), positions.index(c["position"]))]
        assert shown == drawable(c["token"]) or shown.endswith("…")
    assert [t.get_text() for t in ax.get_xticklabels()] == [drawable(data["tokens"][p]) for p in positions]


def test_attn_one_head_is_the_pattern(tmp_path, tiny_model_dir, figures):
    data, _ = run_json("attn", PROMPT, "--model", str(tiny_model_dir("llama")), "--layer", "1", "--head", "2",
                       "--plot", str(tmp_path / "a.svg"))
    assert file_type(tmp_path / "a.svg") == ".svg"
    values = image(figures[0].axes[0])
    n = len(data["tokens"])
    expected = np.full((n, n), np.nan)
    for w in data["weights"]:
        expected[w["query_position"], w["key_position"]] = w["weight"]
    assert np.allclose(values, expected, equal_nan=True, atol=1e-7)
    assert np.isnan(values[0, 1]) and np.allclose(np.nansum(values, axis=1), 1, atol=1e-6)  # causal: blank above


def test_attn_every_head_of_every_layer(tmp_path, tiny_model_dir, figures):
    data, _ = run_json("attn", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--plot", str(tmp_path / "a.png"))
    panels = [ax for ax in figures[0].axes if ax.images and ax.get_visible()]
    assert len(panels) == data["n_layers"]
    for layer, ax in zip(data["layers"], panels):
        expected = np.full((data["n_heads"], len(data["tokens"])), np.nan)
        for w in data["weights"]:
            if w["layer"] == layer:
                expected[w["head"], w["key_position"]] = w["weight"]
        assert np.allclose(image(ax), expected, equal_nan=True, atol=1e-7)


@pytest.mark.parametrize("args", [[], ["--sort", "induction", "--top", "3"]])
def test_heads_heatmaps_are_the_scores(tmp_path, tiny_model_dir, figures, args):
    data, _ = run_json("heads", "--model", str(tiny_model_dir("gpt2")), "--seq-len", "8", *args,
                       "--plot", str(tmp_path / "h.png"))
    panels = [ax for ax in figures[0].axes if ax.images]
    scores = ["induction"] if args else ["entropy", "first_token", "prev_token", "induction", "duplicate_token"]
    assert [ax.get_title() for ax in panels] == scores
    for ax, score in zip(panels, scores):
        expected = np.full((data["n_layers"], data["n_heads"]), np.nan)
        for h in data["heads"]:
            expected[h["layer"], h["head"]] = h[score]
        shown = np.isfinite(expected)
        assert np.allclose(image(ax)[shown], expected[shown], atol=1e-7)
    if args:  # --top 3: every head is coloured, the three best are framed (issue 32, item 6)
        assert np.isfinite(image(panels[0])).all()
        frames = [(round(p.get_x() + 0.5), round(p.get_y() + 0.5)) for p in panels[0].patches if p.get_label()]
        assert frames == [(h["head"], h["layer"]) for h in data["heads"]]


def _bars(container) -> list[float]:
    return [math.nan if math.isnan(b.get_height()) else b.get_height() for b in container]


def test_dla_bars_are_the_rows(tmp_path, tiny_model_dir, figures):
    data, _ = run_json("dla", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--target", " much",
                       "--plot", str(tmp_path / "d.png"))
    rows = {r["component"]: r["contribution"] for r in data["rows"]}
    side, ax = figures[0].axes[:2]
    outside = [r for r in data["rows"] if r["layer"] is None]
    assert _bars(side.containers[0]) == pytest.approx([r["contribution"] for r in outside])
    n = data["n_layers"] if "n_layers" in data else len({r["layer"] for r in data["rows"] if r["layer"] is not None})
    assert _bars(ax.containers[0]) == pytest.approx([rows[f"L{l}.attn"] for l in range(n)])
    assert _bars(ax.containers[1]) == pytest.approx([rows[f"L{l}.mlp"] for l in range(n)])
    total = sum(_bars(side.containers[0])) + sum(_bars(ax.containers[0])) + sum(_bars(ax.containers[1]))
    assert total == pytest.approx(data["total"]) and total == pytest.approx(data["logit"], rel=1e-4)


def test_dla_by_head_heatmap(tmp_path, tiny_model_dir, figures):
    data, _ = run_json("dla", PROMPT, "--model", str(tiny_model_dir("llama")), "--target", " much", "--foil", " so",
                       "--by", "head", "--plot", str(tmp_path / "d.png"))
    heatmap_ax = next(ax for ax in figures[0].axes if ax.images)
    values = image(heatmap_ax)
    for r in data["rows"]:
        if r["head"] is not None:
            assert values[r["layer"], r["head"]] == pytest.approx(r["contribution"])
    assert np.isfinite(values).sum() == sum(r["head"] is not None for r in data["rows"])


@pytest.mark.parametrize("heads", [False, True])
def test_ablate_bars_or_heads_are_the_effects(tmp_path, tiny_model_dir, figures, heads):
    data, _ = run_json("ablate", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--target", " much",
                       *(["--heads"] if heads else []), "--plot", str(tmp_path / "a.png"))
    ax = figures[0].axes[0]
    if heads:
        values = image(ax)
        for r in data["rows"]:
            assert values[r["layer"], r["head"]] == pytest.approx(r["effect"])
    else:
        effect = {(r["layer"], r["component"]): r["effect"] for r in data["rows"]}
        layers = sorted({r["layer"] for r in data["rows"]})
        assert _bars(ax.containers[0]) == pytest.approx([effect[(l, "attn")] for l in layers])
        assert _bars(ax.containers[1]) == pytest.approx([effect[(l, "mlp")] for l in layers])


def test_patch_heatmap_is_the_normalized_cells(tmp_path, tiny_model_dir, figures):
    data, _ = run_json("patch", "Thank you very", "Thank you so", "--target", " much", "--foil", " so",
                       "--model", str(tiny_model_dir("gpt2")), "--plot", str(tmp_path / "p.png"))
    ax = figures[0].axes[0]
    values = image(ax)
    layers = sorted({c["layer"] for c in data["cells"]})
    for c in data["cells"]:
        expected = np.nan if c["value"] is None else c["value"]
        assert np.allclose(values[layers.index(c["layer"]), c["position"]], expected, equal_nan=True)
    low, high = ax.images[0].get_clim()
    assert low == -high  # diverging, centred at 0
    assert ax.get_xticklabels()[2].get_text() == "·very→·so"
