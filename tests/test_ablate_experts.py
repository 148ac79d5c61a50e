"""`anatomy ablate --experts` (issue 50): each routed expert of an MoE block knocked out, against transformers.

Tiny random Mixtral (always renormalised), Qwen3-MoE (``norm_topk_prob=True``), OLMoE (False) and Qwen2-MoE
(False, a gated shared expert, block 1 dense) from tests/models.py. The references are forwards of transformers'
own model with a hook written here on its own modules, never anatomy's code: ``reroute`` masks expert e's router
logit to -inf in the output of the block's ``gate`` and routes by hand (softmax, top k, the family's
normalisation); ``zero`` subtracts ``weight_e * expert_e(x)``, the expert computed by hand from the ``experts``
module's weights, from the block's output, with the weight the gate gave.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_moe import NORMALISED
from test_moe import _sparse
from typer.testing import CliRunner

import anatomy_cli as anatomy
from anatomy_cli.cli.main import app

pytestmark = pytest.mark.usefixtures("cached_load")
PROMPT = "The bank of the river was muddy after"
TARGET = " the"
ROUTED = ["mixtral", "qwen3_moe", "olmoe", "qwen2_moe"]


def invoke(*args):
    return CliRunner().invoke(app, ["ablate", *args])


def ablate_json(model, *args):
    result = invoke(PROMPT, "--model", model, "--target", TARGET, "--experts", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _route_by_hand(logits, arch, k, dtype):
    """The family's rule, written here: softmax in float32 over the experts, top k, renormalised when the family
    normalises; the Qwen/OLMoE gates hand the weights on in the logits' dtype."""
    w, i = torch.topk(torch.softmax(logits.float(), dim=-1), k, dim=-1)
    if NORMALISED[arch]:
        w = w / w.sum(-1, keepdim=True)
    return (w if arch == "mixtral" else w.to(dtype)), i


def _hand_metric(lm, arch, ids, target, block, expert, mode):
    """log p(target) at the last position with ``expert`` of ``block`` knocked out by hooks on transformers'
    own modules (see the module docstring)."""
    mlp = lm.model.model.layers[block].mlp
    k = lm.model.config.num_experts_per_tok
    seen = {}

    def gate_hook(_m, _args, out):
        logits, weights, indices = out
        if mode == "reroute":
            logits = logits.clone()
            logits[:, expert] = float("-inf")
            weights, indices = _route_by_hand(logits, arch, k, weights.dtype)
        seen["routing"] = weights, indices
        return logits, weights, indices

    def block_hook(_m, args, out):
        if mode == "reroute":
            return None
        x = args[0].reshape(-1, args[0].shape[-1])
        gate_up, down = mlp.experts.gate_up_proj[expert], mlp.experts.down_proj[expert]
        gate, up = (x @ gate_up.T).chunk(2, dim=-1)
        y = (mlp.experts.act_fn(gate) * up) @ down.T                       # expert e on every position
        weights, indices = seen["routing"]
        w = (weights * (indices == expert)).sum(-1, keepdim=True)           # e's weight where chosen, else 0
        return out - (w * y).reshape(out.shape).to(out.dtype)

    handles = [mlp.gate.register_forward_hook(gate_hook), mlp.register_forward_hook(block_hook)]
    try:
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids])).logits[0, -1].double()
    finally:
        for h in handles:
            h.remove()
    return float(torch.log_softmax(logits, -1)[target])


@pytest.mark.parametrize("arch,mode", [("mixtral", "reroute"), ("qwen3_moe", "reroute"), ("olmoe", "reroute"),
                                       ("qwen2_moe", "reroute"), ("mixtral", "zero"), ("qwen3_moe", "zero"),
                                       ("qwen2_moe", "zero")])
def test_rows_equal_hooks_on_transformers_modules(tiny_model_dir, tiny_lm, arch, mode):
    lm = tiny_lm(arch)
    data = ablate_json(str(tiny_model_dir(arch)), *(["--mode", mode] if mode == "zero" else []))
    ids, target = data["token_ids"], data["target"]["token_id"]
    assert data["mode"] == mode and data["metric"] == "logprob"
    with torch.no_grad():
        intact = float(torch.log_softmax(lm.model(torch.tensor([ids])).logits[0, -1].double(), -1)[target])
    assert data["clean_metric"] == pytest.approx(intact, abs=1e-5)
    n_experts = lm.model.config.num_experts if arch != "mixtral" else lm.model.config.num_local_experts
    assert [(r["layer"], r["component"], r["expert"]) for r in data["rows"]] == [
        (b, "expert", e) for b in _sparse(lm) for e in range(n_experts)]
    assert all(set(r) == {"layer", "component", "expert", "metric", "effect"} for r in data["rows"])
    for row in data["rows"]:
        expected = _hand_metric(lm, arch, ids, target, row["layer"], row["expert"], mode)
        assert row["metric"] == pytest.approx(expected, abs=1e-5), row
        assert row["effect"] == pytest.approx(expected - intact, abs=1e-5)
    assert max(abs(r["effect"]) for r in data["rows"]) > 1e-4  # the ablations do something
    result = invoke(PROMPT, "--model", str(tiny_model_dir(arch)), "--target", TARGET, "--experts", "--layer", "0")
    assert ("the shared expert is always on" in result.stderr) == (arch == "qwen2_moe")


