"""An SAE's hook name as its library writes it, mapped to anatomy's hook point (no torch).

TransformerLens names (SAELens) are anatomy's own: ``blocks.10.hook_resid_post``, ``blocks.3.hook_mlp_out``,
``blocks.0.hook_resid_pre``, ``blocks.2.hook_attn_out``, ``blocks.2.attn.hook_z``. EleutherAI sparsify names
modules of the transformers model: ``layers.10`` (a decoder layer's output: ``blocks.10.hook_resid_post``),
``layers.10.mlp`` (the MLP's output, ``blocks.10.hook_mlp_out``; a transcoder there reads the MLP's input),
``layers.10.self_attn`` (``blocks.10.hook_attn_out``); a leading ``model.``/``gpt_neox.``/``transformer.h``
prefix is dropped. Gemma Scope's ``params.npz`` states no hook: its folder (``layer_20``, a release named
``...-res``/``-mlp``/``-att``/``-transcoders``) or ``--hook`` says.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from anatomy_cli.errors import UsageError
from anatomy_cli.models.sites import TL_MLP_IN
from anatomy_cli.models.sites import WRITE_SITES
from anatomy_cli.models.sites import Point
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import block_of
from anatomy_cli.models.sites import hook_name
from anatomy_cli.models.sites import name as point_name
from anatomy_cli.models.sites import parse_point
from anatomy_cli.models.sites import spelled

if TYPE_CHECKING:
    from anatomy_cli.models.adapters import Adapter


_TL_OTHER = re.compile(r"^blocks\.(\d+)\.(\S+)$")  # blocks.N.<a name models/sites.py does not register>
_SPARSIFY = re.compile(r"^(?:model\.|gpt_neox\.|transformer\.)?(?:layers|h)\.(\d+)(\.mlp|\.self_attn|\.attn)?$")
_SPARSIFY_SITE = {None: Site.resid_post, ".mlp": Site.mlp_out, ".self_attn": Site.attn_out, ".attn": Site.attn_out}
# TransformerLens names that mean "the MLP's input" (what a TL transcoder reads).
_TL_MLP_IN = (Point.ln2_normalized.value, TL_MLP_IN)


def hook_point(name: str, *, transcoder_input: bool = False) -> str:
    """Anatomy's hook point for an SAE's ``name`` (see the module docstring). ``transcoder_input``: the name
    is a transcoder's input, so sparsify's ``layers.N.mlp`` means the MLP's input. Raises UsageError for a
    name anatomy has no hook point for."""
    if parse_point(name) is not None:  # a TransformerLens hook point anatomy has (models/sites.py)
        return name
    m = _TL_OTHER.match(name)
    if m and m.group(2) in _TL_MLP_IN:
        return hook_name(int(m.group(1)), Site.mlp_in)
    m = _SPARSIFY.match(name)
    if m:
        if transcoder_input and m.group(2) == ".mlp":
            return hook_name(int(m.group(1)), Site.mlp_in)
        return hook_name(int(m.group(1)), _SPARSIFY_SITE[m.group(2)])
    raise UsageError(f"the SAE's hook '{name}' has no anatomy hook point: anatomy reads "
                     f"{spelled([*WRITE_SITES, Site.head], ', ')}, and an MLP's input (--hook NAME overrides)")


def transcoder_hooks(name: str) -> tuple[str, str]:
    """(input hook, output hook) of a transcoder whose files (sparsify's) or ``--hook`` name one hook point: a
    TransformerLens name of block N's MLP input (``blocks.N.ln2.hook_normalized``, ``blocks.N.mlp.hook_in``,
    ``blocks.N.hook_mlp_in``) reads there and writes block N's ``hook_mlp_out``, as sparsify's ``layers.N.mlp``
    (the MLP module: its input and its output) does; any other name is both ends, as given."""
    m = _TL_OTHER.match(name)
    if m and m.group(2) in (*_TL_MLP_IN, Point.mlp_in.value):
        return name, hook_name(int(m.group(1)), Site.mlp_out)
    return name, name


def before_gain(name: str) -> bool:
    """``name`` is TransformerLens' ``ln2.hook_normalized`` (``blocks.N.`` or a config's template before it): the
    pre-MLP norm's normalised vector *before* its gain and bias (``x / RMS(x)``, LayerNorm's ``(x - mean) / σ``;
    TransformerLens' norms hook it before ``* w``, circuit-tracer maps it there too), not the MLP's input itself.
    Gemma Scope's transcoders read it: their release folds the gain into the MLP. The one rule for such a hook,
    ``anatomy sae``'s and ``circuit``'s: :func:`hook_point` gives the MLP's input (where it is written back) and the
    reader computes ``n`` from the pre-MLP norm's input (engine/norm_gain.py; ``circuit``'s replacement model with
    the norm's frozen denominator, engine/replacement.py), so a gain of 0 loses nothing."""
    return name.endswith(Point.ln2_normalized.value)


