"""The attention, MLP and norm internals' hook points (engine/internals.py) against hand computations from HF: a
hand-written forward hook on the projection, RoPE applied here with the model's own rotary embedding, the pattern
against transformers' ``output_attentions`` under eager attention; on tiny Llama (grouped-query) and GPT-2."""

from __future__ import annotations

import pytest
import torch

from anatomy_cli.engine import hooks
from anatomy_cli.engine.attention import eager_attention
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.sites import Point

IDS = [[5, 17, 301, 42, 7, 99], [8, 3, 250, 11, 64, 120]]
INTERNALS = [Point.ln1_scale, Point.attn_v, Point.attn_scores, Point.attn_pattern, Point.ln2_scale, Point.mlp_pre,
             Point.mlp_post]


def _hand(lm, layer: int, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    """The block's internals from forward hooks on its HF modules and the model's own eager attention weights."""
    block = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer]
    got: dict[str, torch.Tensor] = {}

    def keep(key, _m, args, out=None):
        got[key] = (args[0] if out is None else out).detach()

    handles = [block.get_submodule(lm.adapter.norms[0]).register_forward_pre_hook(lambda m, a: keep("ln1", m, a))]
    handles.append(block.get_submodule(lm.adapter.resid_mid.module).register_forward_pre_hook(
        lambda m, a: keep("ln2", m, a)))
    handles.append(block.get_submodule(lm.adapter.mlp_pre).register_forward_hook(lambda m, a, o: keep("pre", m, a, o)))
    handles.append(block.get_submodule(lm.adapter.mlp_post).register_forward_pre_hook(
        lambda m, a: keep("post", m, a)))
    for name in ("q_proj", "k_proj", "v_proj", "c_attn"):
        module = getattr(block.get_submodule(lm.adapter.attn[0]), name, None)
        if module is not None:
            handles.append(module.register_forward_hook(lambda m, a, o, name=name: keep(name, m, a, o)))
    try:
        with eager_attention(lm), torch.no_grad():
            out = lm.model(input_ids=ids, output_attentions=True, position_ids=torch.arange(ids.shape[1])[None])
    finally:
        for h in handles:
            h.remove()
    got["pattern"] = out.attentions[layer].detach()
    return got


