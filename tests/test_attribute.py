"""`anatomy attribute`: Captum's methods against gradients and reruns computed here, integrated gradients'
completeness, occlusion against reruns without the token, the CLI, errors and the plot."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.analyses.ablate import metric_fn
from anatomy_cli.cli.main import app
from anatomy_cli.engine import token_attribution as ta

runner = CliRunner()
PROMPT = "The cat sat on the mat"     # GPT-2: 6 tokens
TARGET, FOIL = 100, 200


def ids(lm, text=PROMPT):
    return engine.encode(lm, [text])[0].ids


def hand_metric(lm, token_ids=None, embeds=None):
    """log p(TARGET) at the last position with transformers' own forward (one prompt)."""
    out = lm.model(input_ids=None if token_ids is None else torch.tensor([token_ids]), inputs_embeds=embeds,
                   use_cache=False)
    return torch.log_softmax(out.logits[0, -1].double(), -1)[TARGET]


def hand_gradient(lm, token_ids):
    with torch.enable_grad():
        embeds = lm.model.get_input_embeddings()(torch.tensor([token_ids])).detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(hand_metric(lm, embeds=embeds), embeds)
    return embeds.detach()[0], grad[0]


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_saliency_and_input_x_gradient_equal_autograd(tiny_lm, arch):
    lm = tiny_lm(arch)
    token_ids = ids(lm)
    embeds, grad = hand_gradient(lm, token_ids)
    sal = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "saliency")
    torch.testing.assert_close(sal.scores, grad.norm(dim=-1).double(), atol=1e-6, rtol=1e-4)
    ixg = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "input-x-gradient")
    torch.testing.assert_close(ixg.scores, (embeds * grad).sum(-1).double(), atol=1e-6, rtol=1e-4)
    assert sal.metric == pytest.approx(float(hand_metric(lm, token_ids).detach()), abs=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_occlusion_rows_equal_reruns_without_the_token(tiny_lm, arch):
    lm = tiny_lm(arch)
    token_ids = ids(lm)
    got = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET, FOIL), "occlusion", batch_size=4)
    assert got.baseline == "drop"
    with torch.no_grad():
        def m(t):
            logits = lm.model(torch.tensor([t]), use_cache=False).logits[0, -1].double()
            return float(logits[TARGET] - logits[FOIL])
        full = m(token_ids)
        for i in range(len(token_ids)):
            assert float(got.scores[i]) == pytest.approx(full - m(token_ids[:i] + token_ids[i + 1:]), abs=1e-5), i
        pad = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET, FOIL), "occlusion", baseline="pad")
        eos = lm.tokenizer.pad_id
        for i in range(len(token_ids)):
            assert float(pad.scores[i]) == pytest.approx(full - m(token_ids[:i] + [eos] + token_ids[i + 1:]), abs=1e-5)


def test_smollm2_integrated_gradients_error_falls_with_steps(smollm2_lm):
    """On the real SmolLM2 from the pad embedding at every position (--vary-first), no doubling: |delta| at 64
    steps is below 8 steps', and delta is sum(attributions) - (f(x) - f(baseline)) computed here."""
    lm = smollm2_lm
    paris = engine.encode(lm, [" Paris"])[0].ids[0]
    token_ids = ids(lm, "The Eiffel Tower is in the city of")
    metric = metric_fn(paris)
    few = ta.attribute_tokens(lm, token_ids, metric, "integrated-gradients", steps=8, baseline="pad", max_steps=8,
                              keep_first=False)
    many = ta.attribute_tokens(lm, token_ids, metric, "integrated-gradients", steps=64, baseline="pad", max_steps=64,
                               keep_first=False)
    for got in (few, many):
        assert got.delta == pytest.approx(float(got.scores.sum()) - (got.metric - got.baseline_metric), abs=1e-4)
    with torch.no_grad():
        pad = [lm.tokenizer.pad_id] * len(token_ids)
        logits = lm.model(torch.tensor([pad]), use_cache=False).logits[0, -1].double()
        assert few.baseline_metric == pytest.approx(float(torch.log_softmax(logits, -1)[paris]), abs=1e-3)
    assert abs(many.delta) < abs(few.delta)


