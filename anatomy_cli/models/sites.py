"""One vocabulary for where in a model: hook sites, block numbers and residual-stream rows (no torch).

**A layer is a block, 0..L−1**, in every option, JSON key, table and picture (as TransformerLens, llama.cpp's
control vectors and the Jacobian lens count). The residual stream has L + 1 readings: the first is the
embedding, named ``embed`` (``blocks.0.hook_resid_pre``, transformers' ``hidden_states[0]``); the reading named
N is the output of block N (``blocks.N.hook_resid_post``, ``hidden_states[N + 1]``). docs/engine.md states the
rule once; every command page links it.

Hook points (TransformerLens' names, what users type in ``--hook``/``--site``): :class:`Point` is every point inside
a block the engine registers (engine/hooks.py ``build_points`` builds its registry from it), :class:`Whole` every
point outside the blocks; :func:`name` writes a point's name and :func:`parse` reads one, the only places a hook
name is spelt (tests/test_sites.py checks no other module writes one). :class:`Site` names the sites a user picks
among (a subset), :func:`hook_name` builds one's hook point. :func:`parse_blocks` is the one parser of a block
list (``--layer 3``, ``--layers 0,6,11``, ``--blocks 2-5``, ``--layer all`` where a command takes every block),
:func:`blocks_text` the one way an API's list becomes that text.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import Enum

from anatomy_cli.errors import UsageError

EMBED = "embed"
"""The name of the residual stream's first reading, the embedding (before block 0)."""
ALL = "all"
"""The block list naming every block 0..L−1 (where a command accepts it: ``parse_blocks(..., every=True)``)."""


class Point(str, Enum):
    """A hook point inside block ``l``, by its key; the value is TransformerLens' name inside ``blocks.{l}.``.
    All but ``ln2_normalized`` are registered by the engine (``mlp_in`` where the MLP input is readable, not
    OPT's; the router points in MoE blocks only; ``resid_mid`` only in sequential blocks; the shared expert's only
    where the family has one; the :data:`INTERNALS` where the family's modules expose them, engine/internals.py)."""

    resid_pre = "hook_resid_pre"            # the block's input (block 0's: the embedding)
    ln1_scale = "ln1.hook_scale"            # the pre-attention norm's divisor sqrt(mean(x²) + eps) [batch, pos, 1]
    attn_q = "attn.hook_q"                  # queries [batch, pos, head, d_head] (rotary models: before RoPE)
    attn_k = "attn.hook_k"                  # keys [batch, pos, kv_head, d_head] (rotary models: before RoPE)
    attn_v = "attn.hook_v"                  # values [batch, pos, kv_head, d_head]
    attn_rot_q = "attn.hook_rot_q"          # rotary models: the queries after RoPE
    attn_rot_k = "attn.hook_rot_k"          # rotary models: the keys after RoPE
    attn_scores = "attn.hook_attn_scores"   # [batch, head, query_pos, key_pos], masked positions −inf
    attn_pattern = "attn.hook_pattern"      # softmax of the scores [batch, head, query_pos, key_pos]
    attn_z = "attn.hook_z"                  # the heads' outputs, the attention output projection's input
    attn_out = "hook_attn_out"              # what the attention adds to the residual stream
    resid_mid = "hook_resid_mid"            # after the attention, before the MLP (sequential blocks)
    ln2_scale = "ln2.hook_scale"            # the pre-MLP norm's divisor [batch, pos, 1]
    mlp_in = "mlp.hook_in"                  # the MLP module's input (a transcoder's input; engine/hooks.py mlp_of)
    router_logits = "mlp.hook_router_logits"        # MoE: the gate's output [batch, pos, n_experts]
    expert_indices = "mlp.hook_expert_indices"      # MoE: the chosen experts [batch, pos, k]
    expert_weights = "mlp.hook_expert_weights"      # MoE: their weights [batch, pos, k]
    shared_expert_out = "mlp.hook_shared_expert_out"    # Qwen2-MoE: the shared expert's output
    shared_expert_gate = "mlp.hook_shared_expert_gate"  # Qwen2-MoE: its gate, sigmoid of shared_expert_gate
    mlp_pre = "mlp.hook_pre"                # the MLP's hidden pre-activation [batch, pos, d_mlp] (gated: the gate's)
    mlp_post = "mlp.hook_post"              # the MLP's hidden activation, its output projection's input
    mlp_out = "hook_mlp_out"                # what the MLP adds
    resid_post = "hook_resid_post"          # the block's output
    ln2_normalized = "ln2.hook_normalized"  # the pre-MLP norm's vector before its gain (SAE/transcoder configs)


