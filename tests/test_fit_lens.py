"""`anatomy fit-lens jacobian` (issue 48): jlens' estimator against a brute-force ``torch.autograd.functional.jacobian``
through the transformers model's own layers (hooks on the HF modules, not anatomy's), on a tiny random LLaMA."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

runner = CliRunner()
D, LAYERS = 32, 2
TEXT = "The quick brown fox jumps over the lazy dog because it was tired of running in the sun"


def _brute_force(lm, ids, source, target, skip_first):
    """J[d, :] = mean over valid p of Σ_{valid p'} ∂h_target[p', d] / ∂h_source[p, :], from the full Jacobian of
    the map (block source's output) -> (block target's output), the rest of the forward fixed."""
    model = lm.model
    layers = model.model.layers
    x = torch.tensor([ids])
    kept: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(m, i, o):
            kept[name] = o[0] if isinstance(o, tuple) else o
        return hook

    h = layers[source].register_forward_hook(record("source"))
    with torch.no_grad():
        model(x)
    h.remove()
    h_source = kept["source"][0].detach()

    def f(value):
        def replace(m, i, o):
            return (value[None],) + tuple(o[1:]) if isinstance(o, tuple) else value[None]
        handles = [layers[source].register_forward_hook(replace), layers[target].register_forward_hook(record("t"))]
        try:
            model(x)
        finally:
            for handle in handles:
                handle.remove()
        return kept["t"][0]

    full = torch.autograd.functional.jacobian(f, h_source)          # [pos, d, pos, d]
    valid = list(range(skip_first, len(ids) - 1))
    return full[valid][:, :, valid].sum(0).mean(1)                  # [d_out, d_in]


def test_a_fit_on_one_prompt_equals_the_brute_force_jacobian(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    out = tmp_path / "lens.pt"
    r = api.fit_lens(lm, "jacobian", [TEXT], out=out, skip_first=4, dim_batch=5, dtype="fp32")
    state = torch.load(out, weights_only=True)
    assert sorted(state) == ["J", "d_model", "n_prompts", "prompt_hashes", "source_layers"]  # jlens' keys + ours
    assert state["n_prompts"] == 1 and state["source_layers"] == [0] and state["d_model"] == D
    assert state["J"][0].dtype == torch.float32 and r.result.n_prompts == 1 and r.result.skipped == 0
    ids = api.lens(lm, TEXT).data["token_ids"]
    ref = _brute_force(lm, ids, 0, LAYERS - 1, 4)
    torch.testing.assert_close(state["J"][0], ref, atol=1e-5, rtol=1e-4)


def test_two_prompts_average_and_short_ones_are_skipped(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    other = "Once upon a time there was a small village at the edge of a dark forest"
    out = tmp_path / "two.pt"
    r = api.fit_lens(lm, "jacobian", [TEXT, "Too short", other], out=out, skip_first=4, dtype="fp16")
    assert (r.result.n_prompts, r.result.skipped) == (2, 1)
    state = torch.load(out, weights_only=True)
    assert state["J"][0].dtype == torch.float16
    refs = [_brute_force(lm, api.lens(lm, t).data["token_ids"], 0, LAYERS - 1, 4) for t in (TEXT, other)]
    torch.testing.assert_close(state["J"][0].float(), (refs[0] + refs[1]) / 2, atol=2e-3, rtol=2e-3)
    # the file reads back through lens --lens
    grid = api.lens(lm, TEXT, lens=f"jacobian:{out}").result
    assert grid.layers == (0, 1)


def test_the_cli_prints_the_cost_and_refuses_bad_settings(tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("llama"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(TEXT + "\n\nshort\n")
    out = tmp_path / "cli.pt"
    res = runner.invoke(app, ["fit-lens", "jacobian", "--model", model, "--prompts", str(prompts), "--out", str(out),
                              "--skip-first", "4", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "backward passes per prompt: about" in res.output and "1 prompt skipped" in res.output
    assert torch.load(out, weights_only=True)["n_prompts"] == 1
    for args, message in [
        (["--out", str(out)], "exists: give --overwrite"),
        (["--out", str(tmp_path / "x.pt"), "--target-layer", "0"], "leaves no block below it"),
        (["--out", str(tmp_path / "x.pt"), "--source-layers", "1"], "must be below the target block 1"),
        (["--out", str(tmp_path / "x.pt"), "--dtype", "bf16"], "use fp16"),
    ]:
        res = runner.invoke(app, ["fit-lens", "jacobian", "--model", model, "--prompts", str(prompts), *args])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
    res = runner.invoke(app, ["fit-lens", "tuned", "--model", model, "--prompts", str(prompts), "--out", "y"])
    assert res.exit_code == 2 and "reads --corpus PATH, not prompts" in res.output
    res = runner.invoke(app, ["fit-lens", "logit", "--model", model, "--prompts", str(prompts), "--out", "y"])
    assert res.exit_code == 2 and "anatomy fits jacobian, tuned lenses" in res.output
    with pytest.raises(UsageError):
        api.fit_lens(model, "jacobian", [TEXT], out=tmp_path / "z.pt", skip_first=40)


def test_merging_two_fits_equals_one_fit_on_the_whole(tiny_lm, tiny_model_dir, tmp_path):
    lm = tiny_lm("llama")
    texts = [TEXT, "Once upon a time there was a small village at the edge of a dark forest",
             "In the beginning the universe was created and this has made a lot of people very angry"]
    kw = dict(skip_first=4, dim_batch=16, dtype="fp32", source_layers=[0])
    api.fit_lens(lm, "jacobian", texts[:1], out=tmp_path / "a.pt", **kw)
    api.fit_lens(lm, "jacobian", texts[1:], out=tmp_path / "b.pt", **kw)
    api.fit_lens(lm, "jacobian", texts, out=tmp_path / "whole.pt", **kw)
    res = runner.invoke(app, ["fit-lens", "merge", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"),
                              "--out", str(tmp_path / "merged.pt"), "--dtype", "fp32", "--format", "json"])
    assert res.exit_code == 0, res.output
    merged, whole = (torch.load(tmp_path / f, weights_only=True) for f in ("merged.pt", "whole.pt"))
    assert merged["n_prompts"] == whole["n_prompts"] == 3 and merged["source_layers"] == [0]
    torch.testing.assert_close(merged["J"][0], whole["J"][0], atol=1e-6, rtol=1e-6)
    r = api.merge_lenses([tmp_path / "a.pt", tmp_path / "b.pt"], out=tmp_path / "api.pt", dtype="fp32")
    assert r.data["n_prompts"] == 3 and [i["n_prompts"] for i in r.data["inputs"]] == [1, 2]
    assert torch.equal(torch.load(tmp_path / "api.pt", weights_only=True)["J"][0], merged["J"][0])
    wide = tmp_path / "wide.pt"
    torch.save({"J": {0: torch.eye(64)}, "n_prompts": 1, "source_layers": [0], "d_model": 64}, wide)
    for args, message in [([str(tmp_path / "a.pt")], "two or more lens files"),
                          ([str(tmp_path / "a.pt"), str(wide)], "fits of different shapes"),
                          ([str(tmp_path / "a.pt"), str(tmp_path / "nope.pt")], "does not exist")]:
        res = runner.invoke(app, ["fit-lens", "merge", *args, "--out", str(tmp_path / "m2.pt")])
        assert res.exit_code == 2 and message in res.output, (args, res.output)


def test_an_interrupted_fit_resumes_from_its_checkpoint(tiny_lm, tmp_path, monkeypatch):
    from anatomy_cli.engine import jacobian_fit

    lm = tiny_lm("llama")
    texts = [TEXT, "short", "Once upon a time there was a small village at the edge of a dark forest",
             "In the beginning the universe was created and this has made a lot of people very angry"]
    kw = dict(skip_first=4, dim_batch=16, dtype="fp32", source_layers=[0])
    api.fit_lens(lm, "jacobian", texts, out=tmp_path / "whole.pt", **kw)
    real = jacobian_fit.jacobian_for_prompt
    calls = []

    def dies_on_the_third(*args, **kwargs):  # call 1 is the cost line's probe (a forward and three passes)
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    ckpt = tmp_path / "fit.ckpt"
    monkeypatch.setattr(jacobian_fit, "jacobian_for_prompt", dies_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        api.fit_lens(lm, "jacobian", texts, out=tmp_path / "resumed.pt", checkpoint=ckpt, **kw)
    state = torch.load(ckpt, weights_only=True)
    assert (state["n_done"], state["next_idx"], state["skipped"]) == (2, 3, 1)
    assert not (tmp_path / "resumed.pt").exists()
    monkeypatch.setattr(jacobian_fit, "jacobian_for_prompt", real)
    r = api.fit_lens(lm, "jacobian", texts, out=tmp_path / "resumed.pt", checkpoint=ckpt, **kw)
    assert (r.result.n_prompts, r.result.skipped) == (3, 1)
    resumed, whole = (torch.load(tmp_path / f, weights_only=True) for f in ("resumed.pt", "whole.pt"))
    torch.testing.assert_close(resumed["J"][0], whole["J"][0], atol=1e-7, rtol=1e-6)
    # the lens reader recognises a checkpoint; a resume with other settings is refused
    with pytest.raises(UsageError, match="a fit checkpoint"):
        api.lens(lm, TEXT, lens=f"jacobian:{ckpt}")
    with pytest.raises(UsageError, match="other settings \\(skip_first\\)"):
        api.fit_lens(lm, "jacobian", texts, out=tmp_path / "other.pt", checkpoint=ckpt, **{**kw, "skip_first": 5})
    with pytest.raises(UsageError, match="other settings \\(prompts\\)"):
        api.fit_lens(lm, "jacobian", texts[:3], out=tmp_path / "other.pt", checkpoint=ckpt, **kw)


def test_shards_merged_equal_one_fit(tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("llama"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join([TEXT, "Once upon a time there was a small village at the edge of a dark forest",
                                  "In the beginning the universe was created and this has made a lot of people angry"]))
    common = ["fit-lens", "jacobian", "--model", model, "--prompts", str(prompts), "--skip-first", "4",
              "--source-layers", "0", "--dtype", "fp32", "--format", "json"]
    for args in (["--out", str(tmp_path / "whole.pt")], ["--out", str(tmp_path / "s0.pt"), "--shard", "0/2"],
                 ["--out", str(tmp_path / "s1.pt"), "--shard", "1/2"]):
        res = runner.invoke(app, common + args)
        assert res.exit_code == 0, res.output
    shards = [torch.load(tmp_path / f"s{i}.pt", weights_only=True) for i in (0, 1)]
    assert [s["n_prompts"] for s in shards] == [2, 1]               # prompts 0, 2 and prompt 1
    res = runner.invoke(app, ["fit-lens", "merge", str(tmp_path / "s0.pt"), str(tmp_path / "s1.pt"),
                              "--out", str(tmp_path / "merged.pt"), "--dtype", "fp32"])
    assert res.exit_code == 0, res.output
    merged, whole = (torch.load(tmp_path / f, weights_only=True) for f in ("merged.pt", "whole.pt"))
    torch.testing.assert_close(merged["J"][0], whole["J"][0], atol=1e-6, rtol=1e-6)
    res = runner.invoke(app, common + ["--out", str(tmp_path / "x.pt"), "--shard", "2/2"])
    assert res.exit_code == 2 and "i must be in 0..1" in res.output
