"""Issue 18: every added family against transformers itself.

One tiny random model per family (tests/models.py: fixed seed, 2 layers, parameter count
asserted by formula when it is built). For each: the residual rows equal transformers'
raw block outputs (the last block's output taken by a hook written here, since
``hidden_states[-1]`` has the final norm); resid_post = resid_pre + attn_out + mlp_out
where the identity holds (the post-LN ones are rebuilt from their own LayerNorms); the
lens at the last layer is the model's own next-token distribution, soft-capping
included; batched equals single; ``params`` rows add up to the total.
"""

from __future__ import annotations

import json
import math

import models
import pytest
import torch
from torch.testing import assert_close
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app
from anatomy_cli.errors import PromptTooLong
from anatomy_cli.errors import UsageError
from anatomy_cli.models import adapters
from anatomy_cli.models import sites

# arch -> (adapter row, has resid_mid, post-LN)
FAMILIES = {
    "gemma": ("llama", True, False), "gemma2": ("gemma2", True, False), "gemma3": ("gemma2", True, False),
    "gemma3_mm": ("gemma3", True, False),
    "phi3": ("phi3", True, False), "qwen2_moe": ("llama", True, False), "qwen3_moe": ("llama", True, False),
    "olmoe": ("llama", True, False), "olmo": ("llama", True, False), "olmo2": ("olmo2", True, False),
    "olmo3": ("olmo2", True, False), "starcoder2": ("llama", True, False), "stablelm": ("stablelm", True, False),
    "stablelm_par": ("stablelm", False, False), "gptj": ("gptj", False, False), "falcon": ("falcon", False, False),
    "falcon_new": ("falcon", False, False), "falcon_rw": ("falcon", True, False), "opt": ("opt", True, False),
    "opt_350m": ("opt_post_ln", True, True), "roberta": ("roberta", True, True),
}
ARCHS = list(FAMILIES)
# Where transformers keeps the decoder layers: written out here, not read from the adapters.
LAYERS = {"gptj": "transformer.h", "falcon": "transformer.h", "falcon_new": "transformer.h",
          "falcon_rw": "transformer.h", "opt": "model.decoder.layers", "opt_350m": "model.decoder.layers",
          "roberta": "roberta.encoder.layer", "gemma3_mm": "model.language_model.layers"}
SANDWICH = ("gemma2", "gemma3", "gemma3_mm", "olmo2", "olmo3")  # a norm after each sub-layer, before the add
PROMPT = "Thank you very much for the money in the bank"
PROMPTS = ["Thank you very", "The bank of the river was muddy after the rain", "a"]
TOL = {"atol": 1e-5, "rtol": 1e-5}

runner = CliRunner()


def _layers(lm, arch):
    return lm.model.get_submodule(LAYERS.get(arch, "model.layers"))


def _reference(lm, arch, ids):
    """transformers' own forward, batch 1: (hidden_states, raw output of the last block, logits)."""
    seen = {}

    def hook(_mod, _args, output):
        seen["last"] = output[0] if isinstance(output, tuple) else output

    handle = _layers(lm, arch)[-1].register_forward_hook(hook)
    try:
        with torch.no_grad():
            out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    finally:
        handle.remove()
    return out.hidden_states, seen["last"][0], out.logits[0]


@pytest.fixture(scope="module")
def runs(tiny_lm):
    """arch -> (lm, encoded, cache of every hook point, reference); built on first use."""
    made = {}

    def get(arch):
        if arch not in made:
            lm = tiny_lm(arch)
            enc = engine.encode(lm, [PROMPT])[0]
            made[arch] = lm, enc, engine.run(lm, [enc], engine.hook_names(lm))[0], _reference(lm, arch, enc.ids)
        return made[arch]

    return get


def test_param_counts_literal():
    # The formulas in tests/models.py (asserted against the built models by save_tiny).
    assert models.expected_params("gemma2") == 1_626_944
    assert models.expected_params("qwen2_moe") == 3_239_936
    assert models.expected_params("gptj") == 3_291_793
    assert models.expected_params("falcon") == 1_629_920
    assert models.expected_params("opt_350m") == 824_336
    assert models.expected_params("roberta") == 1_679_029


