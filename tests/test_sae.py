"""`anatomy sae`: SAEs written by SAELens and sparsify themselves (tests/fixtures/sae/make_fixtures.py, run in a
separate environment), read back; then the command on a tiny model against transformers' own forward."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.numpy import save_file
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.engine.sae import Dictionary
from anatomy_cli.models.sae import names
from anatomy_cli.models.sae.labels import read_labels
from anatomy_cli.models.sae.read import read

FIXTURES = Path(__file__).parent / "fixtures" / "sae"
GEMMA = FIXTURES / "gemma-scope-tiny-res" / "layer_1" / "width_64" / "average_l0_9"
# fixture folder -> (format, architecture, site, site_out)
CASES = {
    "saelens-standard": ("saelens", "standard", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post"),
    "saelens-standard-normed": ("saelens", "standard", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post"),
    "saelens-jumprelu": ("saelens", "jumprelu", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post"),
    "saelens-topk": ("saelens", "topk", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post"),
    "saelens-batchtopk": ("saelens", "jumprelu", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post"),
    "saelens-transcoder": ("saelens", "standard", "blocks.0.mlp.hook_in", "blocks.0.hook_mlp_out"),
    "sparsify/layers.1": ("sparsify", "topk", "blocks.1.hook_resid_post", "blocks.1.hook_resid_post"),
    "sparsify/layers.0.mlp": ("sparsify", "topk", "blocks.0.mlp.hook_in", "blocks.0.hook_mlp_out"),
    str(GEMMA.relative_to(FIXTURES)): ("gemma_scope", "jumprelu", "blocks.1.hook_resid_post",
                                       "blocks.1.hook_resid_post"),
}
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, list(args))


# ---------------------------------------------------------------- files: the libraries' own encode

@pytest.mark.parametrize("name", list(CASES))
def test_encode_and_decode_equal_the_library_s_own(name):
    sae = read(FIXTURES / name)
    assert (sae.format, sae.architecture, sae.site, sae.site_out) == CASES[name]
    assert (sae.d_in, sae.d_sae) == (32, 64)
    expected = {k: torch.from_numpy(v) for k, v in load_file(str(FIXTURES / name / "expected.safetensors")).items()}
    d = Dictionary(sae)
    features = d.encode(expected["x"])
    torch.testing.assert_close(features, expected["features"], atol=1e-5, rtol=1e-5)
    assert torch.equal(features > 0, expected["features"] > 0)
    torch.testing.assert_close(d.decode(features, expected["x"]), expected["recon"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["saelens-jumprelu", "saelens-batchtopk", str(GEMMA.relative_to(FIXTURES))])
def test_jumprelu_keeps_exactly_the_pre_activations_above_the_threshold(name):
    sae = read(FIXTURES / name)
    x = load_file(str(FIXTURES / name / "expected.safetensors"))["x"].astype(np.float64)
    pre = (x - sae.b_dec * sae.subtract_b_dec) @ sae.W_enc + sae.b_enc
    keep = (pre > sae.threshold) & (pre > 0)
    assert 0 < keep.sum() < keep.size
    f = Dictionary(sae).encode(torch.from_numpy(x).float()).numpy()
    assert np.array_equal(f > 0, keep)
    np.testing.assert_allclose(f[keep], pre[keep], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["saelens-topk", "sparsify/layers.1"])
def test_topk_keeps_exactly_k(name):
    sae = read(FIXTURES / name)
    x = torch.from_numpy(load_file(str(FIXTURES / name / "expected.safetensors"))["x"])
    f = Dictionary(sae).encode(x)
    pre = (x - torch.from_numpy(sae.b_dec)) @ torch.from_numpy(sae.W_enc) + torch.from_numpy(sae.b_enc)
    assert sae.k == 8 and sae.stated_l0 == 8
    assert ((f > 0).sum(-1) == torch.clamp((pre > 0).sum(-1), max=8)).all()
    kth = pre.topk(8, dim=-1).values[:, -1:]
    assert ((f > 0) <= (pre >= kth)).all()


def test_gemma_scope_path_gives_the_hook_and_the_stated_l0():
    sae = read(GEMMA / "params.npz")
    assert sae.hook_name == "blocks.1.hook_resid_post" and sae.stated_l0 == 9.0
    assert read(GEMMA, hook="blocks.0.hook_resid_post").site == "blocks.0.hook_resid_post"


def test_gemma_scope_hooks_from_the_path():
    """The last layer_N folder is the block, the last folder naming a release the kind: -transcoders (or, for a
    caller reading transcoders, none) is the MLP transcoder ln2.hook_normalized -> hook_mlp_out."""
    hooks = names.gemma_scope_hooks
    tc = ("blocks.3.ln2.hook_normalized", "blocks.3.hook_mlp_out")
    hub = "/hub/models--google--gemma-scope-2b-pt-transcoders/snapshots/abc/layer_3/width_16k/average_l0_54/params.npz"
    assert hooks(hub) == tc
    assert hooks("/data/my-res/gemma-scope-2b-pt-transcoders/layer_3/width_16k/average_l0_5/params.npz") == tc
    assert hooks("/layer_7/gemma-scope-2b-pt-res-canonical/layer_3/width_16k/canonical/params.npz") == \
        ("blocks.3.hook_resid_post",) * 2
    assert hooks("/tmp/tc/layer_3/width_16k/average_l0_5/params.npz") is None
    assert hooks("/tmp/tc/layer_3/width_16k/average_l0_5/params.npz", transcoder=True) == tc
    assert hooks("/tmp/gemma-scope-2b-pt-mlp/layer_3/p", transcoder=True) == ("blocks.3.hook_mlp_out",) * 2
    assert names.before_gain(tc[0]) and not names.before_gain("blocks.3.mlp.hook_in")


def test_hook_names_map_to_anatomy_points():
    assert names.hook_point("blocks.10.hook_resid_post") == "blocks.10.hook_resid_post"
    assert names.hook_point("layers.10") == "blocks.10.hook_resid_post"
    assert names.hook_point("model.layers.3.mlp") == "blocks.3.hook_mlp_out"
    assert names.hook_point("layers.3.mlp", transcoder_input=True) == "blocks.3.mlp.hook_in"
    assert names.hook_point("blocks.2.ln2.hook_normalized") == "blocks.2.mlp.hook_in"


def test_a_sparsify_checkpoint_folder_needs_a_hook():
    with pytest.raises(Exception, match="pick one with --hook"):
        read(FIXTURES / "sparsify")
    assert read(FIXTURES / "sparsify", hook="layers.1").site == "blocks.1.hook_resid_post"


def test_labels_join_by_index_and_leave_out_other_saes():
    labels = read_labels(FIXTURES / "labels", "tiny-gpt2/1-res-test")
    assert labels[0] == "feature 0 label" and labels[63] == "feature 63 label"
    assert 1 not in labels  # its record names another model


# ---------------------------------------------------------------- broken files: one-line errors

def _copy(tmp_path, name="saelens-standard") -> Path:
    dst = tmp_path / "sae"
    shutil.copytree(FIXTURES / name, dst)
    return dst


def _one_line_error(result, code, match):
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and match in lines[0], result.stderr


@pytest.mark.parametrize("cut", ["half", 20, 7])
def test_a_truncated_dictionary_is_one_message_in_sae_and_features(tmp_path, tiny_model_dir, cut):
    """Issue 60 follow-up: a dictionary's safetensors file cut short reads the same in `sae` (which reads the
    values) and `features` (whose early check reads the header): models/headers.py's words, the byte counts read
    here from the file's own header."""
    import struct

    model = str(tiny_model_dir("gpt2"))
    broken = _copy(tmp_path)
    weights = broken / "sae_weights.safetensors"
    data = weights.read_bytes()
    size = len(data) // 2 if cut == "half" else cut
    weights.write_bytes(data[:size])
    (n,) = struct.unpack("<Q", data[:8])
    if size < 8:
        expected = f"{weights}: not a safetensors file ({size} bytes)"
    elif n > size - 8:
        expected = f"{weights}: not a safetensors file or truncated (header length {n:,}, file {size:,} bytes)"
    else:
        name, end = next((k, 8 + n + v["data_offsets"][1]) for k, v in json.loads(data[8:8 + n]).items()
                         if k != "__metadata__" and 8 + n + v["data_offsets"][1] > size)
        expected = f"{weights}: truncated: tensor {name} ends at byte {end:,}, the file at {size:,}"
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat.\n")
    for args in (("sae", "Hi", "--sae", broken), ("features", broken, "--corpus", corpus)):
        result = invoke(*map(str, args), "--model", model)
        assert (result.exit_code, result.stderr) == (1, f"error: {expected}\n"), args


