"""More GGUF MoE files (issue 50): every tiny MoE GGUF of tests/test_gguf_moe.py (OLMoE included: llama.cpp's
``olmoe``, which transformers' own GGUF reader cannot read) gives its source's logits; older llama.cpp Mixtral
files, one tensor per expert (``blk.N.ffn_gate.E.weight``), load as the merged stacks do."""

from __future__ import annotations

import pytest
import torch
from test_gguf_moe import ARCHS
from test_gguf_moe import PROMPT
from test_gguf_moe import _json
from test_gguf_moe import build_source
from test_gguf_moe import routing
from test_gguf_moe import write_moe_gguf
from torch.testing import assert_close

from anatomy_cli import engine
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.headers import read_gguf


@pytest.fixture(scope="module")
def sources():
    return {arch: build_source(arch) for arch in ARCHS}


def _logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double()


@pytest.mark.parametrize("arch", list(ARCHS))
def test_moe_gguf_gives_the_source_logits(sources, tmp_path, arch):
    src = sources[arch]
    lm = engine.load(str(write_moe_gguf(tmp_path / f"{arch}.gguf", arch, src)), device="cpu")
    ids = engine.encode(lm, [PROMPT])[0].ids
    assert lm.model.config.model_type == src.config.model_type
    assert_close(_logits(lm.model, ids), _logits(src, ids), rtol=0, atol=1e-5)


def test_olmoe_gguf_reads_its_header_as_the_source_config(sources, tmp_path):
    """transformers reads no `olmoe` GGUF: anatomy builds the config (norm_topk_prob false, as llama.cpp's OLMoE
    routes) and keeps the q/k norms full width as OLMoE's are."""
    src = sources["olmoe"]
    lm = engine.load(str(write_moe_gguf(tmp_path / "olmoe.gguf", "olmoe", src)), device="cpu")
    ours, theirs = lm.model.config, src.config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "num_experts", "num_experts_per_tok", "norm_topk_prob", "tie_word_embeddings", "vocab_size",
                "max_position_embeddings"):
        assert getattr(ours, key) == getattr(theirs, key), key
    assert ours.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)  # a float32 in the file
    assert ours.rope_parameters["rope_theta"] == theirs.rope_parameters["rope_theta"]
    assert lm.model.get_parameter("model.layers.0.self_attn.q_norm.weight").shape == (theirs.hidden_size,)


def test_olmoe_gguf_keeps_its_q_k_v_clip(tmp_path):
    """OLMoE's ``clip_qkv`` (llama.cpp's ``olmoe.attention.clamp_kqv``), small enough here to change the logits."""
    src = build_source("olmoe")
    ids = engine.encode(engine.load(str(write_moe_gguf(tmp_path / "plain.gguf", "olmoe", src)), device="cpu"),
                        [PROMPT])[0].ids
    plain = _logits(src, ids)
    src.config.clip_qkv = 0.02  # the attention layers read this config object
    clipped = _logits(src, ids)
    assert (clipped - plain).abs().max() > 1e-4
    lm = engine.load(str(write_moe_gguf(tmp_path / "clip.gguf", "olmoe", src)), device="cpu")
    assert lm.model.config.clip_qkv == pytest.approx(0.02)
    assert_close(_logits(lm.model, ids), clipped, rtol=0, atol=1e-5)


def test_an_olmoe_gguf_with_a_placement_is_refused_in_one_line(tmp_path):
    with pytest.raises(UsageError) as exc:
        engine.load(str(write_moe_gguf(tmp_path / "olmoe.gguf", "olmoe")), device_map="auto")
    assert "\n" not in str(exc.value) and "loads on one device" in str(exc.value)


def test_olmoe_gguf_routes_on_the_command_line(sources, tmp_path):
    """`route` on the OLMoE file: the experts and weights of transformers' router logits, not renormalised."""
    src = sources["olmoe"]
    data = _json("route", PROMPT, "--model", str(write_moe_gguf(tmp_path / "olmoe.gguf", "olmoe", src)))
    ref = routing(src, data["token_ids"])
    for row in data["rows"]:
        idx, w = ref[row["block"]]
        assert row["experts"] == idx[row["position"]].tolist()
        assert row["weights"] == pytest.approx(w[row["position"]].tolist(), rel=1e-5)
        assert sum(row["weights"]) < 1  # top-2 of 4 probabilities, kept as they are


# ---------------------------------------------------------------- older Mixtral files: one tensor per expert