@pytest.mark.parametrize("arch", ARCHS)
def test_family_row_and_hook_points(tiny_lm, arch):
    row, has_mid, post_ln = FAMILIES[arch]
    lm = tiny_lm(arch)
    assert lm.adapter.name == row and lm.adapter.post_ln == post_ln
    assert lm.model.config.model_type in adapters.supported_model_types()
    assert lm.has_resid_mid == has_mid
    names = engine.hook_names(lm)
    assert ("blocks.1.hook_resid_mid" in names) == has_mid
    assert (lm.n_layers, lm.d_model, lm.n_heads, lm.d_head) == (2, 32, 4, 8)
    if not has_mid:
        with pytest.raises(UsageError, match="parallel residual"):
            engine.layer_names(lm, "resid_mid")


@pytest.mark.parametrize("arch", ARCHS)
def test_residual_rows_equal_raw_block_outputs(runs, arch):
    lm, enc, cache, (hs, last, _) = runs(arch)
    stream = cache.residual_stream()
    assert stream.shape == (lm.n_layers + 1, len(enc), lm.d_model)
    for layer in range(lm.n_layers):
        assert_close(stream[layer], hs[layer][0], **TOL)
    assert_close(stream[-1], last, **TOL)
    if arch not in ("roberta", "opt_350m"):  # hidden_states[-1] is not the raw last block...
        assert (hs[-1][0] - last).abs().max() > 1e-2
        assert_close(engine.final_norm(lm, last), hs[-1][0], **TOL)  # ...but its final norm


@pytest.mark.parametrize("arch", ARCHS)
def test_lens_at_last_layer_is_the_models_distribution(runs, arch):
    lm, enc, cache, (_, _, logits) = runs(arch)
    assert_close(cache.logits, logits, **TOL)
    lens = engine.unembed(lm, cache["resid_post", -1])
    assert_close(lens, logits, **TOL)
    probs = lens.softmax(-1)
    assert_close(probs, logits.softmax(-1), **TOL)
    assert_close(probs.sum(-1), torch.ones(len(enc)), **TOL)


@pytest.mark.parametrize("arch", [a for a in ARCHS if not FAMILIES[a][2]])
def test_residual_identity(runs, arch):
    lm, _, cache, _ = runs(arch)
    for layer in range(lm.n_layers):
        pre, attn, mlp = cache["resid_pre", layer], cache["attn_out", layer], cache["mlp_out", layer]
        # Tight: a tiny MoE block adds ~3e-4, so the default 1e-5 would not see it missing.
        assert_close(cache["resid_post", layer], pre + attn + mlp, atol=1e-6, rtol=1e-5)
        if lm.has_resid_mid:
            assert_close(cache["resid_mid", layer], pre + attn, atol=1e-6, rtol=1e-5)
        assert attn.abs().max() > 1e-4 and mlp.abs().max() > 1e-4