class Whole(str, Enum):
    """A hook point outside the blocks; the value is its name."""

    embed = "hook_embed"                        # the token embedding's output
    pos_embed = "hook_pos_embed"                # a learned position embedding's output (GPT-2, OPT)
    ln_final = "ln_final.hook_normalized"       # the final norm's output
    logits = "logits"                           # the LM head's output


TL_MLP_IN = "hook_mlp_in"
"""TransformerLens' other name of the MLP's input (``blocks.N.hook_mlp_in``), read at :attr:`Point.mlp_in`."""
CT_MLP_OUT = "mlp.hook_out"
"""circuit-tracer's (nnsight's) name of the MLP's output, :attr:`Point.mlp_out` (its input is :attr:`Point.mlp_in`'s
name): a transcoder set's or CLT's ``feature_output_hook``."""
ROUTER_POINTS = (Point.router_logits, Point.expert_indices, Point.expert_weights)
ATTENTION_INTERNALS = (Point.attn_q, Point.attn_k, Point.attn_v, Point.attn_rot_q, Point.attn_rot_k,
                       Point.attn_scores, Point.attn_pattern)
"""Inside the attention, before ``attn.hook_z``: TransformerLens' shapes, heads on their own axis."""
INTERNALS = (Point.ln1_scale, *ATTENTION_INTERNALS, Point.ln2_scale, Point.mlp_pre, Point.mlp_post)
"""The points inside a sub-layer whose width is no residual stream's (engine/internals.py registers them)."""
PATTERNS = (Point.attn_scores, Point.attn_pattern)
"""The points whose second axis is the head and third the query position (``[batch, head, query, key]``)."""
SHARED_EXPERT_POINTS = (Point.shared_expert_out, Point.shared_expert_gate)


def name(block: int | str | None, point: Point | Whole | Site | str) -> str:
    """The hook point ``point`` of block ``block``: ``name(3, "resid_post")`` is ``blocks.3.hook_resid_post``
    (``point``: a :class:`Point`, its key, a :class:`Site` or its value; ``block`` may be ``"N"`` in messages);
    ``name(None, Whole.logits)`` is ``logits``. The one writer of a hook name."""
    if isinstance(point, Whole):
        if block is not None:
            raise ValueError(f"{point.value} is not inside a block")
        return point.value
    return f"blocks.{block}.{_inside(point)}"


def _inside(point: Point | Site | str) -> str:
    if isinstance(point, Point):
        return point.value
    if isinstance(point, Site):
        return point.hook
    if point in Point.__members__:
        return Point[point].value
    return Site(point).hook


_ANY_POINT = re.compile(r"^blocks\.(\d+)\.(" + "|".join(re.escape(p.value) for p in Point) + r")$")


def parse(text: str) -> tuple[int, Point] | tuple[None, Whole] | None:
    """``(block, Point)`` of ``blocks.N.…``, ``(None, Whole)`` of a point outside the blocks, None for any other
    name; ``name(*parse(n)) == n``. The one reader of a hook name."""
    m = _ANY_POINT.match(text)
    if m is not None:
        return int(m.group(1)), Point(m.group(2))
    if text in {w.value for w in Whole}:
        return None, Whole(text)
    return None


def block_of(text: str) -> int:
    """The block of a hook point ``blocks.N.…``; ValueError for another name."""
    parsed = parse(text)
    if parsed is None or parsed[0] is None:
        raise ValueError(f"{text!r} is not a hook point inside a block")
    return parsed[0]