def test_integrated_gradients_zero_and_unk_baselines(tiny_lm):
    lm = tiny_lm("gpt2")
    token_ids = ids(lm)
    zero = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "integrated-gradients", steps=16, baseline="zero",
                               max_steps=16, keep_first=False)
    assert zero.baseline == "zero" and zero.steps == 16
    with torch.no_grad():
        embeds = torch.zeros(1, len(token_ids), lm.d_model)
        assert zero.baseline_metric == pytest.approx(float(hand_metric(lm, embeds=embeds)), abs=1e-5)
    unk = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "integrated-gradients", baseline="unk",
                              keep_first=False)
    assert unk.baseline_metric == pytest.approx(float(hand_metric(lm, [50256] * len(token_ids)).detach()), abs=1e-5)


def test_the_model_is_left_as_it_was(tiny_model_dir):
    lm = engine.load(str(tiny_model_dir("gpt2")), device="cpu")
    params = list(lm.model.parameters())
    flags = [p.requires_grad for p in params]
    token_ids = ids(lm)
    before = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "occlusion").scores
    with torch.inference_mode():
        for method in ta.METHODS:
            ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), method, steps=4)
    assert [p.requires_grad for p in params] == flags and all(p.grad is None for p in params)
    assert torch.equal(before, ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "occlusion").scores)


def test_cli_json_table_batch_and_plot(tiny_model_dir, tiny_lm, cached_load, tmp_path):
    path = str(tiny_model_dir("gpt2"))
    lm = tiny_lm("gpt2")
    result = runner.invoke(app, ["attribute", PROMPT, "--target-id", str(TARGET), "--foil-id", str(FOIL), "-m", path,
                                 "--steps", "16", "--format", "json", "--plot", str(tmp_path / "a.png")])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    core = ta.attribute_tokens(lm, ids(lm), metric_fn(TARGET, FOIL), "integrated-gradients", steps=16)
    assert data["method"] == "integrated-gradients" and data["metric"] == "logit_diff" and data["steps"] == 16
    assert [r["attribution"] for r in data["rows"]] == pytest.approx(core.scores.tolist(), abs=1e-6)
    assert [r["token"] for r in data["rows"]] == ["The", "·cat", "·sat", "·on", "·the", "·mat"]
    total = sum(abs(r["attribution"]) for r in data["rows"])
    assert data["rows"][2]["share"] == pytest.approx(data["rows"][2]["attribution"] / total)
    c = data["completeness"]
    assert c["difference"] == pytest.approx(data["value"] - c["baseline_metric"])
    assert c["relative_error"] == pytest.approx(abs(c["delta"]) / abs(c["difference"]))
    assert (tmp_path / "a.png").read_bytes()[:4] == b"\x89PNG"
    tsv = runner.invoke(app, ["attribute", "-", "--target-id", str(TARGET), "-m", path, "--method", "saliency"],
                        input=f"{PROMPT}\nThank you very\n")
    assert tsv.exit_code == 0, tsv.output
    lines = tsv.stdout.splitlines()
    assert lines[0].split("\t") == ["prompt", "position", "token", "attribution", "share"]
    assert len(lines) == 1 + 6 + 3
    table = runner.invoke(app, ["attribute", PROMPT, "--target-id", str(TARGET), "-m", path, "--format", "table"])
    assert "completeness: sum of attributions" in table.stdout


@pytest.mark.parametrize("extra, message", [
    (["--method", "saliency", "--baseline", "pad"], "--baseline is for integrated-gradients and occlusion"),
    (["--baseline", "drop"], "--baseline drop is for occlusion"),
    (["--steps", "0"], "error: --steps takes a whole number of at least 1"),
])
def test_cli_errors(tiny_model_dir, extra, message):
    result = runner.invoke(app, ["attribute", PROMPT, "--target-id", "1", "-m", str(tiny_model_dir("gpt2")), *extra])
    assert result.exit_code == 2
    assert message in result.output


def test_cli_needs_a_target_and_two_tokens_to_drop(tiny_model_dir):
    path = str(tiny_model_dir("gpt2"))
    result = runner.invoke(app, ["attribute", PROMPT, "-m", path])
    assert result.exit_code == 2 and "--target TEXT or --target-id N is required" in result.output
    result = runner.invoke(app, ["attribute", "Hi", "--target-id", "1", "-m", path, "--method", "occlusion"])
    assert result.exit_code == 2 and "occlusion by dropping needs at least 2 tokens" in result.output


# ---- integrated gradients that add up: defaults, step doubling, the agreement check, a layer ----