def test_post_ln_decompositions(runs):
    # OPT-350m and RoBERTa: Add & Norm after each sub-layer, rebuilt from the models' own LayerNorms.
    lm, _, cache, _ = runs("opt_350m")
    for layer, block in enumerate(lm.model.model.decoder.layers):
        mid = block.self_attn_layer_norm(cache["resid_pre", layer] + cache["attn_out", layer])
        assert_close(cache["resid_mid", layer], mid, **TOL)
        assert_close(cache["resid_post", layer], block.final_layer_norm(mid + cache["mlp_out", layer]), **TOL)
    lm, _, cache, _ = runs("roberta")
    for layer, block in enumerate(lm.model.roberta.encoder.layer):
        mid = block.attention.output.LayerNorm(cache["resid_pre", layer] + cache["attn_out", layer])
        assert_close(cache["resid_mid", layer], mid, **TOL)
        assert_close(cache["resid_post", layer], block.output.LayerNorm(mid + cache["mlp_out", layer]), **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_batched_equals_single(tiny_lm, arch):
    lm = tiny_lm(arch)
    enc = engine.encode(lm, PROMPTS)
    names = engine.hook_names(lm)
    batched = engine.run(lm, enc, names, batch_size=3)
    for i, e in enumerate(enc):
        single = engine.run(lm, [e], names, batch_size=1)[0]
        for name in names:
            assert batched[i][name].shape[sites.position_axis(name) - 1] == len(e), name
            assert_close(batched[i][name], single[name], **TOL)
    assert not torch.allclose(batched[0]["resid_post", -1][-1], batched[1]["resid_post", -1][-1])


@pytest.mark.parametrize("arch", ARCHS)
def test_hook_z_is_the_output_projection_input(runs, arch):
    lm, enc, cache, _ = runs(arch)
    block = _layers(lm, arch)[1]
    z = cache["blocks.1.attn.hook_z"]
    assert z.shape == (len(enc), lm.n_heads * lm.d_head)
    with torch.no_grad():
        out = block.get_submodule(lm.adapter.attn_o)(z)
        if arch in SANDWICH:
            assert (out - cache["attn_out", 1]).abs().max() > 1e-3  # the post-norm matters
            out = block.post_attention_layernorm(out)
    assert_close(out, cache["attn_out", 1], **TOL)


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3", "gemma3_mm"])
def test_gemma_layer_0_is_the_scaled_embedding(runs, arch):
    lm, enc, cache, _ = runs(arch)
    assert lm.embed_scale == pytest.approx(math.sqrt(32))
    table = lm.model.get_input_embeddings().weight
    scaled = table[enc.ids] * math.sqrt(32)
    assert_close(cache["hook_embed"], scaled, **TOL)
    assert_close(cache["resid_pre", 0], scaled, **TOL)
    assert (cache["hook_embed"] - table[enc.ids]).abs().max() > 1e-2


def test_gemma2_final_soft_capping(runs):
    lm, _, cache, (_, _, logits) = runs("gemma2")
    assert lm.logit_softcap == models.SOFTCAP and runs("gemma3")[0].logit_softcap is None
    raw = engine.unembed(lm, cache["resid_post", -1], softcap=False)
    capped = engine.unembed(lm, cache["resid_post", -1])
    assert_close(capped, models.SOFTCAP * torch.tanh(raw / models.SOFTCAP), **TOL)
    assert (capped - raw).abs().max() > 1e-2  # the cap changes these logits...
    assert capped.abs().max() < models.SOFTCAP  # ...and bounds them
    assert_close(capped, logits, **TOL)  # which is what transformers' Gemma2ForCausalLM returns
    # Every layer of the lens is capped, not only the last one.
    assert engine.unembed(lm, cache.residual_stream()).abs().max() < models.SOFTCAP


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "gemma3_mm", "olmo3"])
def test_sliding_window_layer_forgets_early_tokens(tiny_lm, arch):
    # Layer 0 attends to the last SLIDING positions only, layer 1 to everything: change token 0
    # and layer 0's output from position SLIDING on stays the same while layer 1's does not.
    lm = tiny_lm(arch)
    assert lm.model.config.get_text_config().layer_types[:2] == ["sliding_attention", "full_attention"]
    a, b = engine.encode(lm, ["one two three four five six seven eight", "nine two three four five six seven eight"])
    assert a.ids[1:] == b.ids[1:] and a.ids[0] != b.ids[0]
    ca, cb = engine.run(lm, [a, b], ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post"])
    w = models.SLIDING
    assert_close(ca["resid_post", 0][w:], cb["resid_post", 0][w:], **TOL)
    assert (ca["resid_post", 0][w - 1] - cb["resid_post", 0][w - 1]).abs().max() > 1e-4
    assert (ca["resid_post", 1][-1] - cb["resid_post", 1][-1]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", SANDWICH)
def test_sandwich_norm_outputs_are_what_is_added(runs, arch):
    lm, enc, cache, _ = runs(arch)
    block = _layers(lm, arch)[0]
    seen = {}
    handles = [block.self_attn.register_forward_hook(lambda m, a, o: seen.__setitem__("attn", o[0])),
               block.mlp.register_forward_hook(lambda m, a, o: seen.__setitem__("mlp", o))]
    try:
        with torch.no_grad():
            lm.model(torch.tensor([enc.ids]))
    finally:
        for h in handles:
            h.remove()
    with torch.no_grad():
        assert_close(cache["attn_out", 0], block.post_attention_layernorm(seen["attn"][0]), **TOL)
        assert_close(cache["mlp_out", 0], block.post_feedforward_layernorm(seen["mlp"][0]), **TOL)
    assert (cache["mlp_out", 0] - seen["mlp"][0]).abs().max() > 1e-3


def test_opt_positions_offset_and_projections(runs):
    lm, enc, cache, _ = runs("opt")
    n = len(enc)
    table = lm.model.model.decoder.embed_positions.weight
    assert table.shape[0] == models.CTX + 2 and lm.n_ctx == models.CTX
    assert_close(cache["hook_pos_embed"], table[2:2 + n], atol=0, rtol=0)
    assert_close(cache["hook_embed"] + cache["hook_pos_embed"], cache["resid_pre", 0], **TOL)
    # The MLP sees [batch * pos, d] rows: mlp_out and resid_mid get their batch shape back, also
    # when only some positions are kept from a padded batch.
    flat = ["blocks.1.hook_mlp_out", "blocks.0.hook_resid_mid"]
    short = engine.encode(lm, ["a b"])[0]
    part = engine.run(lm, [short, enc], flat, positions=[[-1], [0, -1]])
    for name in flat:
        assert_close(part[1][name], cache[name][[0, n - 1]], **TOL)
        assert part[0][name].shape == (1, lm.d_model)
    lm, enc, cache, (hs, _, _) = runs("opt_350m")
    dec = lm.model.model.decoder
    assert dec.project_in is not None and dec.final_layer_norm is None
    assert "ln_final.hook_normalized" not in engine.hook_names(lm)
    with torch.no_grad():
        embedded = dec.project_in(dec.embed_tokens.weight[enc.ids])
        assert_close(cache["hook_embed"], embedded, **TOL)  # d_model wide, not the 16-wide table
        assert_close(dec.project_out(cache["resid_post", -1]), hs[-1][0], **TOL)
    assert_close(cache["hook_embed"] + cache["hook_pos_embed"], cache["resid_pre", 0], **TOL)


def test_roberta_positions_start_after_the_padding_index(runs, tiny_lm):
    lm, enc, cache, _ = runs("roberta")
    assert enc.ids[0] == 0 and enc.ids[-1] == 2  # <s> ... </s>
    assert lm.position_offset == 2 and lm.n_ctx == models.CTX  # 66 position rows, 64 tokens
    table = lm.model.roberta.embeddings.position_embeddings.weight
    assert_close(cache["hook_pos_embed"], table[2:2 + len(enc)], atol=0, rtol=0)
    long = engine.encode(lm, [" a" * models.CTX])
    with pytest.raises(PromptTooLong, match="takes at most 64"):
        engine.check_length(lm, long)


def test_falcon_mlp_out_is_not_changed_in_place(runs):
    # Falcon adds attention's output to the MLP output in place; mlp_out must be the MLP's own output.
    lm, _, cache, _ = runs("falcon")
    block = lm.model.transformer.h[0]
    with torch.no_grad():
        mlp = block.mlp(block.input_layernorm(cache["resid_pre", 0]))
    assert_close(cache["mlp_out", 0], mlp, **TOL)


@pytest.mark.parametrize("arch", ARCHS)
def test_components_classify_every_parameter(tiny_lm, arch):
    lm = tiny_lm(arch)
    parts: dict[str, int] = {}
    for name, p in lm.model.named_parameters():
        part, _ = adapters.component(lm.adapter, name)
        parts[part] = parts.get(part, 0) + p.numel()
    # Encoders: the token-type table and the embedding LayerNorm have no part of their own;
    # Gemma 3 multimodal: the vision tower and its projector.
    other = {"roberta": 3 * models.D, "gemma3_mm": models.expected_params("gemma3_mm") - models.expected_params("gemma3")}
    assert parts.get("other", 0) == other.get(arch, 0), parts
    assert sum(parts.values()) == models.expected_params(arch)
    assert parts["attn"] > 0 and parts["mlp"] > 0


@pytest.mark.parametrize("arch", ARCHS)
def test_params_rows_add_up_to_the_total(tiny_model_dir, arch):
    result = runner.invoke(app, ["params", str(tiny_model_dir(arch)), "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["total"] == models.expected_params(arch)
    assert sum(r["parameters"] for r in data["rows"]) == data["total"]


def test_unsupported_architecture_fails_before_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mamba"}))  # no weights, no tokenizer
    result = runner.invoke(app, ["trace", "hello", "--model", str(tmp_path)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: architecture 'mamba' is not supported; supported: ")
    for name in ("gemma2", "gemma3_text", "phi3", "qwen2_moe", "olmo2", "gptj", "falcon", "opt", "stablelm",
                 "starcoder2", "roberta"):
        assert name in lines[0]
    assert lines[0].count("opt") == 1  # two OPT rows, one name


def test_next_uses_the_capped_distribution(tiny_model_dir, runs, cached_load):
    lm, _, cache, (_, _, logits) = runs("gemma2")
    result = runner.invoke(app, ["next", PROMPT, "--model", str(tiny_model_dir("gemma2")), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["top"]
    expected = logits[-1].softmax(-1)  # transformers' Gemma2ForCausalLM: capped logits
    uncapped = engine.unembed(lm, cache["resid_post", -1][-1], softcap=False).softmax(-1)
    for row in rows:
        assert row["probability"] == pytest.approx(float(expected[row["token_id"]]), rel=1e-4)
        assert row["probability"] != pytest.approx(float(uncapped[row["token_id"]]), rel=1e-3)
    assert rows[0]["probability"] == pytest.approx(float(expected.max()), rel=1e-4)