def is_point(text: str, point: Point) -> bool:
    """``text`` is ``point`` of some block (``blocks.N.hook_resid_mid`` for ``Point.resid_mid``)."""
    parsed = parse(text)
    return parsed is not None and parsed[1] is point


def is_internal(text: str) -> bool:
    """``text`` is one of the :data:`INTERNALS` of some block."""
    parsed = parse(text)
    return parsed is not None and parsed[1] in INTERNALS


def position_axis(text: str) -> int:
    """The axis of a hook point's activation that counts (query) positions: 2 for the :data:`PATTERNS`, else 1."""
    parsed = parse(text)
    return 2 if parsed is not None and parsed[1] in PATTERNS else 1


def names(blocks: Iterable[int], point: Point | Site | str) -> list[str]:
    """``point`` of each of ``blocks``, in order."""
    return [name(b, point) for b in blocks]


class Site(str, Enum):
    """A hook site inside block ``l``; ``hook_name(l, site)`` is its hook point."""

    resid_pre = "resid_pre"    # the input of block l (block 0's: the embedding)
    resid_mid = "resid_mid"    # after block l's attention, before its MLP (sequential blocks only)
    resid_post = "resid_post"  # the output of block l
    attn_out = "attn_out"      # what block l's attention adds to the residual stream
    mlp_out = "mlp_out"        # what block l's MLP adds
    head = "head"              # head h's slice of the attention output projection's input (attn.hook_z)
    mlp_in = "mlp_in"          # the MLP's input (a transcoder's input site)

    @property
    def hook(self) -> str:
        """The hook's name inside ``blocks.{l}.``: ``hook_resid_pre``, ``attn.hook_z``, ``mlp.hook_in``."""
        return _HOOK[self]

    @property
    def per_head(self) -> bool:
        return self is Site.head


_POINT_OF = {Site.head: Point.attn_z}
_HOOK = {s: (_POINT_OF[s] if s in _POINT_OF else Point[s.value]).value for s in Site}

RESIDUAL_SITES = (Site.resid_pre, Site.resid_mid, Site.resid_post)
WRITE_SITES = (Site.resid_pre, Site.resid_mid, Site.resid_post, Site.attn_out, Site.mlp_out)
"""The sites a vector of width d_model can be added at (steering vectors, SAE outputs, saved activations)."""

DESCRIPTION = {Site.resid_pre: "residual stream into block l", Site.resid_mid: "residual stream between attention "
               "and MLP of block l", Site.resid_post: "residual stream out of block l",
               Site.attn_out: "attention output of block l", Site.mlp_out: "MLP output of block l",
               Site.head: "each head's output (attn.hook_z) of block l", Site.mlp_in: "MLP input of block l"}

def hook_name(block: int, site: Site | str) -> str:
    """``blocks.{block}.hook_{site}`` (``blocks.3.attn.hook_z`` for ``head``, ``blocks.3.mlp.hook_in``)."""
    return name(block, Site(site))


def parse_point(text: str, sites: tuple[Site, ...] = tuple(Site)) -> tuple[int, Site] | None:
    """``(block, site)`` of a hook point ``blocks.N.hook_…`` among ``sites``; None for any other name."""
    parsed = parse(text)
    if parsed is None or parsed[0] is None:
        return None
    site = next((s for s, h in _HOOK.items() if h == parsed[1].value), None)
    return (parsed[0], site) if site in sites else None


def spelled(points: Iterable[Site | Point], last: str = " or ") -> str:
    """The points' names for a message, the first with its block: ``blocks.N.hook_resid_pre, hook_mlp_out or
    attn.hook_z`` (``last``: the words before the last name)."""
    texts = [name("N", p) for p in points]
    texts[1:] = [t.removeprefix("blocks.N.") for t in texts[1:]]
    return texts[0] if len(texts) == 1 else ", ".join(texts[:-1]) + last + texts[-1]


def residual_label(row: int) -> str | int:
    """The name of residual-stream reading ``row`` (0..L): ``embed`` for 0, else the block whose output it is
    (``row - 1``)."""
    return EMBED if row == 0 else row - 1


