"""`anatomy sae --plot` (the matrix drawn is the activations), `anatomy.sae` (its JSON is the command's), and
`generate --steer-feature` (the steered logits are a hand-written hook's adding C * W_dec[ID])."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_html import figure_data
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.engine.generate import greedy
from anatomy_cli.engine.generate import stop_ids
from anatomy_cli.engine.sae import Dictionary
from anatomy_cli.engine.sae import feature_vector
from anatomy_cli.models.sae.read import read
from anatomy_cli.tasks import generate as gen

FIXTURES = Path(__file__).parent / "fixtures" / "sae"
SAE = FIXTURES / "saelens-standard"            # blocks.1.hook_resid_post, d_sae 64
PROMPT = "The cat sat on the mat because"
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _hf(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


def test_plot_draws_the_activations_and_the_api_gives_the_command_s_json(tiny_model_dir, cached_load, tmp_path):
    import anatomy_cli as anatomy

    model_dir = tiny_model_dir("gpt2")
    args = ("sae", PROMPT, "--sae", SAE, "--model", model_dir, "--feature", "3", "--labels", FIXTURES / "labels",
            "--format", "json")
    result = invoke(*args, "--plot", tmp_path / "s.png")
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "s.png").stat().st_size > 0 and "wrote" in result.stderr
    data = json.loads(result.stdout)
    got = anatomy.sae(str(model_dir), PROMPT, sae=SAE, features=[3], labels=FIXTURES / "labels")
    assert got.to_dict() == data

    # the features, independently: the SAE's encode of transformers' block-1 output (before ln_f)
    hf, seen = _hf(model_dir), {}
    def keep(module, args, out):
        seen["x"] = (out[0] if isinstance(out, tuple) else out)[0]
    handle = hf.transformer.h[1].register_forward_hook(keep)
    with torch.no_grad():
        hf(torch.tensor([data["token_ids"]]))
    handle.remove()
    f = Dictionary(read(SAE)).encode(seen["x"]).numpy()
    listed = {r["feature"] for r in data["top_features"]} - {3}
    ids = [3, *sorted(listed, key=lambda i: (-f[:, i].max(), i))]
    assert got.plotted() == ids
    image = got.plot().axes[0].images[0].get_array()
    np.testing.assert_allclose(np.asarray(image), f[:, ids], atol=1e-5)

    assert invoke(*args, "--plot", tmp_path / "s.html").exit_code == 0
    (traces,) = figure_data(tmp_path / "s.html")
    np.testing.assert_allclose(np.array(traces[0]["z"]), f[:, ids], atol=1e-5)
    hover = traces[0]["customdata"][1][0].split("<br>")          # token 1, feature 3
    label = next((r["label"] for r in data["features"] if r["feature"] == 3), None)
    assert hover[0] == "feature 3"
    assert hover[-2:] == [f"activation: {f[1, 3]:.4f}", f"token 1: {data['tokens'][1]}"]
    assert (label is None) == (len(hover) == 3)


def test_an_attention_sink_does_not_saturate_the_heatmap(tiny_model_dir, cached_load, tmp_path):
    # issue 51 item 9: position 0 at about 3,600 against about 20 elsewhere (SmolLM2) made a linear colour scale
    # one bright row; the scale now ends at the later positions' largest, position 0 clipped, said in the caption
    import dataclasses

    import anatomy_cli as anatomy

    got = anatomy.sae(str(tiny_model_dir("gpt2")), PROMPT, sae=SAE, features=[3])
    act = got.result.activations.clone()
    act[0] = act[0] + 1000.0 * float(act[1:].max())     # a sink: position 0 dwarfs every other
    sink = dataclasses.replace(got.result, activations=act)
    ids = sink.plotted()
    later_max = float(act[1:, ids].max())
    assert later_max > 0
    fig = type(got)(got.command, sink, got.data, got.rows_key, (sink, *got.figure_args[1:])).plot()
    assert fig.axes[0].images[0].get_clim() == pytest.approx((0.0, later_max), rel=1e-6)
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "attention sink" in caption and "clipped" in caption
    fig.savefig(tmp_path / "sink.png")
    page = type(got)(got.command, sink, got.data, got.rows_key, (sink, *got.figure_args[1:])).plot(html=True)
    (tmp_path / "sink.html").write_text(page.render(), encoding="utf-8")
    (trace,) = figure_data(tmp_path / "sink.html")[0]
    assert trace["zmax"] == pytest.approx(later_max, rel=1e-6) and trace["zmin"] == 0
    assert "attention sink" in (tmp_path / "sink.html").read_text(encoding="utf-8")
    # without a sink the scale is the largest value, nothing clipped
    plain = got.plot()
    assert plain.axes[0].images[0].get_clim()[1] == pytest.approx(float(got.result.activations[:, ids].max()))
    assert "attention sink" not in " ".join(t.get_text() for t in plain.texts)


def _steered_logits(hf, ids, layer, add):
    def hook(module, args, out):
        return (out[0] + add, *out[1:]) if isinstance(out, tuple) else out + add
    handle = hf.transformer.h[layer].register_forward_hook(hook)
    try:
        with torch.no_grad():
            return hf(torch.tensor([ids])).logits[0, -1]
    finally:
        handle.remove()


def test_steer_feature_adds_c_times_the_decoder_row(tiny_model_dir, cached_load, tiny_lm):
    model_dir = tiny_model_dir("gpt2")
    base = ("generate", PROMPT, "--model", model_dir, "--max-new-tokens", "1", "--top", "5", "--format", "json")
    result = invoke(*base, "--steer-feature", "5", "--coef", "4", "--sae", SAE)
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["steer"] == {"file": str(SAE), "site": "resid_post", "layers": [1], "coef": [4.0], "feature": 5}
    row = torch.from_numpy(read(SAE).W_dec[5]).float()
    logits = _steered_logits(_hf(model_dir), data["token_ids"], 1, 4.0 * row)
    probs = torch.softmax(logits.double(), -1)
    top = probs.topk(5)
    step = data["steps"][0]
    assert [t["token_id"] for t in step["top"]] == top.indices.tolist()
    assert [t["probability"] for t in step["top"]] == pytest.approx(top.values.tolist(), rel=1e-5)
    # the whole logit vector, through generate's own steering path with the feature's vector
    lm = tiny_lm("gpt2")
    settings = gen.Settings(lambda: greedy, 1, 5, False, feature_vector(read(SAE), 5), stop_ids(lm))
    torch.testing.assert_close(gen.run_one(lm, data["token_ids"], settings, 4.0).logits[0].float(), logits,
                               atol=1e-5, rtol=1e-5)


def test_coef_0_is_plain_generation(tiny_model_dir, cached_load):
    model_dir = tiny_model_dir("gpt2")
    base = ("generate", PROMPT, "--model", model_dir, "--max-new-tokens", "3", "--format", "json")
    plain = json.loads(invoke(*base).stdout)
    zero = json.loads(invoke(*base, "--steer-feature", "5", "--coef", "0", "--sae", SAE).stdout)
    assert zero.pop("steer")["coef"] == [0.0] and plain.pop("steer") is None
    assert zero == plain


def _one_line(result, code, match):
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == code and len(lines) == 1 and match in lines[0], result.stderr


def test_steer_feature_refusals(tiny_model_dir, tmp_path):
    model = tiny_model_dir("gpt2")
    base = ("generate", "Hi", "--model", model, "--max-new-tokens", "1")
    _one_line(invoke(*base, "--steer-feature", "64", "--sae", SAE), 2, "out of range: the SAE has 64 features")
    _one_line(invoke(*base, "--steer-feature", "1"), 2, "--steer-feature ID and --sae PATH go together")
    z = tmp_path / "z"
    shutil.copytree(SAE, z)
    cfg = json.loads((z / "cfg.json").read_text())
    cfg["metadata"]["hook_name"] = "blocks.1.attn.hook_z"
    (z / "cfg.json").write_text(json.dumps(cfg))
    _one_line(invoke(*base, "--steer-feature", "1", "--sae", z), 2, "writes to blocks.1.attn.hook_z")