def hand_logprob(lm, target, embeds):
    """log p(target) at the last position, transformers' own forward from ``embeds [1, pos, d]``."""
    with torch.no_grad():
        out = lm.model(inputs_embeds=embeds, use_cache=False)
    return float(torch.log_softmax(out.logits[0, -1].double(), -1)[target])


def hand_baseline(lm, token_ids):
    """The default baseline built here: the pad token's embedding at every position but the first."""
    embed = lm.model.get_input_embeddings()
    with torch.no_grad():
        x = embed(torch.tensor([token_ids]))
        b = embed(torch.tensor([[lm.tokenizer.pad_id] * len(token_ids)]))
        b[:, 0] = x[:, 0]
    return x, b


def assert_complete_at_defaults(lm, token_ids, target):
    got = ta.attribute_tokens(lm, token_ids, metric_fn(target), "integrated-gradients")
    x, b = hand_baseline(lm, token_ids)
    difference = hand_logprob(lm, target, x) - hand_logprob(lm, target, b)
    assert got.baseline == "pad" and got.kept_first and got.converged
    assert float(got.scores[0]) == 0.0
    assert abs(float(got.scores.sum()) - difference) <= 0.05 * abs(difference), (got.tries, difference)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("prompt", [PROMPT, "The capital of France is"])
def test_completeness_at_defaults_tiny(tiny_lm, arch, prompt):
    lm = tiny_lm(arch)
    assert_complete_at_defaults(lm, ids(lm, prompt), TARGET)


@pytest.mark.parametrize("prompt, target", [("The capital of France is", " Paris"), ("Thank you very", " much")])
def test_completeness_at_defaults_smollm2(smollm2_lm, prompt, target):
    """The docs' prompts on the real SmolLM2: within 5% at the defaults (pad baseline, first position kept)."""
    lm = smollm2_lm
    assert_complete_at_defaults(lm, ids(lm, prompt), lm.tokenizer.hf.encode(target, add_special_tokens=False)[0])


def test_step_doubling_stops_when_the_error_is_met(tiny_lm):
    from anatomy_cli.engine.integrated import Integral
    from anatomy_cli.engine.integrated import converge

    errors = {4: 0.5, 8: 0.2, 16: 0.01, 32: 0.001}
    seen = []

    def run(n):
        seen.append(n)
        return Integral(n, torch.zeros(1), 0.0, errors[n] * 1.0)     # f(x) - f(b) = 1: relative error = delta
    got = converge(run, 1.0, steps=4, max_steps=256, max_rel_error=0.05)
    assert seen == [4, 8, 16] and got.converged and got.last.steps == 16
    got = converge(run, 1.0, steps=4, max_steps=15, max_rel_error=0.05)
    assert seen[3:] == [4, 8] and not got.converged
    # On a model: every try but the last misses the bound, the last meets it.
    lm = tiny_lm("llama")
    real = ta.attribute_tokens(lm, ids(lm), metric_fn(TARGET), "integrated-gradients", baseline="mean", steps=2)
    assert [n for n, _ in real.tries] == [2 * 2 ** i for i in range(len(real.tries))]
    assert all(e > 0.05 for _, e in real.tries[:-1]) and real.tries[-1][1] <= 0.05 and real.converged