def mlp_norm(adapter: Adapter, model: str) -> str:
    """The block-relative module of the norm whose output the MLP reads (Llama's ``post_attention_layernorm``,
    Gemma 2's ``pre_feedforward_layernorm``, GPT-2's ``ln_2``): what a reader of ``ln2.hook_normalized``
    (:func:`before_gain`) divides the gain of. UsageError naming ``model`` where the MLP reads no norm's output
    (OLMo 2: its norms come after the sub-layers). Needs no weights."""
    tap = adapter.resid_mid
    if tap is None or tap.side != "input" or tap.module not in adapter.norms:
        raise UsageError(f"{model}'s MLP reads no norm's output: an SAE or transcoder of the normalised MLP input "
                         f"(ln2.hook_normalized, before the norm's gain) needs a norm right before the MLP")
    return tap.module


def layer_of(point: str) -> int:
    """The layer of ``blocks.{layer}....`` (models/sites.py ``block_of``)."""
    return block_of(point)


def gemma_scope_hooks(path: str, *, transcoder: bool = False) -> tuple[str, str] | None:
    """A Gemma Scope ``params.npz``'s (input hook, output hook) from its path
    (``.../gemma-scope-2b-pt-res/layer_20/width_16k/...``): ``blocks.20.hook_resid_post`` (``-res``),
    ``hook_mlp_out`` (``-mlp``), ``attn.hook_z`` (``-att``), the same hook in and out; ``-transcoders``: block 20's
    MLP transcoder, ``blocks.20.ln2.hook_normalized`` (the pre-feedforward norm's vector before its gain,
    :func:`before_gain`) to ``blocks.20.hook_mlp_out`` (circuit-tracer's Gemma Scope configs). The layer is the last
    ``layer_N`` folder of the path, the release the last folder naming one. ``transcoder``: the caller reads
    transcoders (``circuit --transcoders``), so a path naming no release is block N's MLP transcoder too. None when
    the path does not say."""
    parts = re.split(r"[/\\]", path)
    layers = [int(p[6:]) for p in parts if re.fullmatch(r"layer_\d+", p)]
    if not layers:
        return None
    layer = layers[-1]
    tags = (("-res", Site.resid_post), ("-mlp", Site.mlp_out), ("-att", Site.head), ("-transcoders", None),
            ("-transcoder", None))
    for part in reversed(parts):
        for tag, site in tags:
            if re.search(re.escape(tag) + r"(?:[-_]|$)", part):
                return (hook_name(layer, site),) * 2 if site else _mlp_transcoder(layer)
    return _mlp_transcoder(layer) if transcoder else None


def _mlp_transcoder(layer: int) -> tuple[str, str]:
    return point_name(layer, Point.ln2_normalized), hook_name(layer, Site.mlp_out)


def gemma_scope_l0(path: str) -> float | None:
    """``average_l0_71`` in a Gemma Scope path: the L0 its release states."""
    m = re.search(r"average_l0_(\d+(?:\.\d+)?)", path)
    return float(m.group(1)) if m else None