def test_bad_files_are_one_line_errors(tmp_path, tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    broken = _copy(tmp_path)
    weights = broken / "sae_weights.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v for k, v in tensors.items() if k != "b_dec"}, str(weights))
    _one_line_error(invoke("sae", "Hi", "--sae", str(broken), "--model", model), 1, "no tensor 'b_dec'")

    save_file({**tensors, "W_enc": tensors["W_enc"][:16], "W_dec": tensors["W_dec"][:, :16],
               "b_dec": tensors["b_dec"][:16]}, str(weights))
    _one_line_error(invoke("sae", "Hi", "--sae", str(broken), "--model", model), 2, "d_in is 16")

    data = (FIXTURES / "saelens-standard" / "sae_weights.safetensors").read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    _one_line_error(invoke("sae", "Hi", "--sae", str(broken), "--model", model), 1, "truncated")

    shutil.copy(FIXTURES / "saelens-standard" / "sae_weights.safetensors", weights)
    cfg = json.loads((broken / "cfg.json").read_text())
    (broken / "cfg.json").write_text(json.dumps({**cfg, "architecture": "matryoshka_topk"}))
    _one_line_error(invoke("sae", "Hi", "--sae", str(broken), "--model", model), 2, "unknown SAE architecture")

    npz = tmp_path / "gemma" / "params.npz"
    npz.parent.mkdir()
    npz.write_bytes((GEMMA / "params.npz").read_bytes()[:300])
    _one_line_error(invoke("sae", "Hi", "--sae", str(npz), "--model", model, "--hook", "blocks.1.hook_resid_post"),
                    1, "truncated")
    _one_line_error(invoke("sae", "Hi", "--sae", str(FIXTURES / "saelens-standard"), "--model", model,
                           "--feature", "64"), 2, "out of range")


# ---------------------------------------------------------------- the command on a tiny model

def _hf(model_dir):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


PROMPT = "The cat sat on the mat because"


def test_features_and_splices_equal_transformers_own(tiny_model_dir, cached_load):
    model_dir = tiny_model_dir("gpt2")
    result = invoke("sae", PROMPT, "--sae", str(FIXTURES / "saelens-standard"), "--model", str(model_dir),
                    "--hook", "blocks.0.hook_resid_post", "--feature", "3", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    ids = torch.tensor([data["token_ids"]])
    hf = _hf(model_dir)
    d = Dictionary(read(FIXTURES / "saelens-standard", hook="blocks.0.hook_resid_post"))
    with torch.no_grad():
        out = hf(ids, output_hidden_states=True)
        x = out.hidden_states[1][0]                                       # block 0's output
        f = d.encode(x)
        recon = d.decode(f, x)
        handle = hf.transformer.h[0].register_forward_hook(lambda m, a, o: (recon[None], *o[1:])
                                                           if isinstance(o, tuple) else recon[None])
        try:
            spliced = hf(ids).logits[0]
        finally:
            handle.remove()
    logits = out.logits[0]
    h = data["health"]
    assert h["l0"] == (f > 0).sum(-1).tolist()
    assert h["max_logit_diff_with_error"] < 1e-4
    logp, logq = torch.log_softmax(logits.double(), -1), torch.log_softmax(spliced.double(), -1)
    nxt = ids[0, 1:]
    assert h["ce_clean_nats"] == pytest.approx(float(-logp[:-1].gather(1, nxt[:, None]).mean()), rel=1e-5)
    assert h["ce_spliced_nats"] == pytest.approx(float(-logq[:-1].gather(1, nxt[:, None]).mean()), rel=1e-5)
    assert h["ce_with_error_nats"] == pytest.approx(h["ce_clean_nats"], abs=1e-5)
    # the same cross-entropies in bits (corpus's unit): -log2 p, computed apart
    assert h["ce_clean_bits"] == pytest.approx(float(-(logp[:-1].gather(1, nxt[:, None]) / math.log(2)).mean()),
                                               rel=1e-5)
    assert h["ce_spliced_bits"] == pytest.approx(float(-(logq[:-1].gather(1, nxt[:, None]) / math.log(2)).mean()),
                                                 rel=1e-5)
    assert h["kl_spliced_nats"] == pytest.approx(float((logp.exp() * (logp - logq)).sum(-1).mean()), rel=1e-4)
    err = (x - recon).double()
    assert h["fve"] == pytest.approx(float(1 - err.pow(2).sum() / (x - x.mean(0)).double().pow(2).sum()), rel=1e-5)
    assert h["mse"] == pytest.approx(float(err.pow(2).mean()), rel=1e-5)
    # top features: the largest activations at each position, in order
    first = [r for r in data["top_features"] if r["position"] == 2]
    assert [r["feature"] for r in first] == f[2].topk(5).indices.tolist()
    assert [r["activation"] for r in first] == pytest.approx(f[2].topk(5).values.tolist(), rel=1e-5)
    follow = [r["activation"] for r in data["feature_activations"]]
    assert follow == pytest.approx(f[:, 3].tolist(), abs=1e-6)
    summary = data["features"][0]
    assert summary["url"] == "https://www.neuronpedia.org/tiny-gpt2/1-res-test/3"
    # logit lens: the decoder row through ln_f and the LM head
    lens = hf.lm_head(hf.transformer.ln_f(d.W_dec[3]))
    top = [r["token_id"] for r in data["logit_lens"] if r["side"] == "top"]
    assert top == lens.topk(5).indices.tolist()


def test_a_transcoder_reads_the_mlp_input_and_replaces_its_output(tiny_model_dir, cached_load):
    model_dir = tiny_model_dir("gpt2")
    result = invoke("sae", PROMPT, "--sae", str(FIXTURES / "sparsify"), "--hook", "layers.0.mlp",
                    "--model", str(model_dir), "--format", "json", "--labels", str(FIXTURES / "labels"))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sae"]["transcoder"] and data["sae"]["site_out"] == "blocks.0.hook_mlp_out"
    hf = _hf(model_dir)
    seen = {}
    mlp = hf.transformer.h[0].mlp
    handles = [mlp.register_forward_pre_hook(lambda m, a: seen.__setitem__("in", a[0][0])),
               mlp.register_forward_hook(lambda m, a, o: seen.__setitem__("out", o[0]))]
    with torch.no_grad():
        hf(torch.tensor([data["token_ids"]]))
    for handle in handles:
        handle.remove()
    d = Dictionary(read(FIXTURES / "sparsify" / "layers.0.mlp"))
    f = d.encode(seen["in"])
    assert data["health"]["l0"] == (f > 0).sum(-1).tolist() == [8] * len(data["token_ids"])
    recon = d.decode(f, seen["in"])
    mse = float((seen["out"] - recon).double().pow(2).mean())
    assert data["health"]["mse"] == pytest.approx(mse, rel=1e-5)
    assert data["health"]["max_logit_diff_with_error"] < 1e-4
    every = read_labels(FIXTURES / "labels")  # this SAE names no Neuronpedia id: no record is left out
    assert every[1] == "not ours"
    assert [r["label"] for r in data["top_features"]] == [every.get(r["feature"]) for r in data["top_features"]]


def test_warnings_for_a_prompt_past_context_and_another_bos_rule(tiny_model_dir, cached_load, tmp_path):
    sae = _copy(tmp_path)
    cfg = json.loads((sae / "cfg.json").read_text())
    cfg["metadata"].update(context_size=4, prepend_bos=True)
    (sae / "cfg.json").write_text(json.dumps(cfg))
    result = invoke("sae", PROMPT, "--sae", str(sae), "--model", str(tiny_model_dir("gpt2")), "--format", "tsv")
    assert result.exit_code == 0, result.output
    assert "trained on contexts of 4" in result.stderr and "prepend_bos true" in result.stderr
    assert result.stdout.startswith("statistic\tvalue\tunit\n")


def test_a_fit_sae_dictionary_s_health_runs_the_unmodified_forward_once(tiny_lm, tmp_path):
    """A dictionary recording skipped_positions (as fit-sae writes it) is spliced twice, over every position (the
    features) and with its first position kept (the health): one unmodified forward serves both, 5 forwards where
    6 ran, and every figure is the one two independent splice runs give (each with its own unmodified forward)."""
    import anatomy_cli as api
    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae

    folder = tmp_path / "layers.1"
    shutil.copytree(FIXTURES / "sparsify" / "layers.1", folder)
    cfg = json.loads((folder / "cfg.json").read_text())
    (folder / "cfg.json").write_text(json.dumps({**cfg, "skipped_positions": 1}))
    lm = tiny_lm("gpt2")
    forwards = []
    handle = lm.model.get_input_embeddings().register_forward_hook(lambda *a: forwards.append(1))
    try:
        r = api.sae(lm, PROMPT, sae=folder)
        n = len(forwards)
        sae_file = read(folder)
        ids = r.data["token_ids"]
        d = Dictionary(sae_file)
        whole = engine_sae.splice_run(lm, ids, d)
        measured = engine_sae.splice_run(lm, ids, d, skip=1)
    finally:
        handle.remove()
    assert n == 5 and len(forwards) == 5 + 6  # the two independent runs: three forwards each
    assert r.result.health == analysis.health(measured, ids[1:], sae_file.stated_l0, skipped=1)
    assert torch.equal(r.result.activations, whole.features.float().cpu())


@pytest.mark.parametrize(("given", "taken"), [("64", 64), ("0", None), ("-3", None), ("true", None),
                                              ('"64"', None), ("64.0", None), ("null", None)])
def test_a_config_s_context_size_is_read_by_one_rule(tmp_path, given, taken):
    """A positive whole number, else none, for every reader (models.sae.read.context_size): sparsify's cfg.json
    (which took `true` as a context of 1 and 0 as one of 0), SAELens' (which took any value, a string too) and a
    circuit-tracer config.yaml (whose rule was already this one). A context of 1 or 0 would warn on every prompt."""
    from anatomy_cli.models import transcoders

    value = json.loads(given)
    sparsify = tmp_path / "layers.1"
    shutil.copytree(FIXTURES / "sparsify" / "layers.1", sparsify)
    cfg = json.loads((sparsify / "cfg.json").read_text())
    (sparsify / "cfg.json").write_text(json.dumps({**cfg, "context_size": value}))
    saelens = _copy(tmp_path)
    cfg = json.loads((saelens / "cfg.json").read_text())
    (saelens / "cfg.json").write_text(json.dumps({**cfg, "metadata": {**cfg["metadata"], "context_size": value}}))
    ct = tmp_path / "ct"
    ct.mkdir()
    save_file({"W_enc": np.zeros((4, 3), np.float32), "W_dec": np.zeros((4, 3), np.float32),
               "b_enc": np.zeros(4, np.float32), "b_dec": np.zeros(3, np.float32)}, str(ct / "layer_0.safetensors"))
    (ct / "config.yaml").write_text("model_kind: transcoder_set\nfeature_input_hook: mlp.hook_in\n"
                                    f"feature_output_hook: mlp.hook_out\ncontext_size: {given}\n"
                                    "transcoders:\n  - layer_0.safetensors\n")
    assert read(sparsify).context_size == read(saelens).context_size == transcoders.describe(ct).context_size == taken
