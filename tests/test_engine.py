"""Engine capture: hook points against HF hidden_states, residual algebra, batching, hook hygiene."""

from __future__ import annotations

import models
import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from anatomy_cli import engine
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites

# The engine's generic identities on the first families; tests/test_arch.py checks every other family
# (Gemma, Phi-3, the MoEs, OLMo, GPT-J, Falcon, OPT, RoBERTa, ...) against transformers the same way.
ALL = ["gpt2", "llama", "mistral", "qwen2", "qwen3", "mixtral", "gpt_neox", "gpt_neox_seq", "bert"]
DECODERS = [a for a in ALL if a not in models.ENCODERS]
PROMPT = "Thank you very much for the money in the bank"
TOL = dict(atol=1e-5, rtol=1e-5)


def _hf(lm, enc):
    """The reference: HF's own forward with output_hidden_states, batch 1."""
    with torch.no_grad():
        return lm.model(torch.tensor([enc.ids]), output_hidden_states=True)


@pytest.fixture(scope="module")
def full_runs(tiny_lm):
    """arch -> (lm, encoded, cache with every hook point, HF output)."""
    out = {}
    for arch in ALL:
        lm = tiny_lm(arch)
        enc = engine.encode(lm, [PROMPT])[0]
        out[arch] = lm, enc, engine.run(lm, [enc], engine.hook_names(lm))[0], _hf(lm, enc)
    return out


@pytest.mark.parametrize("arch", ALL)
def test_param_count(arch):
    model = models.build_model(arch)
    assert sum(p.numel() for p in model.parameters()) == models.expected_params(arch)


def test_param_counts_literal():
    assert models.expected_params("gpt2") == 1_635_744
    assert models.expected_params("llama") == 3_235_040
    assert models.expected_params("gpt_neox") == 3_233_600
    assert models.expected_params("bert") == 1_027_610


