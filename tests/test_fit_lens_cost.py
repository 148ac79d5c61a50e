"""`fit-lens jacobian`'s cost estimate (issue 48): its FLOP count against the FLOPs torch itself counts while a fit
runs (``torch.utils.flop_counter.FlopCounterMode``, every matrix product of the forward and of the backward passes,
under eager attention so that attention's products are products it counts), and against a count by hand from the
config; the time is the FLOPs at a rate measured on the device (not asserted: no timed test)."""

from __future__ import annotations

import math

import pytest
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.engine import eager_attention
from anatomy_cli.engine import jacobian_fit
from anatomy_cli.models import cost

IDS = list(range(100, 140))  # 40 tokens


def _by_hand(cfg, n: int, dim_batch: int, first_source: int, target: int, gated: bool) -> float:
    """The fit's products, counted from the config: per block and token the projections (Q and O: d × heads·d_head;
    K and V: d × kv_heads·d_head) and the MLP (2 or, gated, 3 matrices of d × d_ff); attention's two products
    (scores, weighted sum) 2 · n² · heads · d_head each. Forward: every block, B copies; each of ceil(d / B)
    backward passes: one product per matrix (no weight gradient) and two per attention product, through blocks
    first_source + 1 .. target."""
    d, heads = cfg.hidden_size, cfg.num_attention_heads
    d_head = getattr(cfg, "head_dim", None) or d // heads
    kv = getattr(cfg, "num_key_value_heads", None) or heads
    d_ff = getattr(cfg, "intermediate_size", None) or getattr(cfg, "n_inner", None) or 4 * d
    weights = 2 * d * heads * d_head + 2 * d * kv * d_head + (3 if gated else 2) * d * d_ff
    attention = 2 * (2 * n * n * heads * d_head)
    forward = cfg.num_hidden_layers * (2 * weights * n + attention)
    backward = (target - first_source) * (2 * weights * n + 2 * attention)
    return dim_batch * (forward + math.ceil(d / dim_batch) * backward)


@pytest.mark.parametrize("arch,gated", [("llama", True), ("gpt2", False), ("qwen2", True)])
@pytest.mark.parametrize("dim_batch,first", [(8, 0), (12, 1)])
def test_the_estimate_is_the_flops_torch_counts_in_a_fit(tiny_lm, arch, gated, dim_batch, first):
    lm = tiny_lm(arch)
    n_layers = lm.info.n_layers
    sources = list(range(first, n_layers - 1)) or [0]
    target = n_layers - 1
    with eager_attention(lm), FlopCounterMode(display=False) as counter:
        jacobian_fit.jacobian_for_prompt(lm, IDS, sources, target, dim_batch=dim_batch, skip_first=4)
    counted = counter.get_total_flops()
    estimate = cost.jacobian_fit_flops(lm.info, len(IDS), dim_batch, sources[0], target,
                                       jacobian_fit.block_weights(lm))
    cfg = lm.model.config
    assert estimate == pytest.approx(_by_hand(cfg, len(IDS), dim_batch, sources[0], target, gated), rel=1e-12)
    # the products torch counts are the estimate's (norms, activations and softmax are not products)
    assert estimate == pytest.approx(counted, rel=1e-9), (arch, counter.get_flop_counts()["Global"])
    # without the block's own weights: ~12 d² per block, within 2x of the count
    rough = cost.jacobian_fit_flops(lm.info, len(IDS), dim_batch, sources[0], target)
    assert 0.5 < rough / counted < 2.0


def test_the_estimate_of_a_smollm2_shaped_fit_is_its_count_by_hand():
    """The doc's SmolLM2 fit (16 prompts of 64 tokens, blocks 0-28 -> 29, dim_batch 32) from SmolLM2's shape
    (d 576, 9 heads of 64, 3 KV heads, a gated MLP of 1536, 30 blocks): 1.33e14 FLOP, where the estimate before
    issue 48 item 3 (the LM head in every copy's forward, 12 d² per block, the source block in the backward)
    said 1.5e14."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(hidden_size=576, num_attention_heads=9, head_dim=64, num_key_value_heads=3,
                          intermediate_size=1536, num_hidden_layers=30)
    info = SimpleNamespace(d_model=576, n_heads=9, d_head=64, n_layers=30, lm_head_rows=49152)
    weights = 2 * 576 * 576 + 2 * 576 * 192 + 3 * 576 * 1536
    assert weights == 3_538_944
    per_prompt = cost.jacobian_fit_flops(info, 64, 32, 0, 29, weights)
    assert per_prompt == pytest.approx(_by_hand(cfg, 64, 32, 0, 29, gated=True), rel=1e-12)
    assert 16 * per_prompt == pytest.approx(1.33e14, rel=0.01)


def test_the_cost_line_is_timed_now(tiny_model_dir, tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox jumps over the lazy dog because it was tired of running\n")
    res = CliRunner().invoke(app, ["fit-lens", "jacobian", "--model", str(tiny_model_dir("llama")), "--prompts",
                                   str(prompts), "--out", str(tmp_path / "j.pt"), "--skip-first", "4"])
    assert res.exit_code == 0, res.output
    line = next(ln for ln in res.output.splitlines() if "backward passes per prompt" in ln)
    assert "FLOP; roughly" in line and "timed on this machine now" in line, line
    # the tiny model's 2 blocks: block 0 fitted to the last one, 1; the word by sites.block_spans (one block: singular)
    assert " tokens, block 0 -> 1, " in line, line
