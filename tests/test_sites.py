"""One hook-point vocabulary (models/sites.py): every point the engine registers is named by it and round-trips
through its parser, on tiny models of several families; and no other module spells a hook name by hand."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from anatomy_cli.models import sites
from anatomy_cli.models.sites import Point
from anatomy_cli.models.sites import Whole

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "anatomy_cli"
VOCABULARY = PACKAGE / "models" / "sites.py"

# dense (pre-norm, learned positions, parallel residual), MoE with and without a shared expert, Gemma's extra norms
FAMILIES = ["llama", "gpt2", "gpt_neox", "qwen2_moe", "mixtral", "gemma3", "gemma2", "opt"]


@pytest.mark.parametrize("arch", FAMILIES)
def test_every_registered_point_is_named_by_the_vocabulary_and_round_trips(tiny_lm, arch):
    lm = tiny_lm(arch)
    seen: set[Point | Whole] = set()
    for point_name in lm.points:
        parsed = sites.parse(point_name)
        assert parsed is not None, point_name
        block, point = parsed
        assert sites.name(block, point) == point_name
        if block is not None:
            assert 0 <= block < lm.n_layers
            assert sites.name(block, point.name) == point_name  # by its key, as callers write it
            assert sites.block_of(point_name) == block
        seen.add(point)
    # the points every family has, by the engine's own name for them
    assert {Point.resid_pre, Point.attn_z, Point.attn_out, Point.mlp_out, Point.resid_post, Whole.embed} <= seen
    moe = lm.info.moe
    if moe is not None:
        assert {Point.mlp_in, *sites.ROUTER_POINTS} <= seen
        assert set(sites.SHARED_EXPERT_POINTS) <= seen if moe.shared_expert else not seen & {*sites.SHARED_EXPERT_POINTS}
    assert Point.ln2_normalized not in seen  # named for SAE configs; read at the MLP's input, not registered


def test_the_parser_refuses_other_names():
    for text in ("blocks.3.hook_z", "blocks.x.hook_resid_post", "blocks.3.hook_resid_post.x", "hook_resid_post",
                 "ln_final", "layers.3", "blocks.-1.hook_resid_pre", ""):
        assert sites.parse(text) is None, text
    assert sites.parse("blocks.12.mlp.hook_router_logits") == (12, Point.router_logits)
    assert sites.parse("ln_final.hook_normalized") == (None, Whole.ln_final)


def test_sites_and_points_agree():
    # a Site (what users pick among) is a Point under another key for the heads only
    for site in sites.Site:
        assert sites.parse(sites.hook_name(4, site)) == (4, Point(site.hook))
        assert sites.parse_point(sites.hook_name(4, site)) == (4, site)
    assert sites.hook_name(2, "head") == sites.name(2, "attn_z") == "blocks.2.attn.hook_z"
    assert sites.name("N", "mlp_out") == "blocks.N.hook_mlp_out"
    with pytest.raises(ValueError):
        sites.name(0, Whole.logits)


def _hand_written(path: Path) -> list[tuple[int, str]]:
    """String literals of ``path`` that spell a hook name: one starting ``blocks.`` (an f-string's too), or one
    equal to a point's name (``hook_pos_embed``, ``mlp.hook_in``; ``logits`` is also an ordinary word)."""
    names = {p.value for p in Point} | {w.value for w in Whole if w is not Whole.logits}
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            text = str(node.values[0].value)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        else:
            continue
        if text.startswith("blocks.") or text in names:
            out.append((node.lineno, text[:60]))
    return out


def test_no_module_but_the_vocabulary_writes_a_hook_name():
    found = {f"{path.relative_to(ROOT)}:{line}": text for path in sorted(PACKAGE.rglob("*.py")) if path != VOCABULARY
             for line, text in _hand_written(path)}
    assert found == {}, "hook names written by hand (use models/sites.py name/parse): " + repr(found)


def test_the_layout_check_sees_a_hand_written_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('a = f"blocks.{3}.hook_resid_post"\nb = "blocks.0.attn.hook_z"\nc = "hook_pos_embed"\n'
                   'd = "at blocks.N.hook_mlp_out"\n')
    assert {line for line, _ in _hand_written(bad)} == {1, 2, 3}