def residual_row(label: str | int) -> int:
    """The inverse of :func:`residual_label`: ``embed`` → 0, block N → N + 1."""
    return 0 if label == EMBED else int(label) + 1


def block_range_text(n_layers: int) -> str:
    """``blocks 0..11`` for a 12-block model (the words every out-of-range message uses)."""
    return f"blocks 0..{n_layers - 1}"


def check_block(block: int, n_layers: int, option: str = "--layer", *, negative: bool = True) -> int:
    """``block`` as a block number 0..L−1 (``negative``: −1 = the last block). Raises UsageError naming
    ``option`` and the model's range."""
    if negative and -n_layers <= block < 0:
        return block + n_layers
    if 0 <= block < n_layers:
        return block
    raise UsageError(f"{option} {block} is out of range: this model has {block_range_text(n_layers)}"
                     + (" (negative counts from the last)" if negative else ""))


def block_runs(blocks: Iterable[int]) -> str:
    """``0-5,8,10-11``: block numbers as runs, in the order given (consecutive ones joined)."""
    runs: list[list[int]] = []
    for b in blocks:
        if runs and b == runs[-1][1] + 1:
            runs[-1][1] = b
        else:
            runs.append([b, b])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def block_spans(blocks: Iterable[int]) -> str:
    """Blocks as runs, sorted, with the word: ``block 3``, ``blocks 0-2,4,7-29`` (for messages)."""
    ordered = sorted(set(blocks))
    return ("block " if len(ordered) == 1 else "blocks ") + block_runs(ordered)


def blocks_text(value: int | str | Iterable[int | str]) -> str:
    """A block list as :func:`parse_blocks` reads it: ``3`` -> ``"3"``, ``[0, 6]`` -> ``"0,6"``, text as is (an
    API's keyword, a repeated CLI option's values)."""
    if isinstance(value, (str, int)):
        return str(value)
    return ",".join(str(v) for v in value)


def parse_blocks(text: str, n_layers: int | None = None, option: str = "--layers", *, embed: bool = False,
                 negative: bool = True, every: bool = False) -> list[int | str]:
    """The one block-list parser: ``3``, ``0,6,11``, ``2-5``, ``-1``, with ``embed`` the name ``embed``, with
    ``every`` the word ``all`` alone (every block 0..L−1).

    Returns the blocks in the order given without repeats (``embed`` kept as the string). With ``n_layers``
    each block is checked (and a negative one counted from the last) and ``all`` is every block; without it only
    the syntax is (``all`` kept as the string). Raises UsageError naming ``option``.
    """
    if every and str(text).strip() == ALL:
        return [ALL] if n_layers is None else list(range(n_layers))
    example = ("embed,0,6,11" if embed else "0,6,11") + ", a range 2-5, -1 (the last)" + (" or all" if every else "")
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise UsageError(f"{option} is empty: give block numbers separated by commas, e.g. {example}")
    out: list[int | str] = []
    for part in parts:
        if part == "":
            raise UsageError(f"{option} {text!r}: an empty item; give block numbers separated by commas, "
                             f"e.g. {example}")
        if embed and part == EMBED:
            values: list[int | str] = [EMBED]
        else:
            m = re.fullmatch(r"(-?\d+)(?:-(\d+))?", part)
            if m is None:
                what = "block numbers (or embed)" if embed else "block numbers"
                if every and part == ALL:
                    raise UsageError(f"{option} {text!r}: 'all' stands alone (every block); give it without others")
                raise UsageError(f"{option} {text!r}: give {what} separated by commas, e.g. {example}")
            lo = int(m.group(1))
            hi = int(m.group(2)) if m.group(2) is not None else lo
            if m.group(2) is not None and (lo < 0 or hi < lo):
                raise UsageError(f"{option} {part!r}: a range is LOW-HIGH with 0 <= LOW <= HIGH")
            values = list(range(lo, hi + 1))
        for v in values:
            if isinstance(v, int):
                if not negative and v < 0:
                    raise UsageError(f"{option}: block {v} is negative; blocks count from 0")
                if n_layers is not None:
                    v = check_block(v, n_layers, option, negative=negative)
            if v not in out:
                out.append(v)
    return out