def test_loaded_shapes(tiny_lm):
    lm = tiny_lm("gpt2")
    assert (lm.n_layers, lm.d_model, lm.n_ctx, lm.vocab_size) == (2, 32, 64, 50257)
    assert lm.is_causal and lm.has_unembed and lm.has_resid_mid and not lm.untrained
    assert lm.device == torch.device("cpu") and lm.dtype == torch.float32
    assert not lm.model.training
    bert = tiny_lm("bert")
    assert not bert.is_causal and bert.has_unembed and bert.vocab_size == 30522


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox", "bert"])
def test_hook_z_is_the_output_projection_input(tiny_lm, arch):
    # attn.hook_z, split into heads, is what the output projection mixes: o_proj(z) == attn_out,
    # and the per-head pieces z_h @ W_O[h] plus the bias add up to it.
    lm = tiny_lm(arch)
    assert (lm.n_heads, lm.d_head) == (4, 8)
    cache = engine.run(lm, engine.encode(lm, ["The cat sat on the mat"]), ["blocks.1.attn.hook_z",
                                                                          "blocks.1.hook_attn_out"])[0]
    z, out = cache["blocks.1.attn.hook_z"], cache["attn_out", 1]
    assert z.shape == (len(cache.encoded), lm.n_heads * lm.d_head)
    o_proj = lm.model.base_model.get_submodule(lm.adapter.blocks)[1].get_submodule(lm.adapter.attn_o)
    with torch.no_grad():
        torch.testing.assert_close(o_proj(z), out, atol=1e-5, rtol=1e-5)
        weight = o_proj.weight if arch != "gpt2" else o_proj.weight.T  # GPT-2's Conv1D is [in, out]
        heads = [z[:, h * 8:(h + 1) * 8] @ weight[:, h * 8:(h + 1) * 8].T for h in range(4)]
        bias = o_proj.bias if o_proj.bias is not None else 0
        torch.testing.assert_close(sum(heads) + bias, out, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("arch, mlp", [("gpt2", "mlp"), ("gemma2", "mlp"), ("bert", "intermediate")])
def test_mlp_hook_in_is_the_mlp_modules_input_on_dense_models(tiny_lm, arch, mlp):
    """``blocks.N.mlp.hook_in`` is registered in every block (it was in MoE blocks only, while sae and circuit read
    it): what anatomy.capture holds equals a forward pre-hook written here on the block's MLP module (Gemma 2: not
    its hook_mlp_out module, the norm after the MLP; BERT: its intermediate)."""
    import anatomy_cli as api

    lm = tiny_lm(arch)
    ids = torch.tensor([lm.tokenizer.hf("The quick brown fox jumps")["input_ids"]])
    blocks = lm.model.base_model.get_submodule(lm.adapter.blocks)
    seen = {}
    handles = [blocks[b].get_submodule(mlp).register_forward_pre_hook(
        lambda _m, args, b=b: seen.__setitem__(b, args[0].detach().clone())) for b in range(lm.n_layers)]
    try:
        with api.capture(lm, [*(f"blocks.{b}.mlp.hook_in" for b in range(lm.n_layers)), "blocks.1.hook_resid_mid"]
                         ) as got, torch.no_grad():
            lm.model(ids)
    finally:
        for h in handles:
            h.remove()
    assert sorted(seen) == list(range(lm.n_layers))
    for b in range(lm.n_layers):
        assert got[f"blocks.{b}.mlp.hook_in"].shape == (1, ids.shape[1], lm.d_model)
        assert_close(got[f"blocks.{b}.mlp.hook_in"], seen[b], atol=0, rtol=0)
    # pre-norm blocks: the MLP reads its norm's output, not the residual (BERT's post-norm block: the same tensor)
    assert bool((got["blocks.1.mlp.hook_in"] - got["blocks.1.hook_resid_mid"]).abs().max() > 1e-3) is (arch != "bert")


def test_hook_names(tiny_lm):
    names = engine.hook_names(tiny_lm("gpt2"))
    assert names[:3] == ["hook_embed", "hook_pos_embed", "blocks.0.hook_resid_pre"]
    assert names[-2:] == ["ln_final.hook_normalized", "logits"]
    assert len([n for n in names if not sites.is_internal(n)]) == 2 + 7 * 2 + 2  # mlp.hook_in in every block
    assert names[3:15] == sites.names([0], "ln1_scale") + sites.names([0], "attn_q") + sites.names([0], "attn_k") \
        + [sites.name(0, p) for p in ("attn_v", "attn_scores", "attn_pattern", "attn_z", "attn_out", "resid_mid",
                                      "ln2_scale", "mlp_in", "mlp_pre")]
    llama = engine.hook_names(tiny_lm("llama"))
    assert "hook_pos_embed" not in llama and "blocks.1.hook_resid_mid" in llama
    neox = engine.hook_names(tiny_lm("gpt_neox"))
    assert not any("resid_mid" in n for n in neox)  # parallel residual
    assert "blocks.1.hook_resid_mid" in engine.hook_names(tiny_lm("gpt_neox_seq"))
    bert = engine.hook_names(tiny_lm("bert"))
    assert "ln_final.hook_normalized" not in bert and "hook_pos_embed" in bert
    with pytest.raises(UsageError, match="parallel residual"):
        engine.layer_names(tiny_lm("gpt_neox"), "resid_mid")
    with pytest.raises(UsageError, match="no hook point 'blocks.9.hook_resid_post'"):
        engine.run(tiny_lm("gpt2"), engine.encode(tiny_lm("gpt2"), ["a"]), ["blocks.9.hook_resid_post"])


@pytest.mark.parametrize("arch", ALL)
def test_resid_post_equals_hidden_states(full_runs, arch):
    lm, enc, cache, out = full_runs[arch]
    hs, L = out.hidden_states, lm.n_layers
    assert len(hs) == L + 1
    assert cache["resid_pre", 0].shape == (len(enc), lm.d_model)
    assert_close(cache["resid_pre", 0], hs[0][0], **TOL)
    for layer in range(L - 1):
        assert_close(cache["resid_post", layer], hs[layer + 1][0], **TOL)
        assert_close(cache["resid_pre", layer + 1], cache["resid_post", layer], atol=0, rtol=0)
    # HF's last hidden state has the final norm applied; the engine's last layer is raw.
    last = cache["resid_post", L - 1]
    assert_close(engine.final_norm(lm, last), hs[L][0], **TOL)
    stream = cache.residual_stream()
    assert stream.shape == (L + 1, len(enc), lm.d_model)
    assert_close(stream[L], last, atol=0, rtol=0)
    if lm.adapter.final_norm:
        assert (stream[L] - hs[L][0]).abs().max() > 1e-2
        assert_close(cache["ln_final.hook_normalized"], hs[L][0], **TOL)


@pytest.mark.parametrize("arch", [a for a in ALL])
def test_logits_and_unembed_equal_model_logits(full_runs, arch):
    lm, enc, cache, out = full_runs[arch]
    assert cache.logits.shape == (len(enc), lm.vocab_size)
    assert_close(cache.logits, out.logits[0], **TOL)
    assert_close(engine.unembed(lm, cache["resid_post", -1]), out.logits[0], **TOL)


def test_gpt2_embed_plus_pos_embed_is_hidden_state_0(full_runs):
    lm, enc, cache, out = full_runs["gpt2"]
    assert_close(cache["hook_embed"] + cache["hook_pos_embed"], out.hidden_states[0][0], **TOL)
    assert_close(cache["hook_embed"], lm.model.transformer.wte.weight[enc.ids], atol=0, rtol=0)


@pytest.mark.parametrize("arch", DECODERS)
def test_residual_decomposition(full_runs, arch):
    lm, enc, cache, out = full_runs[arch]
    for layer in range(lm.n_layers):
        pre, attn, mlp = cache["resid_pre", layer], cache["attn_out", layer], cache["mlp_out", layer]
        assert_close(cache["resid_post", layer], pre + attn + mlp, **TOL)
        if lm.has_resid_mid:
            assert_close(cache["resid_mid", layer], pre + attn, **TOL)
        assert attn.abs().max() > 0 and mlp.abs().max() > 0


def test_bert_post_ln_decomposition(full_runs):
    lm, enc, cache, out = full_runs["bert"]
    for layer, block in enumerate(lm.model.bert.encoder.layer):
        ln_attn, ln_out = block.attention.output.LayerNorm, block.output.LayerNorm
        mid = ln_attn(cache["resid_pre", layer] + cache["attn_out", layer])
        assert_close(cache["resid_mid", layer], mid, **TOL)
        assert_close(cache["resid_post", layer], ln_out(mid + cache["mlp_out", layer]), **TOL)
    # No final norm: final_norm is the identity, so hidden_states[L] is the raw last layer.
    assert_close(cache["resid_post", -1], out.hidden_states[-1][0], **TOL)


def test_final_norm_uses_statistics_of_its_input(full_runs):
    lm, enc, cache, out = full_runs["gpt2"]
    ln = lm.model.transformer.ln_f
    for layer in range(lm.n_layers):
        h = cache["resid_post", layer]
        manual = F.layer_norm(h, (lm.d_model,), ln.weight, ln.bias, ln.eps)
        assert_close(engine.final_norm(lm, h), manual, **TOL)
    llama, enc, cache, out = full_runs["llama"]
    norm = llama.model.model.norm
    h = cache["resid_post", 0]
    manual = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
    assert_close(engine.final_norm(llama, h), manual, **TOL)


PROMPTS = ["Thank you very", "The bank of the river was muddy after the rain", "a", "Money in the bank"]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox", "bert"])
def test_padded_batch_equals_single_runs(tiny_lm, arch):
    lm = tiny_lm(arch)
    enc = engine.encode(lm, PROMPTS)
    names = engine.hook_names(lm)
    batched = engine.run(lm, enc, names, batch_size=4)
    for i, e in enumerate(enc):
        single = engine.run(lm, [e], names, batch_size=1)[0]
        assert batched[i].encoded is e and batched[i].positions == list(range(len(e)))
        for name in names:
            assert batched[i][name].shape[sites.position_axis(name) - 1] == len(e)
            assert_close(batched[i][name], single[name], **TOL)
    # Different prompts really differ: batch item 0 was not copied to the others.
    assert not torch.allclose(batched[0]["resid_post", -1][0], batched[1]["resid_post", -1][0])


def test_positions_keep_only_those(tiny_lm):
    lm = tiny_lm("gpt2")
    enc = engine.encode(lm, PROMPTS[:2])
    names = engine.residual_names(lm) + ["logits", "hook_pos_embed"]
    full = engine.run(lm, enc, names)
    part = engine.run(lm, enc, names, positions=[[-1], [0, 2, -1]])
    assert part[0].positions == [2] and part[1].positions == [0, 2, len(enc[1]) - 1]
    for f, p in zip(full, part):
        assert p.residual_stream().shape == (lm.n_layers + 1, len(p.positions), lm.d_model)
        for name in names:
            assert_close(p[name], f[name][p.positions], **TOL)
    with pytest.raises(UsageError, match="position 5 is out of range for a prompt of 3 tokens"):
        engine.run(lm, enc[:1], names, positions=[[5]])


def test_cache_access(full_runs):
    lm, enc, cache, out = full_runs["gpt2"]
    assert cache["resid_post", -1] is cache["blocks.1.hook_resid_post"]
    assert cache.stack("attn_out").shape == (2, len(enc), 32)
    assert "logits" in cache and cache.get("nope") is None
    with pytest.raises(KeyError, match="was not captured"):
        engine.run(lm, [enc], ["logits"])[0]["hook_embed"]


def test_first_tensor_handles_tensor_and_tuple():
    from anatomy_cli.engine.tensors import first_tensor as _first_tensor

    batch = torch.randn(3, 4, 5)
    assert _first_tensor(batch) is batch  # a block's plain tensor: not batch item 0
    assert _first_tensor((batch, None)) is batch  # an attention module's tuple
    from transformers.modeling_outputs import BaseModelOutput

    assert _first_tensor(BaseModelOutput(last_hidden_state=batch)) is batch


def test_rowwise_padding_keeps_rows_and_shapes(tiny_lm):
    from anatomy_cli.engine.tensors import rowwise as _rowwise

    # _rowwise pads 4-15 rows to 16 on the CPU (a faster BLAS path); results must not change.
    lm = tiny_lm("gpt2")
    head, norm = lm.points["logits"][0], lm.points["ln_final.hook_normalized"][0]
    torch.manual_seed(0)
    for n in (1, 3, 4, 13, 15, 16, 17):
        h = torch.randn(n, lm.d_model)
        with torch.inference_mode():
            assert_close(_rowwise(head, h), head(h), **TOL)
            assert_close(engine.final_norm(lm, h), norm(h), **TOL)
    h = torch.randn(2, 5, lm.d_model)  # leading dims are kept: [2, 5, d] -> [2, 5, vocab]
    lens = engine.unembed(lm, h)
    assert lens.shape == (2, 5, lm.vocab_size)
    assert_close(lens[1, 2], engine.unembed(lm, h[1, 2:3])[0], **TOL)


def test_block_and_attention_outputs_are_whole_batches(tiny_lm):
    lm = tiny_lm("gpt2")
    block, attn = lm.points["blocks.0.hook_resid_post"][0], lm.points["blocks.0.hook_attn_out"][0]
    seen = {}
    h1 = block.register_forward_hook(lambda m, a, o: seen.__setitem__("block", o))
    h2 = attn.register_forward_hook(lambda m, a, o: seen.__setitem__("attn", o))
    try:
        enc = engine.encode(lm, ["one two", "three four"])
        engine.run(lm, enc, ["blocks.0.hook_attn_out", "blocks.0.hook_resid_post"])
    finally:
        h1.remove(), h2.remove()
    assert isinstance(seen["block"], torch.Tensor) and isinstance(seen["attn"], tuple)
    assert seen["block"].shape[0] == 2 and seen["attn"][0].shape[0] == 2


def _hook_count(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_no_hooks_remain_after_run_or_exception(tiny_lm, monkeypatch):
    lm = tiny_lm("llama")
    before = _hook_count(lm.model)
    enc = engine.encode(lm, PROMPTS)
    engine.run(lm, enc, engine.hook_names(lm))
    assert _hook_count(lm.model) == before
    with engine.capture(lm, engine.hook_names(lm)):
        assert _hook_count(lm.model) > before

    def boom(*args, **kwargs):
        raise RuntimeError("boom inside the forward")

    monkeypatch.setattr(lm.model.model.layers[1].mlp, "forward", boom)
    with pytest.raises(RuntimeError, match="boom"):
        engine.run(lm, enc, engine.hook_names(lm))
    assert _hook_count(lm.model) == before


def test_attach_removes_every_hook_after_an_exception():
    # engine.attach (hook points by name) and attach_modules (any module) register in one place and remove
    # every handle in `finally`: a raise inside the block leaves no hook on any module. A model of its own:
    # transformers keeps hooks of its own on a model once output_hidden_states has been asked for.
    from conftest import build_gpt2_tokenizer

    lm = engine.from_model(models.build_model("gpt2"), build_gpt2_tokenizer(), name="gpt2")
    enc = engine.encode(lm, [PROMPT])[0]
    ids = torch.tensor([enc.ids])
    seen = []
    hooks = [("blocks.0.hook_resid_post", lambda t: t + 1.0),           # two on one point, in order:
             ("blocks.0.hook_resid_post", lambda t: seen.append(t.clone())),   # the second sees the first's
             ("blocks.1.hook_resid_pre", lambda t: seen.append(t.clone())),
             ("blocks.1.attn.hook_z", lambda t: None)]                  # an input-side point
    attn = lm.model.base_model.get_submodule(lm.adapter.blocks)[1].get_submodule(lm.adapter.attn[0])
    raw = []
    with pytest.raises(RuntimeError, match="inside the block"):
        with engine.attach(lm, hooks), engine.attach_modules([(attn, "output", raw.append)], raw=True):
            assert _hook_count(lm.model) == 5
            with torch.no_grad():
                engine.forward(lm, ids)
            raise RuntimeError("raised inside the block")
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in lm.model.modules())
    with pytest.raises(UsageError, match="no hook point"):
        with engine.attach(lm, {"blocks.0.hook_nothing": lambda t: None}):
            pass
    assert _hook_count(lm.model) == 0
    assert isinstance(raw[0], tuple)                    # attach_modules(raw=True): the module's whole output
    with torch.no_grad():  # (transformers installs hooks of its own for output_hidden_states: last)
        plain = lm.model(ids, output_hidden_states=True).hidden_states[1][0]
    assert_close(seen[0][0], plain + 1.0, **TOL)        # block 0's output, replaced
    assert_close(seen[1][0], plain + 1.0, **TOL)        # what block 1 then read


def test_inference_mode_and_no_grad(full_runs):
    lm, enc, cache, out = full_runs["gpt2"]
    assert not cache["resid_post", 0].requires_grad
    # The forward ran in inference mode; the cache holds ordinary tensors usable with parameters.
    assert not cache["resid_post", 0].is_inference()
    assert torch.is_inference_mode_enabled() is False


def test_bad_prompts(tiny_lm):
    lm = tiny_lm("gpt2")
    with pytest.raises(UsageError, match="empty prompt"):
        engine.run(lm, engine.encode(lm, [""]), ["logits"])
    too_big = engine.encode(lm, ["a"])[0]
    too_big = type(too_big)(**{**too_big.__dict__, "ids": [60000]})
    with pytest.raises(AnatomyError, match="outside"):
        engine.run(lm, [too_big], ["logits"])


def test_bf16_run(tiny_model_dir):
    lm = engine.load(str(tiny_model_dir("gpt2")), device="cpu", dtype="bf16")
    assert lm.dtype == torch.bfloat16
    cache = engine.run(lm, engine.encode(lm, ["Thank you very"]), ["logits", "blocks.1.hook_resid_post"])[0]
    assert cache.logits.dtype == torch.bfloat16 and cache.logits.shape == (3, 50257)
    assert_close(engine.unembed(lm, cache["resid_post", -1]), cache.logits, atol=0, rtol=0)


def test_offloaded_model_matches_in_memory(tiny_lm, tiny_model_dir, tmp_path):
    lm = tiny_lm("gpt2")
    off = engine.load(str(tiny_model_dir("gpt2")), device_map="auto",
                      max_memory={"cpu": 2_000_000}, offload_folder=str(tmp_path / "offload"))
    assert "disk" in set(off.model.hf_device_map.values())
    assert off.device == torch.device("cpu")
    enc = engine.encode(lm, PROMPTS[:2])
    names = engine.hook_names(lm)
    for a, b in zip(engine.run(lm, enc, names), engine.run(off, enc, names)):
        for name in names:
            assert_close(b[name], a[name], **TOL)