def _rms(x: torch.Tensor, eps: float, centre: bool) -> torch.Tensor:
    x = x - x.mean(-1, keepdim=True) if centre else x
    return (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE (rotate-half) on ``[batch, pos, head, d]`` with the model's ``cos``/``sin`` ``[batch, pos, d]``."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, :, None] + rotated * sin[:, :, None]


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_each_internal_point_equals_its_hand_computation(tiny_lm, arch):
    lm = tiny_lm(arch)
    layer, d = 1, lm.d_head
    ids = torch.tensor(IDS)
    q_names = [Point.attn_q, Point.attn_k] + ([Point.attn_rot_q, Point.attn_rot_k] if arch == "llama" else [])
    names = [sites.name(layer, p) for p in [*INTERNALS, *q_names]]
    assert all(n in lm.points for n in names)
    with hooks.capture(lm, names) as got, torch.no_grad():
        lm.model(input_ids=ids)
    got = {sites.parse(n)[1]: t for n, t in got.items()}
    hand = _hand(lm, layer, ids)
    block = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer]
    centre = arch == "gpt2"
    ln1, ln2 = block.get_submodule(lm.adapter.norms[0]), block.get_submodule(lm.adapter.resid_mid.module)
    eps1, eps2 = (getattr(n, "eps", getattr(n, "variance_epsilon", None)) for n in (ln1, ln2))
    torch.testing.assert_close(got[Point.ln1_scale], _rms(hand["ln1"], eps1, centre))
    torch.testing.assert_close(got[Point.ln2_scale], _rms(hand["ln2"], eps2, centre))
    torch.testing.assert_close(got[Point.mlp_pre], hand["pre"])
    torch.testing.assert_close(got[Point.mlp_post], hand["post"])
    torch.testing.assert_close(got[Point.attn_pattern], hand["pattern"])
    torch.testing.assert_close(torch.softmax(got[Point.attn_scores], -1), hand["pattern"])
    assert torch.isinf(got[Point.attn_scores][0, 0, 0, 1])  # causal: a later key is masked
    if arch == "gpt2":
        q, k, v = (t.view(*t.shape[:-1], -1, d) for t in hand["c_attn"].split(lm.d_model, dim=-1))
        for point, want in ((Point.attn_q, q), (Point.attn_k, k), (Point.attn_v, v)):
            torch.testing.assert_close(got[point], want)
        return
    q, k, v = (hand[p].view(*hand[p].shape[:-1], -1, d) for p in ("q_proj", "k_proj", "v_proj"))
    assert k.shape[2] == lm.model.config.num_key_value_heads < lm.n_heads  # grouped-query: kv heads kept
    cos, sin = lm.model.base_model.rotary_emb(v, torch.arange(ids.shape[1])[None].expand(2, -1))
    for point, want in ((Point.attn_q, q), (Point.attn_k, k), (Point.attn_v, v),
                        (Point.attn_rot_q, _rotate(q, cos, sin)), (Point.attn_rot_k, _rotate(k, cos, sin))):
        torch.testing.assert_close(got[point], want)
    # the scores from the rotated queries and keys, each query head reading its group's key head
    keys = got[Point.attn_rot_k].repeat_interleave(lm.n_heads // k.shape[2], dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", got[Point.attn_rot_q], keys) * d ** -0.5
    torch.testing.assert_close(got[Point.attn_scores][0, :, -1], scores[0, :, -1])


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_hooks_at_internals_change_nothing_until_they_edit(tiny_lm, arch):
    lm = tiny_lm(arch)
    ids = torch.tensor(IDS)
    with torch.no_grad():
        plain = lm.model(input_ids=ids).logits
        for point in (Point.attn_v, Point.attn_q, Point.attn_pattern, Point.mlp_post):
            with hooks.attach(lm, {sites.name(0, point): lambda t: t.clone()}):
                torch.testing.assert_close(lm.model(input_ids=ids).logits, plain)
        assert lm.model.config._attn_implementation == "sdpa"  # restored
        # a pattern that attends only to the first token: each head's output is the first position's value
        def to_first(p: torch.Tensor) -> torch.Tensor:
            out = torch.zeros_like(p)
            out[..., 0] = 1
            return out

        with hooks.capture(lm, [sites.name(0, Point.attn_v), sites.name(0, Point.attn_z)]) as got, \
                hooks.attach(lm, {sites.name(0, Point.attn_pattern): to_first}):
            lm.model(input_ids=ids)
        v = got[sites.name(0, Point.attn_v)]
        v = v.repeat_interleave(lm.n_heads // v.shape[2], dim=2)
        z = got[sites.name(0, Point.attn_z)].view(2, len(IDS[0]), lm.n_heads, -1)
        torch.testing.assert_close(z, v[:, :1].expand_as(z))
        with pytest.raises(UsageError, match="read-only"), hooks.attach(lm, {sites.name(0, Point.ln1_scale): torch.neg}):
            lm.model(input_ids=ids)


def test_positions_of_a_pattern_are_its_query_rows(tiny_lm):
    lm = tiny_lm("gpt2")
    ids = torch.tensor(IDS)
    name = sites.name(1, Point.attn_pattern)
    with hooks.capture(lm, [name]) as full, torch.no_grad():
        lm.model(input_ids=ids)
    with hooks.capture(lm, [name], positions=torch.tensor([[2, 5], [0, 1]])) as some, torch.no_grad():
        lm.model(input_ids=ids)
    torch.testing.assert_close(some[name][0], full[name][0, :, [2, 5]])
    torch.testing.assert_close(some[name][1], full[name][1, :, [0, 1]])


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "gpt_neox", "gptj", "opt", "falcon", "falcon_rw", "bert"])
def test_the_pattern_is_the_models_own_in_other_families(tiny_lm, arch):
    # soft-capped scores (Gemma 2), sliding windows (Gemma 3), partial rotary (NeoX), ALiBi (Falcon-RW), encoders
    lm = tiny_lm(arch)
    ids = torch.tensor(IDS)
    names = [sites.name(layer, p) for layer in range(lm.n_layers) for p in sites.PATTERNS]
    with hooks.capture(lm, names) as got, torch.no_grad():
        lm.model(input_ids=ids)
    with eager_attention(lm), torch.no_grad():
        want = lm.model(input_ids=ids, output_attentions=True).attentions
    for layer in range(lm.n_layers):
        pattern = got[sites.name(layer, Point.attn_pattern)]
        torch.testing.assert_close(pattern, want[layer])
        torch.testing.assert_close(torch.softmax(got[sites.name(layer, Point.attn_scores)], -1), pattern)
