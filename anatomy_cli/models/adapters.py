"""Where each architecture keeps its parts: one small declarative table per family.

Paths are module paths in the model's own names (``model.named_modules()`` of the
``transformers`` class, which match the checkpoint keys minus ``.weight``):

* ``embed``, ``pos_embed``, ``blocks``, ``final_norm`` are relative to the base
  model (``model.base_model``: ``GPT2Model``, ``LlamaModel``, ``BertModel``, ...),
  which a head model (``GPT2LMHeadModel``, ...) holds under ``prefix``;
* ``attn``, ``mlp``, ``norms`` and the taps are relative to one block;
* ``unembed`` is relative to the head model (absent in a bare ``BertModel``).

A :class:`Tap` names the module whose input or output is a hook point. The engine
turns the table into forward hooks; ``params`` uses :func:`component` to sort
parameter names into parts. Plain data: importable without torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Literal

from anatomy_cli.errors import UnsupportedArchitecture

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig

    from anatomy_cli.models.json_config import JsonConfig


@dataclass(frozen=True)
class Tap:
    """A hook point: the ``input`` (first positional argument) or ``output`` of ``module``.

    ``copy``: the block later changes the tensor in place (Falcon's ``mlp_output += attention_output``),
    so the hook keeps a copy. ``flat``: the module sees ``[batch * pos, d]`` (OPT reshapes before its
    MLP); the hook gives it back its ``[batch, pos, d]`` shape from the block's input.
    """

    module: str
    side: Literal["input", "output"] = "output"
    copy: bool = False
    flat: bool = False


@dataclass(frozen=True)
class Adapter:
    """Module paths of one architecture family (see the module docstring for what each is relative to)."""

    name: str
    model_types: tuple[str, ...]   # config.model_type values this table serves
    causal: bool                   # decoder-only: each position sees its left context only
    prefix: str                    # attribute of the head model that holds the base model
    embed: str                     # token embedding (output: hook_embed)
    pos_embed: str | None          # learned position embedding (output: hook_pos_embed); None for rotary
    blocks: str                    # the ModuleList of blocks
    final_norm: str | None         # norm after the last block (output: ln_final.hook_normalized)
    unembed: str | None            # LM head, relative to the head model (output: logits)
    attn: tuple[str, ...]          # attention sub-modules (parameter classification)
    mlp: tuple[str, ...]           # feed-forward sub-modules
    norms: tuple[str, ...]         # norms inside a block
    attn_out: Tap                  # what attention adds to the residual (post-LN: before Add & Norm)
    mlp_out: Tap                   # what the feed-forward adds to the residual
    resid_mid: Tap | None          # residual between attention and feed-forward; None: no such point
    attn_o: str                    # attention's output projection (its input, per head, is hook_z)
    post_ln: bool = False          # Add & Norm after each sub-layer (BERT): resid_post != pre + attn + mlp
    parallel_flag: str | tuple[str, ...] | None = None  # config attribute(s); when any is true, attention
    # and MLP both read resid_pre (GPT-NeoX parallel residual) and there is no resid_mid
    when: tuple[str, object] | None = None  # (config attribute, value): this row serves only such configs
    embed_proj: str | None = None  # base-relative projection from the embedding width to d_model, when the
    # model has it (OPT-350m's project_in): hook_embed is its output
    unembed_proj: str | None = None  # base-relative projection after the final norm, before the LM head
    # (OPT-350m's project_out), when the model has it; the lens applies it
    positions_after_pad: bool = False  # position ids start at config.pad_token_id + 1 (RoBERTa)
    qk_proj: tuple[str, str] | None = None  # rotary models' query and key projections (their outputs, per head,
    # are attn.hook_q and attn.hook_k, before RoPE); None: fused, or no rotary embedding
    mlp_pre: str | None = None     # the MLP's first projection (a gated MLP's gate): its output is mlp.hook_pre
    mlp_post: str | None = None    # the MLP's output projection: its input is mlp.hook_post


GPT2 = Adapter(
    name="gpt2", model_types=("gpt2",), causal=True, prefix="transformer",
    embed="wte", pos_embed="wpe", blocks="h", final_norm="ln_f", unembed="lm_head",
    attn=("attn",), mlp=("mlp",), norms=("ln_1", "ln_2"),
    attn_out=Tap("attn"), mlp_out=Tap("mlp"), resid_mid=Tap("ln_2", "input"), attn_o="attn.c_proj",
    mlp_pre="mlp.c_fc", mlp_post="mlp.c_proj",
)

# One pre-norm layout: Llama, Mistral, Qwen2/3, Gemma (its embedding module multiplies by sqrt(d_model):
# hook_embed is already scaled), OLMo (LayerNorm without weights), Starcoder2 (LayerNorm, c_fc/c_proj),
# and the MoE models Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, whose `mlp` is the whole MoE block (router,
# experts and Qwen2-MoE's gated shared expert), so mlp_out is its output.
LLAMA = Adapter(
    name="llama", model_types=("llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "olmoe",
                               "gemma", "olmo", "starcoder2"), causal=True, prefix="model",
    embed="embed_tokens", pos_embed=None, blocks="layers", final_norm="norm", unembed="lm_head",
    attn=("self_attn",), mlp=("mlp",), norms=("input_layernorm", "post_attention_layernorm"),
    attn_out=Tap("self_attn"), mlp_out=Tap("mlp"), resid_mid=Tap("post_attention_layernorm", "input"),
    attn_o="self_attn.o_proj", qk_proj=("self_attn.q_proj", "self_attn.k_proj"), mlp_pre="mlp.gate_proj",
    mlp_post="mlp.down_proj",
)

# Phi-3: fused qkv_proj and gate_up_proj; what is added to the residual leaves through a dropout module.
PHI3 = replace(LLAMA, name="phi3", model_types=("phi3",),
               attn_out=Tap("resid_attn_dropout"), mlp_out=Tap("resid_mlp_dropout"))

# StableLM: LayerNorm; with use_parallel_residual the MLP reads the attention's norm output and the block
# has no post_attention_layernorm.
STABLELM = replace(LLAMA, name="stablelm", model_types=("stablelm",), mlp_out=Tap("dropout"),
                   parallel_flag="use_parallel_residual")

# Sandwich norms (Gemma 2, Gemma 3 text): each sub-layer's output is normed again before it is added,
# so attn_out/mlp_out are the post-norms' outputs. Final logits are soft-capped (config).
GEMMA2 = replace(LLAMA, name="gemma2", model_types=("gemma2", "gemma3_text"),
                 norms=("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                        "post_feedforward_layernorm"),
                 attn_out=Tap("post_attention_layernorm"), mlp_out=Tap("post_feedforward_layernorm"),
                 resid_mid=Tap("pre_feedforward_layernorm", "input"))

# Gemma 3 multimodal checkpoints (4B and up): the same text decoder inside Gemma3Model, next to a vision
# tower that text prompts never reach.
GEMMA3 = replace(GEMMA2, name="gemma3", model_types=("gemma3",), embed="language_model.embed_tokens",
                 blocks="language_model.layers", final_norm="language_model.norm")

# OLMo 2/3: no norm before a sub-layer, one after it (post_attention_layernorm, post_feedforward_layernorm).
OLMO2 = replace(LLAMA, name="olmo2", model_types=("olmo2", "olmo3"),
                norms=("post_attention_layernorm", "post_feedforward_layernorm"),
                attn_out=Tap("post_attention_layernorm"), mlp_out=Tap("post_feedforward_layernorm"),
                resid_mid=Tap("mlp", "input"))

# Pythia checkpoints name the head `embed_out`; transformers v5 loads it as `lm_head`.
GPT_NEOX = Adapter(
    name="gpt_neox", model_types=("gpt_neox",), causal=True, prefix="gpt_neox",
    embed="embed_in", pos_embed=None, blocks="layers", final_norm="final_layer_norm", unembed="lm_head",
    attn=("attention",), mlp=("mlp",), norms=("input_layernorm", "post_attention_layernorm"),
    attn_out=Tap("attention"), mlp_out=Tap("mlp"), resid_mid=Tap("post_attention_layernorm", "input"),
    attn_o="attention.dense", parallel_flag="use_parallel_residual", mlp_pre="mlp.dense_h_to_4h",
    mlp_post="mlp.dense_4h_to_h",
)

# GPT-J: attention and MLP both read ln_1's output (parallel, always): no resid_mid.
GPTJ = Adapter(
    name="gptj", model_types=("gptj",), causal=True, prefix="transformer",
    embed="wte", pos_embed=None, blocks="h", final_norm="ln_f", unembed="lm_head",
    attn=("attn",), mlp=("mlp",), norms=("ln_1",),
    attn_out=Tap("attn"), mlp_out=Tap("mlp"), resid_mid=None, attn_o="attn.out_proj",
    qk_proj=("attn.q_proj", "attn.k_proj"), mlp_pre="mlp.fc_in", mlp_post="mlp.fc_out",
)

# Falcon: parallel attention and MLP (parallel_attn, or the new decoder architecture with ln_attn/ln_mlp);
# falcon-rw is sequential. The block adds attention's output to the MLP's output in place: keep a copy.
FALCON = Adapter(
    name="falcon", model_types=("falcon",), causal=True, prefix="transformer",
    embed="word_embeddings", pos_embed=None, blocks="h", final_norm="ln_f", unembed="lm_head",
    attn=("self_attention",), mlp=("mlp",), norms=("input_layernorm", "post_attention_layernorm", "ln_attn", "ln_mlp"),
    attn_out=Tap("self_attention"), mlp_out=Tap("mlp", copy=True), resid_mid=Tap("post_attention_layernorm", "input"),
    attn_o="self_attention.dense", parallel_flag=("parallel_attn", "new_decoder_architecture"),
)

# OPT: learned positions stored with an offset of 2 (the module adds it to the position ids); the MLP
# works on [batch * pos, d] rows. OPT-350m projects 512 -> 1024 (project_in) and back (project_out).
OPT = Adapter(
    name="opt", model_types=("opt",), causal=True, prefix="model",
    embed="decoder.embed_tokens", pos_embed="decoder.embed_positions", blocks="decoder.layers",
    final_norm="decoder.final_layer_norm", unembed="lm_head",
    attn=("self_attn",), mlp=("fc1", "fc2"), norms=("self_attn_layer_norm", "final_layer_norm"),
    attn_out=Tap("self_attn"), mlp_out=Tap("fc2", flat=True), resid_mid=Tap("final_layer_norm", "input", flat=True),
    attn_o="self_attn.out_proj", when=("do_layer_norm_before", True),
    embed_proj="decoder.project_in", unembed_proj="decoder.project_out",
)

# OPT-350m is post-LN (do_layer_norm_before=False): Add & Norm after each sub-layer, no final norm.
OPT_POST_LN = replace(OPT, name="opt_post_ln", when=("do_layer_norm_before", False), final_norm=None,
                      resid_mid=Tap("self_attn_layer_norm"), post_ln=True)

# Post-LN encoder: each sub-layer's output goes through Add & Norm. attn_out/mlp_out are the
# sub-layer outputs before that Add & Norm; resid_mid is the attention's Add & Norm output.
BERT = Adapter(
    name="bert", model_types=("bert",), causal=False, prefix="bert",
    embed="embeddings.word_embeddings", pos_embed="embeddings.position_embeddings", blocks="encoder.layer",
    final_norm=None, unembed="cls",
    attn=("attention",), mlp=("intermediate", "output"), norms=("attention.output.LayerNorm", "output.LayerNorm"),
    attn_out=Tap("attention.output.dropout"), mlp_out=Tap("output.dropout"),
    resid_mid=Tap("attention.output.LayerNorm"), attn_o="attention.output.dense", post_ln=True,
    mlp_pre="intermediate.dense", mlp_post="output.dense",
)

# RoBERTa: BERT's layout under `roberta`, head `lm_head`; position ids start after the padding index.
ROBERTA = replace(BERT, name="roberta", model_types=("roberta",), prefix="roberta", unembed="lm_head",
                  positions_after_pad=True)


def heads_split(adapter: Adapter) -> str | None:
    """How a family's attention output splits into heads: ``projection`` (the output projection's output is
    ``attn_out``, or a dropout after it), ``norm`` (a norm after the projection, Gemma 2/3's sandwich norm:
    its scale is frozen), None (neither: ``--by head`` cannot be decomposed; ``--by layer`` can). Pure: needs
    only the adapter table (``opened.adapter``), so a command can refuse before the weights load."""
    tap = adapter.attn_out.module
    if tap in adapter.norms:
        return "norm"
    if tap in adapter.attn or tap.rsplit(".", 1)[-1].endswith("dropout"):
        return "projection"
    return None


ADAPTERS: tuple[Adapter, ...] = (GPT2, LLAMA, PHI3, STABLELM, GEMMA2, GEMMA3, OLMO2, GPT_NEOX, GPTJ, FALCON, OPT,
                                 OPT_POST_LN, BERT, ROBERTA)


# Families whose files `params` reads but whose forward no adapter runs, and why (the refusal of every other
# command says it). DeepSeek-V2/V3: multi-head latent attention (the per-head value width, ``v_head_dim``, is not
# d_model / heads) and a router whose choice is not its weights' (sigmoid scores plus ``e_score_correction_bias``,
# top k within the best ``topk_group`` of ``n_group`` groups, weights scaled by ``routed_scaling_factor``, plus
# ungated shared experts): `route` and `ablate --experts` would read it wrongly with the softmax rule.
NOT_RUN = {t: "DeepSeek's multi-head latent attention and group-limited, bias-corrected routing (sigmoid scores, "
              "routed_scaling_factor, shared experts) have no adapter, so no command runs its forward; "
              "`anatomy params` reads its files" for t in ("deepseek_v2", "deepseek_v3")}


def supported_model_types() -> list[str]:
    """Every ``config.model_type`` with an adapter, once each, e.g. ``['gpt2', 'llama', ...]``."""
    return list(dict.fromkeys(t for a in ADAPTERS for t in a.model_types))


def for_model_type(model_type: str | None) -> Adapter:
    """The (first) adapter for ``model_type``; enough to know it is supported before a config is
    built. Raises UnsupportedArchitecture naming the supported ones."""
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    why = f": {NOT_RUN[model_type]}" if model_type in NOT_RUN else ""
    raise UnsupportedArchitecture(
        f"architecture '{model_type}' is not supported{why}; supported: {', '.join(supported_model_types())}")


def for_config(config: PreTrainedConfig | JsonConfig) -> Adapter:
    """The adapter for a ``transformers`` config: by ``config.model_type``, then the row whose
    ``when`` condition the config meets (OPT pre-LN or post-LN)."""
    model_type = getattr(config, "model_type", None)
    rows = [a for a in ADAPTERS if model_type in a.model_types]
    for adapter in rows:
        if adapter.when is None or getattr(config, adapter.when[0], None) == adapter.when[1]:
            return adapter
    return for_model_type(model_type) if not rows else rows[0]


def has_resid_mid(adapter: Adapter, config: PreTrainedConfig | JsonConfig) -> bool:
    """False for a parallel-residual block (attention and MLP both read resid_pre)."""
    if adapter.resid_mid is None:
        return False
    flags = (adapter.parallel_flag,) if isinstance(adapter.parallel_flag, str) else adapter.parallel_flag or ()
    return not any(getattr(config, flag, False) for flag in flags)


_LAYER = re.compile(r"^(\d+)\.(.*)$")


def _under(path: str, roots: tuple[str, ...] | str | None) -> bool:
    roots = (roots,) if isinstance(roots, str) else roots or ()
    return any(path == r or path.startswith(r + ".") for r in roots)


def component(adapter: Adapter, name: str) -> tuple[str, int | None]:
    """Classify a parameter (or module) name into ``(part, layer)``.

    ``name`` may carry the head model's prefix or not (``transformer.h.3.attn.c_attn.weight``
    or ``h.3.attn.c_attn.weight``). ``part`` is one of ``embed``, ``pos_embed``, ``attn``,
    ``mlp``, ``norm`` (inside a block), ``final_norm``, ``unembed``, ``other``;
    ``layer`` is the block index for block parts, else None.
    """
    if _under(name, adapter.unembed):
        return "unembed", None
    path = name[len(adapter.prefix) + 1:] if name.startswith(adapter.prefix + ".") else name
    if _under(path, adapter.embed) or _under(path, adapter.embed_proj):
        return "embed", None
    if _under(path, adapter.unembed_proj):
        return "unembed", None
    if _under(path, adapter.pos_embed):
        return "pos_embed", None
    if _under(path, adapter.final_norm):
        return "final_norm", None
    if path.startswith(adapter.blocks + "."):
        m = _LAYER.match(path[len(adapter.blocks) + 1:])
        if m:
            layer, rest = int(m.group(1)), m.group(2)
            for part, roots in (("norm", adapter.norms), ("attn", adapter.attn), ("mlp", adapter.mlp)):
                if _under(rest, roots):
                    return part, layer
            return "other", layer
    return "other", None
