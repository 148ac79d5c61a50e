"""`anatomy sae` at TransformerLens' ``ln2.hook_normalized``: the pre-MLP norm's normalised vector *before* its gain
(and bias), ``x / RMS(x)`` or ``(x - mean) / σ`` of the norm's input ``x``, as TransformerLens hooks it and as
``circuit`` reads it (engine/norm_gain.py, one rule for both). Checked by hand from a hook on the norm's input, on
tiny models whose norms have random gains (a gain of 1 would hide the difference), some of them 0 (the real
Gemma-3-270M's pre-MLP norms have such channels in 17 of 18 blocks: read from the MLP's input, they would be lost)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.numpy import load_file
from test_sae import FIXTURES
from test_sae import PROMPT
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()
NORM = {"gemma3": "pre_feedforward_layernorm", "llama": "post_attention_layernorm", "gpt2": "ln_2"}
LAYER = 1
ZERO = [3, 5, 11]  # the channels whose gain is 0 where a test asks


def _random_gains(tiny_model_dir, tmp_path, arch, zero=False):
    """A copy of the tiny ``arch`` model whose pre-MLP norms have random gains (LayerNorm: and biases), and the HF
    model itself; ``zero``: a gain of 0 in channels ZERO (Gemma: weight -1)."""
    from transformers import AutoModelForCausalLM

    folder = tmp_path / f"{arch}-gains"
    shutil.copytree(tiny_model_dir(arch), folder)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for block in hf.base_model.get_submodule("h" if arch == "gpt2" else "layers"):
            norm = block.get_submodule(NORM[arch])
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))  # Gemma's gain is 1 + weight
            if zero:
                norm.weight[ZERO] = -1.0 if arch == "gemma3" else 0.0
            if getattr(norm, "bias", None) is not None:
                norm.bias.copy_(torch.randn(norm.bias.shape, generator=g) * 0.3)
    hf.save_pretrained(folder)
    return folder, hf


def _sae(tmp_path, fixture, **hooks):
    folder = tmp_path / "sae"
    shutil.copytree(FIXTURES / fixture, folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg["metadata"].update(hooks)
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder, {k: torch.from_numpy(v) for k, v in load_file(str(folder / "sae_weights.safetensors")).items()}


def _run(folder, model, *more, d_sae=64):
    args = ["sae", PROMPT, "--sae", str(folder), "--model", str(model), "--format", "json", *more]
    for f in range(d_sae):
        args += ["--feature", str(f)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    n = len(data["token_ids"])
    acts = torch.zeros(n, d_sae)
    for r in data["feature_activations"]:
        acts[r["position"], r["feature"]] = r["activation"]
    return data, acts


def _seen(hf, arch, ids, replace=None):
    """The pre-MLP norm's input and the MLP's output in block LAYER (``replace``: the norm's output instead)."""
    block = hf.base_model.get_submodule("h" if arch == "gpt2" else "layers")[LAYER]
    norm = block.get_submodule(NORM[arch])
    mlp_out = block.get_submodule("post_feedforward_layernorm" if arch == "gemma3" else "mlp")
    seen = {}
    handles = [norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0][0].detach())),
               mlp_out.register_forward_hook(lambda m, a, o: seen.__setitem__("out", o[0].detach()))]
    if replace is not None:
        handles.append(norm.register_forward_hook(lambda m, a, o: replace[None].to(o.dtype)))
    try:
        with torch.no_grad():
            seen["logits"] = hf(torch.tensor([ids])).logits[0]
    finally:
        for h in handles:
            h.remove()
    return seen


