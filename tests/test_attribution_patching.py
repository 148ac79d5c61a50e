"""Attribution patching (`patch/ablate --method attribution`): hook gradients against torch.autograd.grad,
exactness where the model is linear in the patched activation, the model left as it was, the CLI and --check."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.analyses import attribution_patching as ap
from anatomy_cli.analyses.ablate import metric_fn
from anatomy_cli.analyses.patch import logit_metric
from anatomy_cli.cli.main import app
from anatomy_cli.engine import gradients
from anatomy_cli.engine import interventions
from anatomy_cli.errors import UsageError

runner = CliRunner()
CLEAN, CORRUPT = "The cat sat on the mat", "The dog sat on the rug"   # GPT-2: 6 tokens each
TARGET, FOIL = 100, 200


def ids(lm, text):
    return engine.encode(lm, [text])[0].ids


def reference_grads(lm, token_ids, layer):
    """dm/d(resid_pre of `layer`) and dm/d(attn.hook_z of `layer`) by torch.autograd.grad on transformers'
    own forward: hidden_states[layer] is the block's input; z is o_proj's input kept by a plain hook."""
    model = lm.model
    store = {}
    o_proj = lm.points[f"blocks.{layer}.attn.hook_z"][0]
    handle = o_proj.register_forward_pre_hook(lambda m, a: store.setdefault("z", a[0]))
    try:
        with torch.enable_grad():
            embeds = model.get_input_embeddings()(torch.tensor([token_ids])).detach().requires_grad_(True)
            out = model(inputs_embeds=embeds, output_hidden_states=True, use_cache=False)
            logits = out.logits[0, -1].double()
            m = logits[TARGET] - logits[FOIL]                      # the metric, written here by hand
            g_resid, g_z = torch.autograd.grad(m, [out.hidden_states[layer], store["z"]])
    finally:
        handle.remove()
    return float(m.detach()), g_resid[0], g_z[0]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_hook_gradients_equal_autograd_on_a_hand_written_metric(tiny_lm, arch):
    lm = tiny_lm(arch)
    token_ids = ids(lm, CLEAN)
    for layer in range(lm.n_layers):
        names = [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z"]
        run = gradients.metric_gradients(lm, token_ids, names, logit_metric(TARGET, FOIL))
        m, g_resid, g_z = reference_grads(lm, token_ids, layer)
        assert run.metric == pytest.approx(m, abs=1e-5)
        assert float(g_resid.abs().max()) > 0
        torch.testing.assert_close(run.grads[names[0]], g_resid.float(), atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(run.grads[names[1]], g_z.float(), atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_a_companion_row_changes_nothing_and_gives_its_own_activations(tiny_lm, arch):
    # attribution_patch_grid runs CLEAN as a second batch row of CORRUPT's forward. CORRUPT's metric and
    # gradients must still equal autograd on CORRUPT alone, and CLEAN's activations and metric must be
    # CLEAN's own: transformers' hidden_states and the hand-written logit difference of a CLEAN-only forward.
    lm = tiny_lm(arch)
    clean, corrupt = ids(lm, CLEAN), ids(lm, CORRUPT)
    for layer in range(lm.n_layers):
        names = [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z"]
        run = gradients.metric_gradients(lm, corrupt, names, logit_metric(TARGET, FOIL), companion=clean)
        m, g_resid, g_z = reference_grads(lm, corrupt, layer)
        assert run.metric == pytest.approx(m, abs=1e-5)
        torch.testing.assert_close(run.grads[names[0]], g_resid.float(), atol=1e-6, rtol=1e-4)
        torch.testing.assert_close(run.grads[names[1]], g_z.float(), atol=1e-6, rtol=1e-4)
        with torch.no_grad():
            out = lm.model(torch.tensor([clean]), output_hidden_states=True, use_cache=False)
        logits = out.logits[0, -1].double()
        assert run.companion_metric == pytest.approx(float(logits[TARGET] - logits[FOIL]), abs=1e-5)
        torch.testing.assert_close(run.companion_acts[names[0]], out.hidden_states[layer][0], atol=1e-5, rtol=1e-4)
        assert not torch.equal(run.companion_acts[names[0]], run.acts[names[0]])
    with pytest.raises(UsageError, match="different token counts"):
        gradients.metric_gradients(lm, corrupt, names, logit_metric(TARGET, FOIL), companion=clean[:-1])


def test_hook_gradients_equal_autograd_on_smollm2(smollm2_lm):
    lm = smollm2_lm
    paris, rome = (engine.encode(lm, [t])[0].ids[0] for t in (" Paris", " Rome"))
    token_ids = ids(lm, "The Eiffel Tower is in the city of")
    global TARGET, FOIL
    saved = TARGET, FOIL
    TARGET, FOIL = paris, rome
    try:
        for layer in (0, 17):
            names = [f"blocks.{layer}.hook_resid_pre", f"blocks.{layer}.attn.hook_z"]
            run = gradients.metric_gradients(lm, token_ids, names, logit_metric(paris, rome))
            m, g_resid, g_z = reference_grads(lm, token_ids, layer)
            assert run.metric == pytest.approx(m, abs=1e-3)
            torch.testing.assert_close(run.grads[names[0]], g_resid.float(), atol=1e-4, rtol=1e-3)
            torch.testing.assert_close(run.grads[names[1]], g_z.float(), atol=1e-4, rtol=1e-3)
    finally:
        TARGET, FOIL = saved


@pytest.fixture(scope="module")
def linear_lm():
    """A tiny LLaMA whose logits are a linear read-out of the last block's input: that block's attention and
    MLP write zeros (o_proj and down_proj zeroed) and the final RMSNorm is the identity."""
    import models
    from conftest import build_gpt2_tokenizer

    model = models.build_model("llama", seed=1)
    last = model.model.layers[-1]
    with torch.no_grad():
        last.self_attn.o_proj.weight.zero_()
        last.mlp.down_proj.weight.zero_()
    model.model.norm = torch.nn.Identity()
    return engine.from_model(model, build_gpt2_tokenizer(), name="linear-llama")


def test_attribution_patching_equals_exact_patching_where_the_model_is_linear(linear_lm):
    lm = linear_lm
    clean, corrupt = ids(lm, CLEAN), ids(lm, CORRUPT)
    metric = logit_metric(TARGET, FOIL)
    last = lm.n_layers - 1
    for site, rows in (("resid_pre", [last]), ("resid_post", [last - 1, last])):
        est = gradients.attribution_patch_grid(lm, clean, corrupt, site, reduce=metric)
        exact = interventions.patch_grid(lm, clean, corrupt, site, reduce=metric)
        change = exact.grid.double().cpu() - float(exact.corrupt)
        assert est.corrupt == pytest.approx(float(exact.corrupt), abs=1e-5)
        assert est.clean == pytest.approx(float(exact.clean), abs=1e-5)
        for layer in rows:
            assert abs(float(change[layer, -1])) > 1e-3           # the last position moves the metric
            torch.testing.assert_close(est.estimate[layer], change[layer], atol=1e-5, rtol=1e-4)
    # Earlier layers are not linear: there the estimate is only an estimate.
    est = gradients.attribution_patch_grid(lm, clean, corrupt, "resid_pre", reduce=metric)
    exact = interventions.patch_grid(lm, clean, corrupt, "resid_pre", reduce=metric)
    assert not torch.allclose(est.estimate[0], exact.grid[0].double().cpu() - float(exact.corrupt), atol=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_attribution_ablation_is_the_linearisation_of_each_ablation(tiny_lm, arch):
    lm = tiny_lm(arch)
    token_ids = ids(lm, CLEAN)
    metric = metric_fn(TARGET)
    for mode in ("zero", "mean"):
        plan = interventions.ablation_rows(lm, components=["head", "attn"], mode=mode)
        base, est = gradients.attribution_ablation(lm, token_ids, [e for *_, e in plan], reduce=metric)
        # By hand: the gradient at the intact run (metric_gradients is checked against autograd above), times
        # the change each ablation makes.
        names = [f"blocks.{layer}.attn.hook_z" for layer in range(lm.n_layers)]
        names += [f"blocks.{layer}.hook_attn_out" for layer in range(lm.n_layers)]
        run = gradients.metric_gradients(lm, token_ids, names, metric)
        assert base == pytest.approx(run.metric)
        for (layer, component, head, _), value in zip(plan, est.tolist()):
            name = f"blocks.{layer}." + ("attn.hook_z" if component == "head" else "hook_attn_out")
            a, g = run.acts[name], run.grads[name]
            if head is not None:
                a, g = a[:, head * lm.d_head:(head + 1) * lm.d_head], g[:, head * lm.d_head:(head + 1) * lm.d_head]
            new = torch.zeros_like(a) if mode == "zero" else a.mean(0, keepdim=True).expand_as(a)
            assert value == pytest.approx(float(((new - a) * g).double().sum()), abs=1e-6)


def test_the_model_is_left_as_it_was(tiny_model_dir):
    """What a `serve` process relies on: after gradients, every weight keeps its requires_grad flag, no
    .grad is left, and the next inference run gives the same numbers."""
    lm = engine.load(str(tiny_model_dir("llama")), device="cpu")
    params = list(lm.model.parameters())
    params[0].requires_grad_(False)               # a mix of flags, to see each one restored
    flags = [p.requires_grad for p in params]
    clean, corrupt = ids(lm, CLEAN), ids(lm, CORRUPT)
    metric = logit_metric(TARGET, FOIL)
    before = interventions.patch_grid(lm, clean, corrupt, "attn_out", reduce=metric)
    gradients.attribution_patch_grid(lm, clean, corrupt, "head", reduce=metric)
    with torch.inference_mode():                  # also inside an outer inference_mode (serve's handlers)
        gradients.attribution_ablation(lm, clean, [e for *_, e in interventions.ablation_rows(
            lm, components=["mlp"], mode="zero")], reduce=metric)
    with pytest.raises(ZeroDivisionError):        # a failing run restores the flags too
        gradients.metric_gradients(lm, clean, ["blocks.0.hook_resid_pre"], lambda logits: 1 / 0)
    assert [p.requires_grad for p in params] == flags
    assert all(p.grad is None for p in params)
    assert torch.is_grad_enabled()
    after = interventions.patch_grid(lm, clean, corrupt, "attn_out", reduce=metric)
    assert torch.equal(before.grid, after.grid)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in lm.model.modules())


def test_compare_scores():
    check = ap.compare([{"layer": i} for i in range(4)], [4.0, -3.0, 2.0, 1.0], [3.0, -1.0, 2.5, 0.0], scale=2.0)
    assert check.top_k == 2 and check.top_agreement == 0.5      # estimate top 2: {0, 1}; exact top 2: {0, 2}
    x, y = [4.0, -3.0, 2.0, 1.0], [3.0, -1.0, 2.5, 0.0]
    mx, my = sum(x) / 4, sum(y) / 4
    r = sum((a - mx) * (b - my) for a, b in zip(x, y)) / (
        sum((a - mx) ** 2 for a in x) ** 0.5 * sum((b - my) ** 2 for b in y) ** 0.5)
    assert check.pearson == pytest.approx(r)
    assert check.cells[1].estimate_value == -1.5 and check.cells[1].exact_value == -0.5
    assert ap.pearson([1.0], [2.0]) is None and ap.pearson([1.0, 1.0], [1.0, 2.0]) is None
    assert ap.largest(torch.tensor([[1.0, -5.0], [3.0, 0.5]]), 3) == [1, 2, 0]
    # CLEAN = CORRUPT: every estimate and every exact change is 0, so no top k exists (was "1.00")
    same = ap.compare([{"layer": i} for i in range(3)], [0.0, 0.0, 0.0], [0.0, -0.0, 0.0], scale=None)
    assert same.top_agreement is None and same.pearson is None


def test_patch_cli_attribution_json_and_check(tiny_model_dir, tiny_lm, cached_load):
    path = str(tiny_model_dir("gpt2"))
    lm = tiny_lm("gpt2")
    args = ["patch", CLEAN, CORRUPT, "--target-id", str(TARGET), "--foil-id", str(FOIL), "-m", path, "--site",
            "head", "--method", "attribution"]
    result = runner.invoke(app, [*args, "--check", "5", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    core = gradients.attribution_patch_grid(lm, ids(lm, CLEAN), ids(lm, CORRUPT), "head",
                                            reduce=logit_metric(TARGET, FOIL))
    assert data["method"] == "attribution"
    assert [c["metric"] for c in data["cells"]] == pytest.approx((core.corrupt + core.estimate).reshape(-1).tolist())
    scale = data["clean_metric"] - data["corrupt_metric"]
    assert data["cells"][3]["value"] == pytest.approx(float(core.estimate.reshape(-1)[3]) / scale)
    check = data["check"]
    assert len(check["cells"]) == 5 and check["top_k"] == 3
    exact = interventions.patch_grid(lm, ids(lm, CLEAN), ids(lm, CORRUPT), "head", reduce=logit_metric(TARGET, FOIL))
    for cell in check["cells"]:
        assert cell["exact"] == pytest.approx(float(exact.grid[cell["layer"], cell["head"]]) - float(exact.corrupt),
                                              abs=1e-5)
        assert cell["estimate"] == pytest.approx(float(core.estimate[cell["layer"], cell["head"]]))
    biggest = sorted(core.estimate.abs().reshape(-1).tolist(), reverse=True)[:5]
    assert [abs(c["estimate"]) for c in check["cells"]] == pytest.approx(biggest)
    tsv = runner.invoke(app, [*args, "--check", "3"])
    assert tsv.exit_code == 0
    blocks = tsv.stdout.strip().split("\n\n")
    assert blocks[1].splitlines()[0].split("\t") == ["layer", "head", "estimate", "exact", "estimate_value",
                                                     "exact_value"]
    assert "Pearson r = " in tsv.stderr and "top-2 agreement" in tsv.stderr
    exact_json = json.loads(runner.invoke(app, [*args[:-2], "--format", "json"]).stdout)
    assert exact_json["method"] == "exact" and "check" not in exact_json


def test_ablate_cli_attribution(tiny_model_dir, tiny_lm, cached_load):
    path = str(tiny_model_dir("llama"))
    lm = tiny_lm("llama")
    result = runner.invoke(app, ["ablate", CLEAN, "--target-id", str(TARGET), "-m", path, "--heads", "--method",
                                 "attribution", "--check", "4", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    plan = interventions.ablation_rows(lm, components=["head"], mode="zero")
    base, est = gradients.attribution_ablation(lm, ids(lm, CLEAN), [e for *_, e in plan], reduce=metric_fn(TARGET))
    assert data["clean_metric"] == pytest.approx(base)
    assert [r["effect"] for r in data["rows"]] == pytest.approx(est.tolist())
    _, exact = interventions.run_edits(lm, ids(lm, CLEAN), [e for *_, e in plan], reduce=metric_fn(TARGET))
    for cell in data["check"]["cells"]:
        i = cell["layer"] * lm.n_heads + cell["head"]
        assert cell["component"] == "head"
        assert cell["exact"] == pytest.approx(float(exact[i]) - base, abs=1e-5)
    batch = runner.invoke(app, ["ablate", "-", "--target-id", str(TARGET), "-m", path, "--method", "attribution",
                                "--format", "jsonl"], input=f"{CLEAN}\n{CORRUPT}\n")
    assert batch.exit_code == 0 and len(batch.stdout.splitlines()) == 2


@pytest.mark.parametrize("cmd", [["patch", CLEAN, CORRUPT], ["ablate", CLEAN]])
def test_check_needs_the_attribution_method(tiny_model_dir, cmd):
    result = runner.invoke(app, [*cmd, "--target-id", "1", "-m", str(tiny_model_dir("gpt2")), "--check", "3"])
    assert result.exit_code == 2
    assert "--check N compares attribution estimates with exact runs: it needs --method attribution" in result.output


def test_metric_logits_computes_only_the_metric_columns(tiny_lm):
    from anatomy_cli.engine.forwarding import head_logits
    from anatomy_cli.engine.forwarding import metric_logits
    lm = tiny_lm("llama")
    hidden = torch.randn(5, lm.d_model, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    weight = lm.points["logits"][0].weight
    for metric in (logit_metric(TARGET, FOIL), logit_metric(TARGET)):
        assert metric.token_ids == ((TARGET, FOIL) if len(metric.token_ids) == 2 else (TARGET,))
        m = metric_logits(lm, hidden, metric)
        by_hand = (hidden.double() @ weight.double().T)[:, TARGET]
        if len(metric.token_ids) == 2:
            by_hand = by_hand - (hidden.double() @ weight.double().T)[:, FOIL]
        torch.testing.assert_close(m, by_hand, atol=1e-5, rtol=1e-5)
        (grad,) = torch.autograd.grad(m.sum(), hidden)
        want = weight[TARGET] - (weight[FOIL] if len(metric.token_ids) == 2 else 0)
        torch.testing.assert_close(grad, want.expand_as(grad), atol=1e-6, rtol=1e-5)
    def whole(logits):                    # names no columns: the whole head, as head_logits
        return logits.sum(-1)
    assert torch.equal(metric_logits(lm, hidden, whole), head_logits(lm, hidden).sum(-1))
