"""Inside MoE blocks (issue 50): the router's hook points, the experts' weighted sum, and `anatomy route`.

Tiny random Mixtral (always renormalised), Qwen3-MoE (``norm_topk_prob=True``), OLMoE (``norm_topk_prob``
False) and Qwen2-MoE (False, a sigmoid-gated shared expert, block 1 dense) from tests/models.py. The reference
is transformers' own forward with ``output_router_logits=True``, routed here by a hand-written rule per family,
and the ``experts`` module's own arguments (hooked on the model), never anatomy's code.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch.testing import assert_close
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app

MOE = ["mixtral", "qwen3_moe", "olmoe", "qwen2_moe"]
NORMALISED = {"mixtral": True, "qwen3_moe": True, "olmoe": False, "qwen2_moe": False}
PROMPTS = ["The bank of the river was muddy after the rain", "Thank you very"]
POINTS = ("router_logits", "expert_indices", "expert_weights")


def _sparse(lm) -> list[int]:
    return [i for i, layer in enumerate(lm.model.model.layers) if hasattr(layer.mlp, "gate")]


def _reference(lm, arch, ids):
    """transformers' router logits (output_router_logits=True) per sparse block, routed by hand, and what each
    block's experts module was called with."""
    calls: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    handles = []
    for b in _sparse(lm):
        def pre(_m, args, kwargs, b=b):
            calls[b] = (args[1].clone(), args[2].clone())
        handles.append(lm.model.model.layers[b].mlp.experts.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        with torch.no_grad():
            out = lm.model(torch.tensor([ids]), output_router_logits=True)
    finally:
        for h in handles:
            h.remove()
    k = lm.model.config.num_experts_per_tok
    ref = {}
    for b, logits in zip(_sparse(lm), out.router_logits):
        p = torch.softmax(logits.float(), dim=-1)
        w, i = torch.topk(p, k, dim=-1)
        if NORMALISED[arch]:
            w = w / w.sum(-1, keepdim=True)
        ref[b] = logits, i, w
    return ref, calls


@pytest.mark.parametrize("arch", MOE)
def test_router_points_equal_transformers_and_what_the_block_used(tiny_lm, arch):
    lm = tiny_lm(arch)
    assert lm.info.moe is not None and lm.info.moe.norm_topk_prob == NORMALISED[arch]
    assert list(lm.info.moe.sparse_blocks) == _sparse(lm) == ([0] if arch == "qwen2_moe" else [0, 1])
    enc = engine.encode(lm, PROMPTS[:1])[0]
    names = [f"blocks.{b}.mlp.hook_{p}" for b in _sparse(lm) for p in POINTS]
    [cache] = engine.run(lm, [enc], names)
    ref, calls = _reference(lm, arch, enc.ids)
    for b in _sparse(lm):
        logits, idx, w = ref[b]
        assert cache[f"blocks.{b}.mlp.hook_router_logits"].shape == (len(enc), lm.info.moe.n_experts)
        assert_close(cache[f"blocks.{b}.mlp.hook_router_logits"], logits, rtol=1e-5, atol=1e-6)
        assert torch.equal(cache[f"blocks.{b}.mlp.hook_expert_indices"], idx)
        assert_close(cache[f"blocks.{b}.mlp.hook_expert_weights"].float(), w, rtol=1e-5, atol=1e-6)
        used_idx, used_w = calls[b]
        assert torch.equal(cache[f"blocks.{b}.mlp.hook_expert_indices"], used_idx)
        assert_close(cache[f"blocks.{b}.mlp.hook_expert_weights"], used_w, rtol=1e-6, atol=1e-7)
        if NORMALISED[arch]:
            assert_close(used_w.sum(-1), torch.ones(len(enc)), rtol=1e-5, atol=1e-6)
        else:
            assert (used_w.sum(-1) < 1 - 1e-3).all()  # top 2 of 4 probabilities, not renormalised


@pytest.mark.parametrize("arch", MOE)
def test_weighted_experts_plus_shared_equal_the_block_output(tiny_lm, arch):
    lm = tiny_lm(arch)
    enc = engine.encode(lm, PROMPTS[:1])[0]
    moe = lm.info.moe
    inputs: dict[int, torch.Tensor] = {}
    blocks = _sparse(lm)
    hooks = [(lm.model.model.layers[b].mlp, "input", (lambda t, b=b: inputs.__setitem__(b, t.clone()))) for b in blocks]
    names = [f"blocks.{b}.{p}" for b in blocks for p in
             ("hook_mlp_out", "mlp.hook_expert_indices", "mlp.hook_expert_weights",
              *(("mlp.hook_shared_expert_out", "mlp.hook_shared_expert_gate") if moe.shared_expert else ()))]
    with engine.attach_modules(hooks):
        [cache] = engine.run(lm, [enc], names)
    from anatomy_cli.engine import experts

    for b in blocks:
        x = inputs[b][0]
        shared = gate = None
        if moe.shared_expert:
            shared, gate = cache[f"blocks.{b}.mlp.hook_shared_expert_out"], cache[f"blocks.{b}.mlp.hook_shared_expert_gate"]
            assert gate.shape == (len(enc), 1) and ((gate > 0) & (gate < 1)).all()
            # the shared expert's output is its MLP on the block input (independent of the hook)
            mlp = lm.model.model.layers[b].mlp
            with torch.no_grad():
                assert_close(shared, mlp.shared_expert(x), rtol=1e-5, atol=1e-6)
                assert_close(gate, torch.sigmoid(mlp.shared_expert_gate(x)), rtol=1e-5, atol=1e-6)
        with torch.no_grad():
            rebuilt = experts.reconstruct(lm, b, x, cache[f"blocks.{b}.mlp.hook_expert_indices"],
                                             cache[f"blocks.{b}.mlp.hook_expert_weights"], shared, gate)
        assert_close(rebuilt.float(), cache[f"blocks.{b}.hook_mlp_out"], rtol=1e-4, atol=1e-5)
        if moe.shared_expert:  # the shared expert matters: without it the sum is off
            assert (rebuilt - gate.double() * shared.double() - cache[f"blocks.{b}.hook_mlp_out"].double()).abs().max() > 1e-4


@pytest.mark.parametrize("arch", MOE)
def test_padded_batch_routes_as_single_runs(tiny_lm, arch):
    lm = tiny_lm(arch)
    enc = engine.encode(lm, PROMPTS)
    assert len(enc[0]) != len(enc[1])
    names = [f"blocks.{b}.mlp.hook_{p}" for b in _sparse(lm) for p in POINTS]
    batched = engine.run(lm, enc, names, batch_size=2)
    for i, e in enumerate(enc):
        [single] = engine.run(lm, [e], names, batch_size=1)
        ref, _ = _reference(lm, arch, e.ids)
        for b in _sparse(lm):
            assert torch.equal(batched[i][f"blocks.{b}.mlp.hook_expert_indices"], ref[b][1])
            for p in POINTS:
                assert_close(batched[i][f"blocks.{b}.mlp.hook_{p}"], single[f"blocks.{b}.mlp.hook_{p}"],
                             rtol=1e-5, atol=1e-6)


def test_moe_points_are_read_only_and_dense_models_have_none(tiny_lm):
    from anatomy_cli.errors import UsageError

    lm = tiny_lm("mixtral")
    enc = engine.encode(lm, ["Hi there"])
    with engine.attach(lm, {"blocks.0.mlp.hook_router_logits": lambda t: t * 0}):
        with pytest.raises(UsageError, match="read-only"):
            engine.run(lm, enc, ["logits"])
    assert not [n for n in engine.hook_names(tiny_lm("llama")) if "router" in n]
    assert tiny_lm("llama").info.moe is None


# ---------------------------------------------------------------- anatomy route

def invoke(*args, input=None):
    return CliRunner().invoke(app, list(args), input=input)


def _route_json(model, *args, prompt=PROMPTS[1]):
    result = invoke("route", prompt, "--model", model, "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("arch", MOE)
def test_route_rows_equal_transformers(tiny_model_dir, tiny_lm, arch):
    model = str(tiny_model_dir(arch))
    data = _route_json(model)
    lm = tiny_lm(arch)
    ref, _ = _reference(lm, arch, data["token_ids"])
    n = len(data["token_ids"])
    assert [(r["block"], r["position"]) for r in data["rows"]] == [(b, p) for b in _sparse(lm) for p in range(n)]
    assert data["top_k"] == 2 and data["n_experts"] == 4 and data["norm_topk_prob"] == NORMALISED[arch]
    for row in data["rows"]:
        logits, idx, w = ref[row["block"]]
        p = torch.softmax(logits[row["position"]].double(), -1)
        assert row["token"] == data["tokens"][row["position"]]
        assert row["experts"] == idx[row["position"]].tolist()
        assert row["weights"] == pytest.approx(w[row["position"]].tolist(), rel=1e-5)
        assert row["entropy"] == pytest.approx(float(-(p * p.log()).sum()), rel=1e-9)
        ranked = p.sort(descending=True).values
        assert row["margin"] == pytest.approx(float(ranked[1] - ranked[2]), abs=1e-9)
        assert row["near_tie"] == (row["margin"] < data["near_tie_threshold"])


def test_route_stdin_batch_equals_single_runs(tiny_model_dir):
    model = str(tiny_model_dir("qwen2_moe"))
    result = invoke("route", "-", "--model", model, "--format", "jsonl", "--batch-size", "2",
                    input="\n".join(PROMPTS) + "\n")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["prompt"] for d in lines] == PROMPTS
    for batched, prompt in zip(lines, PROMPTS):
        single = _route_json(model, prompt=prompt)
        assert [r["experts"] for r in batched["rows"]] == [r["experts"] for r in single["rows"]]
        for a, b in zip(batched["rows"], single["rows"]):
            assert a["weights"] == pytest.approx(b["weights"], rel=1e-5)
            assert a["margin"] == pytest.approx(b["margin"], abs=1e-6)


def test_route_block_top_and_tsv(tiny_model_dir):
    model = str(tiny_model_dir("mixtral"))
    full = _route_json(model)
    one = _route_json(model, "--block", "-1", "--top", "1")
    assert {r["block"] for r in one["rows"]} == {1}
    last = [r for r in full["rows"] if r["block"] == 1]
    assert [r["experts"] for r in one["rows"]] == [r["experts"][:1] for r in last]
    assert [r["entropy"] for r in one["rows"]] == [r["entropy"] for r in last]
    result = invoke("route", PROMPTS[1], "--model", model)
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "block\tposition\ttoken\texperts\tweights\tentropy\tmargin\tnear_tie"
    assert len(lines) == 1 + len(full["rows"])
    assert lines[1].split("\t")[3] == " ".join(map(str, full["rows"][0]["experts"]))


def test_route_refusals_before_weights_load(tiny_model_dir, monkeypatch):
    import anatomy_cli.cli.driver as command  # route is the prompt driver's

    def no_load(*_a, **_k):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(command, "load_weights", no_load)
    dense = invoke("route", "Hi", "--model", str(tiny_model_dir("llama")))
    assert dense.exit_code == 2
    assert "dense model (llama), not a mixture of experts" in dense.stderr
    assert len(dense.stderr.strip().splitlines()) == 1
    past = invoke("route", "Hi", "--model", str(tiny_model_dir("mixtral")), "--block", "2")
    assert past.exit_code == 2 and "--block 2 is out of range" in past.stderr
    mlp_only = invoke("route", "Hi", "--model", str(tiny_model_dir("qwen2_moe")), "--block", "1")
    assert mlp_only.exit_code == 2 and "dense MLP" in mlp_only.stderr
    top = invoke("route", "Hi", "--model", str(tiny_model_dir("olmoe")), "--top", "3")
    assert top.exit_code == 2 and "--top 3" in top.stderr
    assert invoke("route", "Hi", "--model", str(tiny_model_dir("olmoe")), "--block", "x").exit_code == 2


def test_route_api(tiny_lm):
    import anatomy_cli as anatomy

    lm = tiny_lm("olmoe")
    result = anatomy.route(lm, PROMPTS[1], block="0")
    assert result.to_dict()["rows"][0]["block"] == 0
    assert [type(r) for r in anatomy.route(lm, PROMPTS)] and len(anatomy.route(lm, PROMPTS)) == 2


# ---------------------------------------------------------------- verify's identity

@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_verify_moe_identity_passes_and_catches_a_wrong_rule(tiny_lm, tiny_model_dir, arch, monkeypatch):
    from dataclasses import replace

    from anatomy_cli.analyses.verify.identities import MOE_SUM
    from anatomy_cli.analyses.verify.suite import Plan
    from anatomy_cli.analyses.verify.suite import verify

    lm = tiny_lm(arch)
    enc = engine.encode(lm, PROMPTS)

    def run(model):
        return verify(model, enc, lambda dtype, device: engine.load(str(tiny_model_dir(arch)), dtype=dtype,
                                                                   device=device),
                      Plan(against="transformers", quick=True))

    result = run(lm)
    rows = [c for s in result.sections for c in s.checks if c.name == MOE_SUM]
    assert [c.layer for c in rows] == list(lm.info.moe.sparse_blocks) and all(c.passed for c in rows)
    # The other rule (renormalise or not) gives other weights: the identity fails on every block.
    wrong = replace(lm.info.moe, norm_topk_prob=not lm.info.moe.norm_topk_prob, rule="norm_topk_prob")
    bad = replace(lm, info=replace(lm.info, moe=wrong))
    rows = [c for s in run(bad).sections for c in s.checks if c.name == MOE_SUM]
    assert rows and not any(c.passed for c in rows)


def _route_pictures(model, tmp_path, monkeypatch):
    """``route --plot`` of ``model`` to route.png and route.html: (the JSON rows, the PNG's matplotlib figure, the
    page's text)."""
    from anatomy_cli.output import plots

    saved = []
    real = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path, index=None: saved.append(fig) or real(fig, path, index))
    data = _route_json(model, "--plot", str(tmp_path / "route.png"))
    assert (tmp_path / "route.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    _route_json(model, "--plot", str(tmp_path / "route.html"))
    return data, saved[0], (tmp_path / "route.html").read_text(encoding="utf-8")


def test_route_plot_cells_are_the_top_experts_and_html_hovers_the_weights(tiny_model_dir, tmp_path, monkeypatch):
    import numpy as np

    data, fig, page = _route_pictures(str(tiny_model_dir("olmoe")), tmp_path, monkeypatch)
    image = np.asarray(fig.axes[0].images[0].get_array())
    n = len(data["token_ids"])
    want = [[r["experts"][0] for r in data["rows"] if r["block"] == b] for b in (0, 1)]
    assert image.shape == (2, n) and image.tolist() == want
    row = data["rows"][0]
    assert f"expert {row['experts'][0]}: {row['weights'][0]:.4f}" in page
    assert f"entropy {row['entropy']:.4f} nats" in page


def _plotly_cell_colour(trace: dict, z: float) -> str:
    """The colour plotly.js gives a heatmap cell of value ``z``: its colorscale, which plotly.js uses only when
    valid (positions from 0 to 1, never decreasing; else its default), interpolated at (z - zmin) / (zmax - zmin)."""
    scale = trace["colorscale"]
    positions = [float(p) for p, _ in scale]
    assert positions[0] == 0 and positions[-1] == 1 and positions == sorted(positions), positions
    t = (z - trace["zmin"]) / (trace["zmax"] - trace["zmin"])
    for (lo, c0), (hi, c1) in zip(scale, scale[1:]):
        if lo <= t <= hi and hi > lo:
            assert c0 == c1, "a cell's value must fall inside a flat band"
            return c0.lower()
    raise AssertionError(f"{t} is outside the colorscale")


def test_route_html_colours_are_the_pngs(tiny_model_dir, tmp_path, monkeypatch):
    # New-user trial: in a browser every route.html cell was a near-identical blue (plotly.js fell back to its
    # default colorscale), while route.png colours cells by expert (tab20). The page's colours are the PNG's.
    from matplotlib.colors import to_hex

    data, fig, page = _route_pictures(str(tiny_model_dir("olmoe")), tmp_path, monkeypatch)
    start = page.index("Plotly.newPlot(")
    start = page.index("[", page.index(",", start))
    [trace], _ = json.JSONDecoder().raw_decode(page, start)
    image = fig.axes[0].images[0]
    top = {r["experts"][0] for r in data["rows"]}
    assert len(top) >= 2, top
    rows = {(r["block"], r["position"]): r["experts"][0] for r in data["rows"]}
    html, png = {}, {}
    for (block, position), expert in rows.items():
        z = trace["z"][block][position]
        assert trace["text"][block][position] == str(expert)
        html[expert] = _plotly_cell_colour(trace, z)
        png[expert] = to_hex(image.cmap(image.norm(image.get_array()[block, position])))
    assert html == png
    assert len(set(html.values())) == len(top)  # different top experts, different colours


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_bf16_points_are_what_the_block_used(tiny_model_dir, arch):
    # Mixtral keeps its weights in float32, the Qwen/OLMoE rule casts them to the model's dtype: both as the block.
    lm = engine.load(str(tiny_model_dir(arch)), device="cpu", dtype="bf16")
    enc = engine.encode(lm, PROMPTS[:1])[0]
    names = [f"blocks.0.mlp.hook_{p}" for p in POINTS]
    _, calls = _reference(lm, arch, enc.ids)
    [cache] = engine.run(lm, [enc], names)
    assert cache["blocks.0.mlp.hook_router_logits"].dtype == torch.bfloat16
    assert cache["blocks.0.mlp.hook_expert_weights"].dtype == calls[0][1].dtype == (
        torch.float32 if arch == "mixtral" else torch.bfloat16)
    assert torch.equal(cache["blocks.0.mlp.hook_expert_indices"], calls[0][0])
    assert torch.equal(cache["blocks.0.mlp.hook_expert_weights"], calls[0][1])


@pytest.mark.parametrize("arch", MOE)
def test_moe_info_from_config_json_alone_equals_transformers(tiny_model_dir, arch):
    from transformers import AutoConfig

    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.models.json_config import JsonConfig

    path = tiny_model_dir(arch)
    light = ModelInfo.from_config(JsonConfig(json.loads((path / "config.json").read_text()))).moe
    assert light == ModelInfo.from_config(AutoConfig.from_pretrained(path)).moe
    assert light.to_dict()["sparse_blocks"] == ([0] if arch == "qwen2_moe" else [0, 1])


# ---------------------------------------------------------------- dla --by expert

def _dla_json(model, *args):
    result = invoke("dla", PROMPTS[1], "--model", model, "--target", " much", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("arch", ["mixtral", "qwen2_moe"])
def test_dla_by_expert_rows_add_up_to_the_mlp_row(tiny_model_dir, arch):
    model = str(tiny_model_dir(arch))
    by_layer = {r["component"]: r["contribution"] for r in _dla_json(model)["rows"]}
    data = _dla_json(model, "--by", "expert")
    route = _route_json(model)
    last = len(route["token_ids"]) - 1
    sparse = [0] if arch == "qwen2_moe" else [0, 1]
    for block in range(2):
        rows = [r for r in data["rows"] if r["layer"] == block and not r["component"].endswith(".attn")]
        if block not in sparse:  # Qwen2-MoE's dense block keeps its MLP row
            assert [r["component"] for r in rows] == [f"L{block}.mlp"]
            continue
        chosen = next(r["experts"] for r in route["rows"] if r["block"] == block and r["position"] == last)
        names = [f"L{block}.E{e}" for e in chosen] + ([f"L{block}.shared_expert"] if arch == "qwen2_moe" else [])
        assert [r["component"] for r in rows] == names
        assert sum(r["contribution"] for r in rows) == pytest.approx(by_layer[f"L{block}.mlp"], rel=1e-6, abs=1e-9)
    assert data["total"] == pytest.approx(data["logit"], rel=1e-4, abs=1e-6)


def test_dla_by_expert_on_a_dense_model_is_refused(tiny_model_dir):
    result = invoke("dla", "Hi", "--model", str(tiny_model_dir("llama")), "--target", " much", "--by", "expert")
    assert result.exit_code == 2 and "`dla --by expert` reads the routers" in result.stderr
