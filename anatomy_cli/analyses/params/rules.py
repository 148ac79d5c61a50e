"""The categories of the parameter breakdown and the per-family tables of name rules.

Every parameter tensor lands in the category of the first rule of its family's table whose
pattern matches its name (the checkpoint's own names); :data:`GENERIC` serves architectures
no family claims. Data and two lookups (:func:`family_for`, :func:`classify`); no torch.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# ---------------------------------------------------------------------------
# Categories and the per-family rule tables

TOKEN = "token_embedding"
POSITION = "position_embedding"
TOKEN_TYPE = "token_type_embedding"
ATTENTION = "attention"
FFN = "ffn"
ROUTER = "router"
ROUTED = "routed_experts"
SHARED = "shared_experts"
NORM = "norm_other"
HEAD = "lm_head"

CATEGORIES = (TOKEN, POSITION, TOKEN_TYPE, ATTENTION, FFN, ROUTER, ROUTED, SHARED, NORM, HEAD)
LABELS = {
    TOKEN: "Token Embedding",
    POSITION: "Position Embedding",
    TOKEN_TYPE: "Token-type Embedding",
    ATTENTION: "Attention",
    FFN: "FFN",
    ROUTER: "Router",
    ROUTED: "Routed experts",
    SHARED: "Shared experts",
    NORM: "LayerNorm + other",
    HEAD: "LM head",
}
# Categories that live inside the blocks; their labels carry the layer count.
BLOCK_CATEGORIES = (ATTENTION, FFN, ROUTER, ROUTED, SHARED)
EMBEDDINGS = (TOKEN, POSITION, TOKEN_TYPE)
# Per-layer columns, in order.
LAYER_CATEGORIES = (ATTENTION, FFN, ROUTER, ROUTED, SHARED, NORM)

_S = r"(?:^|\.)"  # start of a name or of a path component

_MOE_RULES = (
    (SHARED, r"\.mlp\.shared_experts?(?:_gate)?\."),  # DeepSeek shared_experts; Qwen2-MoE shared_expert(+_gate)
    (ROUTER, r"\.mlp\.(?:gate|router)\."),  # the routing linear (not gate_proj)
    (ROUTED, r"\.mlp\.experts\."),  # fused [n_experts, ...] tensors or experts.<i>.*
)


@dataclass(frozen=True)
class Family:
    """A named table of (category, regex) rules; the first rule that matches wins."""

    name: str
    model_types: tuple[str, ...]
    rules: tuple[tuple[str, str], ...]


FAMILIES: tuple[Family, ...] = (
    Family("gpt2", ("gpt2",), (
        (TOKEN, _S + r"wte\."),
        (POSITION, _S + r"wpe\."),
        (ATTENTION, r"\.(?:attn|crossattention)\."),
        (FFN, r"\.mlp\."),
        (NORM, _S + r"ln_(?:1|2|f|cross_attn)\."),
        (HEAD, r"^lm_head\."),
    )),
    Family("llama", ("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe",
                     "deepseek_v2", "deepseek_v3", "olmoe", "gpt_oss"), (
        (TOKEN, _S + r"embed_tokens\."),
        (ATTENTION, r"\.self_attn\."),  # includes QK-norms, MLA's latent norms, gpt-oss sinks
        *_MOE_RULES,
        (FFN, r"\.mlp\."),
        (NORM, r"\.(?:input_layernorm|post_attention_layernorm)\.|" + _S + r"norm\."),
        (HEAD, r"^lm_head\."),
    )),
    Family("gpt_neox", ("gpt_neox",), (
        (TOKEN, _S + r"embed_in\."),
        (ATTENTION, r"\.attention\."),
        (FFN, r"\.mlp\."),
        (NORM, r"\.(?:input_layernorm|post_attention_layernorm)\.|" + _S + r"final_layer_norm\."),
        (HEAD, r"^(?:lm_head|embed_out)\."),
    )),
    Family("opt", ("opt",), (
        (TOKEN, _S + r"embed_tokens\."),
        (POSITION, _S + r"embed_positions\."),
        (ATTENTION, r"\.self_attn\."),
        (FFN, r"\.fc[12]\."),
        (NORM, r"layer_norm\.|" + _S + r"project_(?:in|out)\."),
        (HEAD, r"^lm_head\."),
    )),
    Family("bert", ("bert", "roberta", "xlm-roberta", "distilbert"), (
        (HEAD, r"^(?:cls|lm_head|vocab_transform|vocab_layer_norm|vocab_projector)\."),
        (TOKEN, _S + r"embeddings\.word_embeddings\."),
        (POSITION, _S + r"embeddings\.position_embeddings\."),
        (TOKEN_TYPE, _S + r"embeddings\.token_type_embeddings\."),
        (NORM, r"LayerNorm\.|layer_norm\.|" + _S + r"pooler\."),
        (ATTENTION, r"\.attention\."),
        (FFN, r"\.(?:intermediate|output)\.dense\.|\.ffn\."),
    )),
)

# Best effort for every other architecture: the usual names across transformers.
GENERIC = Family("generic", (), (
    (POSITION, _S + r"(?:wpe|embed_positions|position_embeddings|pos_emb\w*)\."),
    (TOKEN_TYPE, _S + r"token_type_embeddings\."),
    (TOKEN, _S + r"(?:wte|embed_tokens|word_embeddings|embed_in|tok_embeddings)\."),
    (HEAD, r"^(?:lm_head|embed_out|output)\."),
    (SHARED, r"\.shared_experts?(?:_gate)?\."),
    (ROUTER, r"\.(?:mlp|moe|block_sparse_moe|feed_forward)\.(?:gate|router)\."),
    (ROUTED, r"\.experts\."),
    (NORM, r"(?i)norm|" + _S + r"ln\w*\."),
    (ATTENTION, r"(?i)attn|attention"),  # T5's SelfAttention / EncDecAttention too
    (FFN, r"(?i)mlp|ffn|feed_?forward|densereludense|" + _S + r"fc\d\.|intermediate|dense_(?:h_to_4h|4h_to_h)"),
))

# The block a tensor belongs to: the first "<stack>.<i>" in its name, e.g. transformer.h.3,
# model.layers.3, encoder.block.3 (a path, so encoder and decoder blocks stay apart).
_LAYER_RE = re.compile(r"^((?:.*?\.)?(?:h|layers|layer|blocks|block)\.(\d+))\.")
_EXPERT_INDEX_RE = re.compile(r"\.experts\.(\d+)\.")

# Bytes per parameter as bits (int4 packs two parameters per byte).
DTYPE_BITS = {"fp32": 32, "fp16": 16, "bf16": 16, "int8": 8, "int4": 4}

# Config attributes that hold the number of experts each token is routed to, and the number of routed experts.
_TOP_K_ATTRS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "num_selected_experts", "moe_k")
_N_EXPERTS_ATTRS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def family_for(model_type: str) -> Family:
    """The rule table for ``model_type``; :data:`GENERIC` when none claims it."""
    for family in FAMILIES:
        if model_type in family.model_types:
            return family
    return GENERIC


def classify(name: str, family: Family) -> str | None:
    """The category of parameter ``name`` by ``family``'s rules, or None when no rule matches."""
    for category, pattern in family.rules:
        if re.search(pattern, name):
            return category
    return None


def memory_bytes(n_params: int, dtype: str) -> int:
    """Bytes to hold ``n_params`` parameters in ``dtype`` (one of :data:`DTYPE_BITS`), rounded up."""
    return math.ceil(n_params * DTYPE_BITS[dtype] / 8)
