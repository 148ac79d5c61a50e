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
from typing import Any, Literal

from anatomy_cli.errors import UnsupportedArchitecture


@dataclass(frozen=True)
class Tap:
    """A hook point: the ``input`` (first positional argument) or ``output`` of ``module``."""

    module: str
    side: Literal["input", "output"] = "output"


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
    parallel_flag: str | None = None  # config attribute; when true, attention and MLP both read
    # resid_pre (GPT-NeoX parallel residual) and there is no resid_mid


GPT2 = Adapter(
    name="gpt2", model_types=("gpt2",), causal=True, prefix="transformer",
    embed="wte", pos_embed="wpe", blocks="h", final_norm="ln_f", unembed="lm_head",
    attn=("attn",), mlp=("mlp",), norms=("ln_1", "ln_2"),
    attn_out=Tap("attn"), mlp_out=Tap("mlp"), resid_mid=Tap("ln_2", "input"), attn_o="attn.c_proj",
)

# Llama, Mistral, Qwen2/3 and Mixtral share one layout (Mixtral's `mlp` is its MoE block).
LLAMA = Adapter(
    name="llama", model_types=("llama", "mistral", "qwen2", "qwen3", "mixtral"), causal=True, prefix="model",
    embed="embed_tokens", pos_embed=None, blocks="layers", final_norm="norm", unembed="lm_head",
    attn=("self_attn",), mlp=("mlp",), norms=("input_layernorm", "post_attention_layernorm"),
    attn_out=Tap("self_attn"), mlp_out=Tap("mlp"), resid_mid=Tap("post_attention_layernorm", "input"),
    attn_o="self_attn.o_proj",
)

# Pythia checkpoints name the head `embed_out`; transformers v5 loads it as `lm_head`.
GPT_NEOX = Adapter(
    name="gpt_neox", model_types=("gpt_neox",), causal=True, prefix="gpt_neox",
    embed="embed_in", pos_embed=None, blocks="layers", final_norm="final_layer_norm", unembed="lm_head",
    attn=("attention",), mlp=("mlp",), norms=("input_layernorm", "post_attention_layernorm"),
    attn_out=Tap("attention"), mlp_out=Tap("mlp"), resid_mid=Tap("post_attention_layernorm", "input"),
    attn_o="attention.dense", parallel_flag="use_parallel_residual",
)

# Post-LN encoder: each sub-layer's output goes through Add & Norm. attn_out/mlp_out are the
# sub-layer outputs before that Add & Norm; resid_mid is the attention's Add & Norm output.
BERT = Adapter(
    name="bert", model_types=("bert",), causal=False, prefix="bert",
    embed="embeddings.word_embeddings", pos_embed="embeddings.position_embeddings", blocks="encoder.layer",
    final_norm=None, unembed="cls",
    attn=("attention",), mlp=("intermediate", "output"), norms=("attention.output.LayerNorm", "output.LayerNorm"),
    attn_out=Tap("attention.output.dropout"), mlp_out=Tap("output.dropout"),
    resid_mid=Tap("attention.output.LayerNorm"), attn_o="attention.output.dense", post_ln=True,
)

ADAPTERS: tuple[Adapter, ...] = (GPT2, LLAMA, GPT_NEOX, BERT)


def supported_model_types() -> list[str]:
    """Every ``config.model_type`` with an adapter, e.g. ``['gpt2', 'llama', ...]``."""
    return [t for a in ADAPTERS for t in a.model_types]


def for_model_type(model_type: str | None) -> Adapter:
    """The adapter for ``model_type``. Raises UnsupportedArchitecture naming the supported ones."""
    for adapter in ADAPTERS:
        if model_type in adapter.model_types:
            return adapter
    raise UnsupportedArchitecture(
        f"architecture '{model_type}' is not supported; supported: {', '.join(supported_model_types())}")


def for_config(config: Any) -> Adapter:
    """The adapter for a ``transformers`` config (by ``config.model_type``)."""
    return for_model_type(getattr(config, "model_type", None))


def has_resid_mid(adapter: Adapter, config: Any) -> bool:
    """False for a parallel-residual block (attention and MLP both read resid_pre)."""
    if adapter.resid_mid is None:
        return False
    return not (adapter.parallel_flag and getattr(config, adapter.parallel_flag, False))


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
    if _under(path, adapter.embed):
        return "embed", None
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