def _normalized(x, norm, arch):
    """TransformerLens' hook_normalized of the norm's input ``x``, by hand."""
    eps = getattr(norm, "eps", getattr(norm, "variance_epsilon", None))
    if arch == "gpt2":
        return (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("zero", [False, True], ids=["gains", "gains-of-0"])
@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_transcoder_of_ln2_hook_normalized_reads_before_the_gain(tiny_model_dir, tmp_path, arch, zero):
    """SAELens' skip transcoder of ``blocks.1.ln2.hook_normalized``: its features are ``relu(n W_enc + b_enc)`` of
    ``n = x / RMS(x)`` (not of the MLP's input ``g · n``), its reconstruction ``f W_dec + b_dec + n W_skip^T`` of the
    MLP's output, also where some gains are 0; circuit's replacement model gives its transcoders the same ``n``."""
    from anatomy_cli import engine
    from anatomy_cli.engine import replacement as rep
    from anatomy_cli.engine.replacement import PerLayer
    from anatomy_cli.engine.replacement import Transcoder

    model, hf = _random_gains(tiny_model_dir, tmp_path, arch, zero)
    sae, w = _sae(tmp_path, "saelens-transcoder", hook_name=f"blocks.{LAYER}.ln2.hook_normalized",
                  hook_name_out=f"blocks.{LAYER}.hook_mlp_out")
    data, acts = _run(sae, model)
    assert data["sae"]["site"] == f"blocks.{LAYER}.mlp.hook_in"
    seen = _seen(hf, arch, data["token_ids"])
    norm = hf.base_model.get_submodule("layers")[LAYER].get_submodule(NORM[arch])
    n = _normalized(seen["x"], norm, arch)
    f = torch.relu(n @ w["W_enc"] + w["b_enc"])
    assert 0 < int((f > 0).sum()) < f.numel()
    torch.testing.assert_close(acts, f, rtol=1e-4, atol=1e-5)
    assert data["health"]["l0"] == (f > 0).sum(-1).tolist()
    recon = f @ w["W_dec"] + w["b_dec"] + n @ w["W_skip"].T
    assert data["health"]["mse"] == pytest.approx(float((seen["out"] - recon).double().pow(2).mean()), rel=1e-4)
    y = norm(seen["x"][None])[0].detach()  # the MLP's input, after the gain
    assert not torch.allclose(torch.relu(y @ w["W_enc"] + w["b_enc"]), f, atol=1e-3)
    if zero:
        assert float(y[:, ZERO].abs().max()) == 0 and float(n[:, ZERO].abs().min()) > 0  # y lost n there
    # circuit's reading of the same transcoder: the replacement model's input to it is n
    lm = engine.load(str(model), device="cpu")
    tc = Transcoder(w["W_enc"].T, w["b_enc"], w["W_dec"], w["b_dec"], W_skip=w["W_skip"])
    with rep.frozen(lm), torch.no_grad():
        fw = rep.forward(lm, torch.tensor(data["token_ids"]), PerLayer([tc] * lm.n_layers, before_gain=True), 1)
    torch.testing.assert_close(fw.mlp_in[LAYER][0], n, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(tc.encode(fw.mlp_in[LAYER][0]), f, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(tc.decode(f, fw.mlp_in[LAYER][0]), recon, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("zero", [False, True], ids=["gains", "gains-of-0"])
def test_an_sae_at_ln2_hook_normalized_reads_and_writes_before_the_gain(tiny_model_dir, tmp_path, zero):
    """A SAELens SAE (``apply_b_dec_to_input``) at ``blocks.1.ln2.hook_normalized`` on GPT-2, whose ``ln_2`` has a
    random gain (``zero``: 0 in some channels) and bias: features of ``n = (x - mean) / σ``; its reconstruction is
    of ``n`` (mse), and the splice writes ``g · recon + β`` as ``ln_2``'s output (the spliced cross-entropy is that
    run's; with the error term the logits are the model's)."""
    model, hf = _random_gains(tiny_model_dir, tmp_path, "gpt2", zero)
    sae, w = _sae(tmp_path, "saelens-standard", hook_name=f"blocks.{LAYER}.ln2.hook_normalized")
    data, acts = _run(sae, model)
    seen = _seen(hf, "gpt2", data["token_ids"])
    norm = hf.transformer.h[LAYER].ln_2
    n = _normalized(seen["x"], norm, "gpt2")
    f = torch.relu((n - w["b_dec"]) @ w["W_enc"] + w["b_enc"])
    assert 0 < int((f > 0).sum()) < f.numel()
    torch.testing.assert_close(acts, f, rtol=1e-4, atol=1e-5)
    recon = f @ w["W_dec"] + w["b_dec"]
    h = data["health"]
    assert h["mse"] == pytest.approx(float((n - recon).double().pow(2).mean()), rel=1e-4)
    assert h["max_logit_diff_with_error"] < 1e-4
    spliced = _seen(hf, "gpt2", data["token_ids"], replace=recon * norm.weight.detach() + norm.bias.detach())
    ids = torch.tensor(data["token_ids"])
    ce = -torch.log_softmax(spliced["logits"].double(), -1)[:-1].gather(1, ids[1:, None]).mean()
    assert h["ce_spliced_nats"] == pytest.approx(float(ce), rel=1e-5)


def test_ln2_hook_normalized_on_a_model_whose_mlp_reads_no_norm_is_refused(tiny_model_dir, tmp_path):
    """OLMo 2's MLP reads the residual stream itself (its norms come after the sub-layers): an SAE of
    ``ln2.hook_normalized`` is a one-line usage error, from the config alone."""
    sae, _ = _sae(tmp_path, "saelens-transcoder", hook_name="blocks.1.ln2.hook_normalized",
                  hook_name_out="blocks.1.hook_mlp_out")
    result = runner.invoke(app, ["sae", PROMPT, "--sae", str(sae), "--model", str(tiny_model_dir("olmo2"))])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "reads no norm's output" in lines[0]


def test_mlp_hook_in_is_the_mlps_input_after_the_gain(tiny_model_dir, tmp_path):
    """anatomy's own ``blocks.1.mlp.hook_in`` (sparsify's ``layers.1.mlp`` transcoders, ``fit-sae --transcoder``)
    stays the MLP's input, after the norm's gain, and on Gemma 3 it is the feed-forward module's input, not that of
    ``post_feedforward_layernorm`` (``hook_mlp_out``'s module, which reads the MLP's output)."""
    model, hf = _random_gains(tiny_model_dir, tmp_path, "gemma3")
    sae, w = _sae(tmp_path, "saelens-transcoder", hook_name=f"blocks.{LAYER}.mlp.hook_in",
                  hook_name_out=f"blocks.{LAYER}.hook_mlp_out")
    data, acts = _run(sae, model)
    block = hf.model.layers[LAYER]
    seen = {}
    handle = block.mlp.register_forward_pre_hook(lambda m, a: seen.__setitem__("y", a[0][0].detach()))
    try:
        with torch.no_grad():
            hf(torch.tensor([data["token_ids"]]))
    finally:
        handle.remove()
    torch.testing.assert_close(acts, torch.relu(seen["y"] @ w["W_enc"] + w["b_enc"]), rtol=1e-4, atol=1e-5)


def test_steer_feature_of_an_ln2_transcoder_on_gains_of_0(tiny_model_dir, tmp_path):
    """``generate --steer-feature`` with a transcoder of ``ln2.hook_normalized`` on Gemma 3 whose pre-MLP gain is 0
    in some channels: it adds ``C · W_dec[ID]`` at ``hook_mlp_out`` (no gain touches it); the next token's
    probabilities are those of a hand-written hook adding it to ``post_feedforward_layernorm``'s output."""
    model, hf = _random_gains(tiny_model_dir, tmp_path, "gemma3", zero=True)
    sae, w = _sae(tmp_path, "saelens-transcoder", hook_name=f"blocks.{LAYER}.ln2.hook_normalized",
                  hook_name_out=f"blocks.{LAYER}.hook_mlp_out")
    result = runner.invoke(app, ["generate", PROMPT, "--model", str(model), "--max-new-tokens", "1", "--top", "5",
                                 "--steer-feature", "5", "--coef", "4", "--sae", str(sae), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    add = 4.0 * w["W_dec"][5].float()
    handle = hf.model.layers[LAYER].post_feedforward_layernorm.register_forward_hook(lambda m, a, o: o + add)
    try:
        with torch.no_grad():
            probs = torch.softmax(hf(torch.tensor([data["token_ids"]])).logits[0, -1].double(), -1)
    finally:
        handle.remove()
    top = probs.topk(5)
    step = data["steps"][0]
    assert [t["token_id"] for t in step["top"]] == top.indices.tolist()
    assert [t["probability"] for t in step["top"]] == pytest.approx(top.values.tolist(), rel=1e-4)


def test_the_real_gemma_3_with_gains_of_0_reads_n_from_the_norms_input(gemma3_lm, tmp_path):
    """The real Gemma-3-270M: block 5's pre-feedforward norm has a gain of 0 (weight -1) in 2 channels (17 of its
    18 blocks have such). A random skip transcoder of ``blocks.5.ln2.hook_normalized``: `sae`'s input is
    ``x / RMS(x)`` of the norm's input, captured with a hand-written hook, and so is the replacement model's."""
    from safetensors.numpy import save_file

    from anatomy_cli.engine import replacement as rep
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine.norm_gain import mlp_norm_gain
    from anatomy_cli.engine.replacement import PerLayer
    from anatomy_cli.engine.replacement import Transcoder
    from anatomy_cli.models.sae.read import read

    lm, layer, d, f = gemma3_lm, 5, gemma3_lm.d_model, 32
    assert int((mlp_norm_gain(lm, layer).gain == 0).sum()) == 2
    folder = tmp_path / "tc"
    shutil.copytree(FIXTURES / "saelens-transcoder", folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    cfg.update(d_in=d, d_out=d, d_sae=f)
    cfg["metadata"].update(hook_name=f"blocks.{layer}.ln2.hook_normalized", hook_name_out=f"blocks.{layer}.hook_mlp_out")
    (folder / "cfg.json").write_text(json.dumps(cfg))
    g = torch.Generator().manual_seed(0)
    w = {"W_enc": torch.randn(d, f, generator=g) / d ** .5, "b_enc": torch.randn(f, generator=g) * .1,
         "W_dec": torch.randn(f, d, generator=g) / f ** .5, "b_dec": torch.zeros(d), "W_skip": torch.zeros(d, d)}
    save_file({k: v.numpy() for k, v in w.items()}, str(folder / "sae_weights.safetensors"))
    ids = lm.tokenizer.hf("The capital of France is Paris")["input_ids"]
    norm = lm.model.base_model.layers[layer].pre_feedforward_layernorm
    seen = {}
    handle = norm.register_forward_pre_hook(lambda m, a: seen.__setitem__("x", a[0][0].detach().clone()))
    try:
        run = engine_sae.splice_run(lm, ids, engine_sae.Dictionary(read(folder), lm.device))
    finally:
        handle.remove()
    x = seen["x"]
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps)
    torch.testing.assert_close(run.x, n, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(run.features, torch.relu(n @ w["W_enc"] + w["b_enc"]), rtol=1e-4, atol=1e-5)
    assert float(run.logits_with_error.sub(run.logits).abs().max()) < 1e-3
    tc = Transcoder(w["W_enc"].T, w["b_enc"], w["W_dec"], w["b_dec"])
    with rep.frozen(lm), torch.no_grad():
        fw = rep.forward(lm, torch.tensor(ids), PerLayer([tc] * lm.n_layers, before_gain=True), 1)
    torch.testing.assert_close(fw.mlp_in[layer][0], n, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["gemma3", "llama"])
def test_a_sparsify_transcoder_read_at_ln2_hook_normalized_with_hook(tiny_model_dir, tmp_path, arch):
    """sparsify's transcoder (``layers.0.mlp``, TopK k 8, a skip) given ``--hook blocks.1.ln2.hook_normalized``, as
    sae.md's ``--hook`` promises: it reads block 1's ``n = x / RMS(x)`` of the pre-MLP norm's input and writes its
    ``hook_mlp_out`` (before, the reader put --hook on both ends and refused it on every model, Gemma 3 too); its
    features are sparsify's ``TopK_8(relu(n W_encᵀ + b_enc))`` by hand, on norms with gains of 0 in some channels;
    ``--hook blocks.1.mlp.hook_in`` reads the MLP's input after the gain, which differs."""
    model, hf = _random_gains(tiny_model_dir, tmp_path, arch, zero=True)
    sae = tmp_path / "tc"
    shutil.copytree(FIXTURES / "sparsify" / "layers.0.mlp", sae)
    w = {k: torch.from_numpy(v) for k, v in load_file(str(sae / "sae.safetensors")).items()}
    data, acts = _run(sae, model, "--hook", f"blocks.{LAYER}.ln2.hook_normalized")
    assert (data["sae"]["site"], data["sae"]["site_out"]) == (f"blocks.{LAYER}.mlp.hook_in",
                                                              f"blocks.{LAYER}.hook_mlp_out")
    seen = _seen(hf, arch, data["token_ids"])
    norm = hf.base_model.get_submodule("layers")[LAYER].get_submodule(NORM[arch])
    n = _normalized(seen["x"], norm, arch)

    def topk(x):
        pre = torch.relu(x @ w["encoder.weight"].T + w["encoder.bias"])
        top = pre.topk(8, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values)

    f = topk(n)
    assert int((f > 0).sum()) > 0
    torch.testing.assert_close(acts, f, rtol=1e-4, atol=1e-5)
    _, acts_after = _run(sae, model, "--hook", f"blocks.{LAYER}.mlp.hook_in")
    y = norm(seen["x"][None])[0].detach()  # the MLP's input, after the gain (0 in channels ZERO)
    torch.testing.assert_close(acts_after, topk(y), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(acts_after, f, atol=1e-3)
    refused = runner.invoke(app, ["sae", PROMPT, "--sae", str(sae), "--model", str(model), "--hook",
                                  f"blocks.{LAYER}.hook_resid_post"])  # not the MLP's input: no transcoder there
    assert refused.exit_code == 2 and "anatomy reads transcoders of an MLP only" in refused.stderr, refused.output