def test_unconverged_exits_1_and_allow_unconverged_marks_it(tiny_model_dir, cached_load):
    path = str(tiny_model_dir("llama"))
    args = ["attribute", PROMPT, "--target-id", str(TARGET), "-m", path, "--steps", "2", "--max-steps", "4",
            "--max-rel-error", "1e-9"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "error: integrated gradients did not converge" in result.output
    assert "tried 2 steps" in result.output and "4 steps" in result.output
    data = json.loads(runner.invoke(app, [*args, "--allow-unconverged", "--format", "json"]).stdout)
    assert data["converged"] is False and data["completeness"]["converged"] is False
    assert [t["steps"] for t in data["completeness"]["tries"]] == [2, 4]
    tsv = runner.invoke(app, [*args, "--allow-unconverged", "--format", "tsv"]).stdout.splitlines()
    assert tsv[0].split("\t")[-1] == "converged" and all(line.endswith("\tFalse") or line.endswith("\tfalse")
                                                         for line in tsv[1:])
    table = runner.invoke(app, [*args, "--allow-unconverged", "--format", "table"]).stdout
    assert "UNCONVERGED" in table


def numpy_spearman(a, b):
    import numpy as np

    def rank(v):
        v = np.asarray(v, dtype=float)
        order = v.argsort(kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(1, len(v) + 1)
        for value in np.unique(v):                       # ties: their average rank
            r[v == value] = r[v == value].mean()
        return r
    return float(np.corrcoef(rank(a), rank(b))[0, 1])


def test_check_equals_an_independent_spearman(tiny_model_dir, tiny_lm, cached_load):
    path = str(tiny_model_dir("gpt2"))
    lm = tiny_lm("gpt2")
    result = runner.invoke(app, ["attribute", PROMPT, "--target-id", str(TARGET), "--foil-id", str(FOIL), "-m", path,
                                 "--check", "--format", "json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    check = data["check"]
    occ = ta.attribute_tokens(lm, ids(lm), metric_fn(TARGET, FOIL), "occlusion", baseline="pad")
    assert check["method"] == "occlusion" and check["baseline"] == "pad" and check["positions"] == [1, 2, 3, 4, 5]
    assert check["attributions"] == pytest.approx(occ.scores.tolist(), abs=1e-6)
    main = [r["attribution"] for r in data["rows"]][1:]
    other = check["attributions"][1:]
    assert check["rank_correlation"] == pytest.approx(numpy_spearman(main, other), abs=1e-12)
    try:
        from scipy.stats import spearmanr
    except ImportError:
        return
    assert check["rank_correlation"] == pytest.approx(float(spearmanr(main, other).statistic), abs=1e-12)


def _descending_ranks(values):
    """1 = the largest (no ties in these tests), by sorting."""
    order = sorted(range(len(values)), key=lambda i: -values[i])
    return {i: order.index(i) + 1 for i in range(len(values))}


def test_check_shows_both_rankings_and_says_when_they_disagree(tiny_model_dir, tiny_lm, cached_load):
    # issue 51 item 14: the occlusion ranking beside integrated gradients', and a disagreement (ρ < 0.5) said
    import dataclasses

    from anatomy_cli.analyses.attribute import Agreement
    from anatomy_cli.output.views import attribute as view

    path = str(tiny_model_dir("gpt2"))
    args = ["attribute", PROMPT, "--target-id", str(TARGET), "-m", path, "--check"]
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    tsv = runner.invoke(app, args).stdout.splitlines()
    header = tsv[0].split("\t")
    assert header[-3:] == ["rank", "occlusion", "occlusion_rank"]
    table = [dict(zip(header, line.split("\t"))) for line in tsv[1:]]
    main = _descending_ranks([r["attribution"] for r in data["rows"]][1:])
    occ = _descending_ranks(data["check"]["attributions"][1:])
    assert table[0]["rank"] == "" and table[0]["occlusion_rank"] == ""  # position 0: kept, not compared
    for p in range(1, len(table)):
        assert int(table[p]["rank"]) == main[p - 1] and int(table[p]["occlusion_rank"]) == occ[p - 1]
        assert float(table[p]["occlusion"]) == pytest.approx(data["check"]["attributions"][p], rel=1e-6)
    rho = numpy_spearman([r["attribution"] for r in data["rows"]][1:], data["check"]["attributions"][1:])
    assert data["check"]["agrees"] is (rho >= 0.5)
    # the disagreeing case: occlusion's scores reversed against integrated gradients' (ρ = -1)
    lm = tiny_lm("gpt2")
    enc = engine.encode(lm, [PROMPT])[0]
    from anatomy_cli.tasks.attribute import AttributeOptions
    from anatomy_cli.tasks.attribute import run_one
    result = run_one(lm, enc, {"target": TARGET, "foil": None}, AttributeOptions(target_id=TARGET, check=True))
    attributions = [r.attribution for r in result.rows]
    reverse = [0.0] + [-a for a in attributions[1:]]
    assert numpy_spearman(attributions[1:], reverse[1:]) == pytest.approx(-1.0)
    against = dataclasses.replace(result, check=Agreement("occlusion", "pad", tuple(range(1, len(reverse))),
                                                          tuple(reverse), -1.0))
    notes = " ".join(view.check_notes(against, against.check))
    assert "DISAGREE (ρ -1.000 < 0.5)" in notes and "--foil" in notes
    agreeing = dataclasses.replace(against.check, rank_correlation=0.8)
    assert not any("DISAGREE" in line for line in view.check_notes(dataclasses.replace(result, check=agreeing),
                                                                    agreeing))


def test_spearman_ties_and_degenerate_cases():
    from anatomy_cli.analyses.attribute import spearman

    a, b = [1.0, 2.0, 2.0, 5.0, -1.0], [0.3, 0.1, 0.1, 0.9, 0.2]
    assert spearman(a, b) == pytest.approx(numpy_spearman(a, b), abs=1e-12)
    assert spearman([1.0, 2.0], [2.0, 1.0]) is None and spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_layer_attributions_sum_to_the_difference(tiny_lm, arch):
    """resid_pre of block 1: the path's ends are f(x) and f(baseline) (transformers' forward here); attn_out of
    block 0: f(x with that activation from the baseline run), patched here with a plain torch hook."""
    lm = tiny_lm(arch)
    token_ids = ids(lm)
    x, b = hand_baseline(lm, token_ids)
    got = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "integrated-gradients", layer=1, site="resid_pre")
    difference = hand_logprob(lm, TARGET, x) - hand_logprob(lm, TARGET, b)
    assert got.layer == 1 and got.site == "resid_pre" and got.converged
    assert abs(float(got.scores.sum()) - difference) <= 0.05 * abs(difference)
    assert got.baseline_metric == pytest.approx(hand_logprob(lm, TARGET, b), abs=1e-4)

    got = ta.attribute_tokens(lm, token_ids, metric_fn(TARGET), "integrated-gradients", layer=0, site="attn_out")
    module = lm.points["blocks.0.hook_attn_out"][0]
    saved = {}

    def keep(_m, _a, out):
        saved["b"] = (out[0] if isinstance(out, tuple) else out).detach().clone()

    def patch(_m, _a, out):
        return (saved["b"], *out[1:]) if isinstance(out, tuple) else saved["b"]
    handle = module.register_forward_hook(keep)
    hand_logprob(lm, TARGET, b)
    handle.remove()
    handle = module.register_forward_hook(patch)
    patched = hand_logprob(lm, TARGET, x)
    handle.remove()
    difference = hand_logprob(lm, TARGET, x) - patched
    assert got.baseline_metric == pytest.approx(patched, abs=1e-4)
    assert abs(float(got.scores.sum()) - difference) <= 0.05 * abs(difference)


@pytest.mark.parametrize("extra, message", [
    (["--method", "saliency", "--layer", "0"], "--layer is for integrated-gradients"),
    (["--layer", "9"], "--layer 9 is out of range"),
    (["--method", "occlusion", "--check"], "--check compares with occlusion"),
])
def test_cli_attribution_option_errors(tiny_model_dir, cached_load, extra, message):
    result = runner.invoke(app, ["attribute", PROMPT, "--target-id", "1", "-m", str(tiny_model_dir("gpt2")), *extra])
    assert result.exit_code == 2 and message in result.output, result.output


def test_table_bars_keep_the_sign(tiny_model_dir, cached_load):
    from anatomy_cli.output.render import signed_bar

    path = str(tiny_model_dir("gpt2"))
    data = json.loads(runner.invoke(app, ["attribute", PROMPT, "--target-id", str(TARGET), "--foil-id", str(FOIL),
                                          "-m", path, "--format", "json"]).stdout)
    values = [r["attribution"] for r in data["rows"]]
    biggest = max(abs(v) for v in values)
    table = runner.invoke(app, ["attribute", PROMPT, "--target-id", str(TARGET), "--foil-id", str(FOIL), "-m", path,
                                "--format", "table"]).stdout
    negative = [v for v in values if v < 0]
    assert negative, values
    assert signed_bar(min(negative) / biggest).strip() in table


@pytest.mark.usefixtures("cached_load")
def test_an_encoder_is_refused_in_attributes_own_words_before_the_weights_load(tiny_model_dir, monkeypatch):
    """The one refusal (capabilities.require) names `attribute`, not ablate or patch; no weight loads."""
    from anatomy_cli.engine import loader

    monkeypatch.setattr(loader.DIRECT, "load_weights", lambda opened: pytest.fail("weights loaded"))
    result = CliRunner().invoke(app, ["attribute", "the cat", "--model", str(tiny_model_dir("bert")),
                                      "--target", "it"])
    assert result.exit_code == 2
    assert "is an encoder (bert), not a next-token predictor: `attribute` needs a decoder-only model" in result.stderr
    assert "ablate and patch" not in result.stderr