def test_zero_of_an_expert_never_chosen_changes_nothing_and_batching_does_not_matter(tiny_model_dir, tiny_lm):
    model = str(tiny_model_dir("mixtral"))
    data = ablate_json(model, "--mode", "zero", "--layer", "-1")
    assert {r["layer"] for r in data["rows"]} == {1}
    lm = tiny_lm("mixtral")
    with torch.no_grad():
        out = lm.model(torch.tensor([data["token_ids"]]), output_router_logits=True)
    chosen = set(torch.topk(out.router_logits[1], 2, dim=-1).indices.flatten().tolist())
    for row in data["rows"]:
        if row["expert"] not in chosen:
            assert row["effect"] == 0.0
    one = ablate_json(model, "--mode", "zero", "--layer", "-1", "--batch-size", "1")
    assert [r["metric"] for r in one["rows"]] == pytest.approx([r["metric"] for r in data["rows"]], abs=1e-6)


def test_api_equals_cli_and_tsv_has_the_expert_column(tiny_model_dir):
    model = str(tiny_model_dir("qwen3_moe"))
    data = ablate_json(model, "--layer", "0")
    result = anatomy.ablate(model, PROMPT, target=TARGET, experts=True, layer=0)
    rows = [r.to_dict() for r in result.result.rows]
    assert [(r["layer"], r["expert"]) for r in rows] == [(r["layer"], r["expert"]) for r in data["rows"]]
    assert [r["metric"] for r in rows] == pytest.approx([r["metric"] for r in data["rows"]], abs=1e-6)
    tsv = invoke(PROMPT, "--model", model, "--target", TARGET, "--experts", "--layer", "0")
    assert tsv.exit_code == 0, tsv.stderr
    assert tsv.stdout.splitlines()[0].split("\t") == ["layer", "component", "expert", "metric", "effect"]


def test_plot_draws_a_block_by_expert_grid(tiny_model_dir, tmp_path):
    png = tmp_path / "experts.png"
    result = invoke(PROMPT, "--model", str(tiny_model_dir("olmoe")), "--target", TARGET, "--experts",
                    "--plot", str(png))
    assert result.exit_code == 0, result.stderr
    assert png.stat().st_size > 0


@pytest.mark.parametrize("args,message", [
    (["--layer", "2"], "--layer 2 is out of range"),
    (["--layer", "1"], "--layer 1: that block of"),                      # Qwen2-MoE's block 1 is dense
    (["--mode", "mean"], "--experts takes --mode reroute (the default) or --mode zero"),
    (["--heads"], "--experts and --heads are two different ablations"),
    (["--method", "attribution"], "--method attribution does not estimate"),
])
def test_usage_errors_are_one_line(tiny_model_dir, args, message):
    result = invoke(PROMPT, "--model", str(tiny_model_dir("qwen2_moe")), "--target", TARGET, "--experts", *args)
    assert result.exit_code == 2, result.stdout
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_dense_model_and_reroute_without_experts_are_refused(tiny_model_dir):
    dense = invoke(PROMPT, "--model", str(tiny_model_dir("llama")), "--target", TARGET, "--experts")
    assert dense.exit_code == 2
    assert "dense model (llama), not a mixture of experts: `ablate --experts`" in dense.stderr
    assert len(dense.stderr.strip().splitlines()) == 1
    bare = invoke(PROMPT, "--model", str(tiny_model_dir("mixtral")), "--target", TARGET, "--mode", "reroute")
    assert bare.exit_code == 2 and "--mode reroute knocks out a routed expert: it needs --experts" in bare.stderr


def test_deepseek_routing_is_refused_in_one_line(tmp_path):
    """DeepSeek-V3 (group-limited sigmoid routing, MLA attention) has no adapter: `route` and `ablate --experts`
    say so in one line, naming the family, before any weight loads."""
    from conftest import build_gpt2_tokenizer
    from transformers import DeepseekV3Config
    from transformers import DeepseekV3ForCausalLM

    config = DeepseekV3Config(vocab_size=50257, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
                              n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
                              first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=4,
                              qk_nope_head_dim=4, v_head_dim=8, max_position_embeddings=64)
    torch.manual_seed(0)
    DeepseekV3ForCausalLM(config).save_pretrained(tmp_path)
    build_gpt2_tokenizer().save_pretrained(tmp_path)
    for args in (["route", PROMPT], ["ablate", PROMPT, "--target", TARGET, "--experts"]):
        result = CliRunner().invoke(app, [*args, "--model", str(tmp_path)])
        assert result.exit_code == 1, result.stdout
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: architecture 'deepseek_v3' is not supported: ")
        assert "group-limited" in lines[0]