def test_a_per_expert_mixtral_gguf_holds_what_older_llama_cpp_wrote(tmp_path):
    names = {t.name for t in read_gguf(str(write_moe_gguf(tmp_path / "old.gguf", "mixtral", per_expert=True))).tensors}
    assert {"blk.0.ffn_gate.3.weight", "blk.1.ffn_up.0.weight", "blk.1.ffn_down.2.weight"} <= names
    assert not any("_exps" in n for n in names) and "blk.0.ffn_gate_inp.weight" in names


@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_per_expert_mixtral_gguf_loads_as_the_merged_one(sources, tmp_path, quant):
    """The same parameters as the merged file's, bit for bit (F32: the source's), the source's logits, and the
    chosen experts and weights of transformers' router logits on the source."""
    src = sources["mixtral"]
    old = engine.load(str(write_moe_gguf(tmp_path / "old.gguf", "mixtral", src, quant, per_expert=True)), device="cpu")
    new = engine.load(str(write_moe_gguf(tmp_path / "new.gguf", "mixtral", src, quant)), device="cpu")
    ours, theirs = dict(old.model.named_parameters()), dict(new.model.named_parameters())
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[n], theirs[n]) for n in ours)
    if quant == "Q8_0":
        return
    assert all(torch.equal(ours[n], p) for n, p in src.named_parameters())
    enc = engine.encode(old, [PROMPT])[0]
    assert_close(_logits(old.model, enc.ids), _logits(src, enc.ids), rtol=0, atol=1e-5)
    names = [f"blocks.{b}.mlp.hook_expert_{k}" for b in range(2) for k in ("indices", "weights")]
    [cache] = engine.run(old, [enc], names)
    for b, (idx, w) in routing(src, enc.ids).items():
        assert torch.equal(cache[f"blocks.{b}.mlp.hook_expert_indices"], idx)
        assert_close(cache[f"blocks.{b}.mlp.hook_expert_weights"].float(), w, rtol=1e-5, atol=1e-6)


def _rewritten(path, arch, src, change, per_expert=True):
    """``arch``'s file with its tensors (per expert, as older Mixtral files: :func:`split_experts`; else merged,
    ``_tensors``) rewritten by ``change`` (``{name: array}`` -> same)."""
    import test_gguf_moe

    step = "split_experts" if per_expert else "_tensors"
    real = getattr(test_gguf_moe, step)
    try:
        setattr(test_gguf_moe, step, lambda tensors: change(real(tensors)))
        return write_moe_gguf(path, arch, src, per_expert=per_expert)
    finally:
        setattr(test_gguf_moe, step, real)


def test_a_per_expert_mixtral_gguf_missing_an_expert_fails_in_one_line(sources, tmp_path):
    path = _rewritten(tmp_path / "short.gguf", "mixtral", sources["mixtral"],
                      lambda t: {k: v for k, v in t.items() if k != "blk.1.ffn_up.2.weight"})
    with pytest.raises(CheckpointError) as exc:
        engine.load(str(path), device="cpu")
    assert "\n" not in str(exc.value) and "lacks the up half of model.layers.1.mlp.experts.gate_up_proj" in str(
        exc.value)


def test_a_per_expert_mixtral_gguf_naming_an_expert_past_the_count_fails_in_one_line(sources, tmp_path):
    path = _rewritten(tmp_path / "extra.gguf", "mixtral", sources["mixtral"],
                      lambda t: {**t, "blk.0.ffn_down.4.weight": t["blk.0.ffn_down.0.weight"]})
    with pytest.raises(CheckpointError) as exc:
        engine.load(str(path), device="cpu")
    assert "\n" not in str(exc.value) and "names expert 4" in str(exc.value) and "4 experts" in str(exc.value)


@pytest.mark.parametrize("arch", ["qwen3_moe", "olmoe"])
def test_a_merged_moe_gguf_missing_one_half_of_its_experts_fails_in_one_line(sources, tmp_path, arch):
    """Without ``ffn_gate_exps`` the gathered ``gate_up_proj`` would keep a half of zeros: refused instead."""
    path = _rewritten(tmp_path / "half.gguf", arch, sources[arch],
                      lambda t: {k: v for k, v in t.items() if k != "blk.0.ffn_gate_exps.weight"}, per_expert=False)
    with pytest.raises(CheckpointError) as exc:
        engine.load(str(path), device="cpu")
    assert "\n" not in str(exc.value) and "lacks the gate half of model.layers.0.mlp.experts.gate_up_proj" in str(
        exc.value)
