"""`anatomy dla`: direct logit attribution.

The identity that makes it right: the rows add up to the model's own logit (or logit difference),
taken from an independent transformers forward, within 1e-4 relative: on GPT-2 (LayerNorm), LLaMA
(RMSNorm), GPT-NeoX (parallel residual), the real SmolLM2, by layer and by head. Single rows are
checked against hooks on the transformers model and a hand-written frozen LayerNorm/RMSNorm.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses.dla import FrozenNorm
from anatomy_cli.analyses.dla import freeze_norm
from anatomy_cli.cli.main import app
from anatomy_cli.engine.decompose import head_outputs
from anatomy_cli.errors import AnatomyError

runner = CliRunner()
PROMPT = "Thank you very"  # GPT-2 ids [10449, 345, 845]; " much" 881, " Paris" 6342
IDS = [10449, 345, 845]


def invoke(*args):
    return runner.invoke(app, list(args))


def dla_json(model, *args, prompt=PROMPT):
    result = invoke("dla", prompt, "--model", str(model), "--device", "cpu", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _out(output):
    """A block's output tensor: a plain tensor (transformers v5) or the first item of a tuple."""
    return output[0] if isinstance(output, tuple) else output


def hf_logits(model, ids, pos=-1) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, pos].double()


# ---------------------------------------------------------------- analysis pieces

def test_frozen_norm_reads_layernorm_and_rmsnorm_from_probes():
    g = torch.Generator().manual_seed(0)
    d = 12
    h = torch.randn(d, generator=g) * 3 + 1
    ln = torch.nn.LayerNorm(d)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(d, generator=g))
        ln.bias.copy_(torch.randn(d, generator=g))
    frozen = freeze_norm(ln, h)
    assert frozen.centred
    sigma = torch.sqrt(h.double().var(unbiased=False) + ln.eps)
    assert frozen.scale == pytest.approx(float(sigma), rel=1e-5)
    torch.testing.assert_close(frozen(h) + frozen.bias, ln(h[None])[0].double(), atol=1e-5, rtol=0)
    # Linear in the parts: the frozen norm of a sum is the sum of the frozen norms.
    parts = torch.randn(3, d, generator=g, dtype=torch.float64)
    torch.testing.assert_close(frozen(parts).sum(0), frozen(parts.sum(0)), atol=1e-12, rtol=0)

    weight = torch.randn(d, generator=g)

    def rms(x):
        return x / torch.sqrt((x.double() ** 2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * weight

    frozen = freeze_norm(rms, h)
    assert not frozen.centred and torch.equal(frozen.bias, torch.zeros(d, dtype=torch.float64))
    torch.testing.assert_close(frozen(h), rms(h[None])[0].double(), atol=1e-5, rtol=0)
    with pytest.raises(AnatomyError, match="not a LayerNorm or RMSNorm"):
        freeze_norm(torch.tanh, h)
    assert isinstance(frozen, FrozenNorm)


def test_head_outputs_add_up_to_the_projection():
    g = torch.Generator().manual_seed(1)
    proj = torch.nn.Linear(8, 6)
    z = torch.randn(8, generator=g)
    heads, bias = head_outputs(z, proj, n_heads=4)
    assert heads.shape == (4, 6)
    with torch.no_grad():
        torch.testing.assert_close(heads.sum(0) + bias, proj(z).double(), atol=1e-6, rtol=0)
        torch.testing.assert_close(heads[1], (z[2:4] @ proj.weight[:, 2:4].T).double(), atol=1e-6, rtol=0)


# ---------------------------------------------------------------- the identity, through the CLI

@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
@pytest.mark.parametrize("by", ["layer", "head"])
def test_rows_add_up_to_the_models_own_logit(arch, by, tiny_model_dir):
    import models

    data = dla_json(tiny_model_dir(arch), "--target", " much", "--foil", " Paris", "--by", by)
    logits = hf_logits(models.build_model(arch), IDS)
    own = float(logits[881] - logits[6342])
    contributions = [r["contribution"] for r in data["rows"]]
    assert sum(contributions) == pytest.approx(data["total"], rel=1e-12)
    assert data["logit"] == pytest.approx(own, rel=1e-5, abs=1e-7)
    assert data["total"] == pytest.approx(own, rel=1e-4, abs=1e-7)
    names = [r["component"] for r in data["rows"]]
    assert names[0] == "embed" and names[-1] == "bias"
    assert ("pos_embed" in names) == (arch == "gpt2")
    if by == "layer":
        assert names[1 + (arch == "gpt2"):-1] == ["L0.attn", "L0.mlp", "L1.attn", "L1.mlp"]
    else:
        heads = [n for n in names if ".H" in n]
        assert heads[:4] == ["L0.H0", "L0.H1", "L0.H2", "L0.H3"] and len(heads) == 8
        assert ("L0.attn_bias" in names) == (arch != "llama")  # LLaMA's o_proj has no bias
    assert data["target"]["token_id"] == 881 and data["foil"]["token_id"] == 6342


@pytest.mark.usefixtures("cached_load")
def test_gpt2_rows_equal_hooks_and_a_hand_written_frozen_layernorm(tiny_model_dir):
    import models

    model = models.build_model("gpt2")
    blocks = model.transformer.h
    seen: dict = {}
    hooks = [model.transformer.h[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("final", _out(o)[0, -1]))]
    for i, b in enumerate(blocks):
        hooks.append(b.attn.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("attn", i), o[0][0, -1])))
        hooks.append(b.mlp.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(("mlp", i), o[0, -1])))
        hooks.append(b.attn.c_proj.register_forward_pre_hook(
            lambda m, a, i=i: seen.__setitem__(("z", i), a[0][0, -1])))
    with torch.no_grad():
        model(torch.tensor([IDS]))
        for h in hooks:
            h.remove()
        h_final = seen["final"].double()
        ln = model.transformer.ln_f
        sigma = torch.sqrt(h_final.var(unbiased=False) + ln.eps)
        u = model.lm_head.weight[881].double()

        def contribution(c):
            c = c.double()
            return float(u @ (ln.weight.double() * (c - c.mean()) / sigma))

        expected = {"embed": contribution(model.transformer.wte.weight[IDS[-1]]),
                    "pos_embed": contribution(model.transformer.wpe.weight[len(IDS) - 1]),
                    "bias": float(u @ ln.bias.double())}
        for i, b in enumerate(blocks):
            expected[f"L{i}.mlp"] = contribution(seen["mlp", i])
            expected[f"L{i}.attn"] = contribution(seen["attn", i])
            w = b.attn.c_proj.weight  # Conv1D: [in, out]
            for head in range(4):
                expected[f"L{i}.H{head}"] = contribution(seen["z", i][head * 8:(head + 1) * 8] @ w[head * 8:(head + 1) * 8])
            expected[f"L{i}.attn_bias"] = contribution(b.attn.c_proj.bias)
    got = {r["component"]: r["contribution"] for by in ("layer", "head")
           for r in dla_json(tiny_model_dir("gpt2"), "--target", " much", "--by", by)["rows"]}
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-5), name


@pytest.mark.usefixtures("cached_load")
def test_llama_rows_equal_a_hand_written_frozen_rmsnorm(tiny_model_dir):
    import models

    model = models.build_model("llama")
    seen: dict = {}
    layers = model.model.layers
    hooks = [layers[-1].register_forward_hook(lambda m, a, o: seen.__setitem__("final", _out(o)[0, -1]))]
    hooks += [layer.mlp.register_forward_hook(lambda m, a, o, i=i: seen.__setitem__(i, o[0, -1]))
              for i, layer in enumerate(layers)]
    with torch.no_grad():
        model(torch.tensor([IDS]))
        for h in hooks:
            h.remove()
        h_final = seen["final"].double()
        rms = torch.sqrt((h_final ** 2).mean() + model.config.rms_norm_eps)
        u = model.lm_head.weight[881].double()
        expected = [float(u @ (model.model.norm.weight.double() * seen[i].double() / rms)) for i in range(2)]
    rows = {r["component"]: r["contribution"] for r in dla_json(tiny_model_dir("llama"), "--target", " much")["rows"]}
    assert [rows["L0.mlp"], rows["L1.mlp"]] == pytest.approx(expected, abs=1e-6)
    assert rows["bias"] == 0.0


def test_real_smollm2_identity_by_layer_and_by_head(smollm2_hf, smollm2_lm, monkeypatch, fixed_load):

    fixed_load(smollm2_lm)
    model, tok = smollm2_hf
    prompt = "The capital of Germany is"
    logits = hf_logits(model, tok(prompt)["input_ids"])
    berlin, paris = tok(" Berlin")["input_ids"][0], tok(" Paris")["input_ids"][0]
    for args, own in ((["--target", " Berlin"], float(logits[berlin])),
                      (["--target", " Berlin", "--foil", " Paris", "--by", "head"], float(logits[berlin] - logits[paris]))):
        data = dla_json("smollm2", *args, prompt=prompt)
        assert data["total"] == pytest.approx(own, rel=1e-4)
        assert data["logit"] == pytest.approx(own, rel=1e-5)
        assert not data["centred"]  # RMSNorm
    assert len(data["rows"]) == 1 + 30 * (9 + 1) + 1  # embed, 9 heads + MLP per layer, bias (no o_proj bias)
    top = max(data["rows"], key=lambda r: r["contribution"])
    assert top["component"].startswith("L") and ".H" in top["component"]


@pytest.mark.usefixtures("cached_load")
def test_refusals_and_bad_input(tiny_model_dir):
    bert = invoke("dla", "paris is nice", "--model", str(tiny_model_dir("bert")), "--target", "paris")
    assert bert.exit_code == 2 and bert.stdout == ""
    errors = [line for line in bert.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is an encoder (bert), not a next-token predictor: `dla` needs a decoder-only" in errors[0]
    model = str(tiny_model_dir("gpt2"))
    for args, message in [([], "dla needs a token"),
                          (["--target", " much", "--foil-id", "881"], "--foil is the same token as --target"),
                          (["--target", " much", "--position", "3"], "--position 3 is out of range"),
                          (["--target", " much", "--foil", ""], "--foil is empty")]:
        result = invoke("dla", PROMPT, "--model", model, *args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
    table = invoke("dla", PROMPT, "--model", model, "--target", " much", "--position", "1", "--format", "table")
    assert table.exit_code == 0, table.stderr
    text = " ".join(table.stdout.split())  # rich wraps the heading at the terminal's width
    assert "direct logit attribution" in text and "position 1 = ·you" in text
    assert "sum of rows" in table.stdout


@pytest.mark.usefixtures("cached_load")
def test_dla_and_report_give_the_same_rows_through_one_function(tiny_model_dir, monkeypatch):
    from anatomy_cli import engine
    from anatomy_cli.analyses import dla as analysis
    from anatomy_cli.cli.commands import _report_run

    calls = []
    real = analysis.logit_attribution

    def spy(*args, **kwargs):
        calls.append(kwargs.get("by_head"))
        return real(*args, **kwargs)

    monkeypatch.setattr(analysis, "logit_attribution", spy)
    path = str(tiny_model_dir("gpt2"))
    lm = engine.load(path, device="cpu")
    (enc,) = engine.encode(lm, [PROMPT])
    an = _report_run.analyse(lm, enc, {"dla", "next"}, model=path)
    top = an.next.top[0].token_id
    data = dla_json(path, "--target-id", str(top), "--by", "head")
    assert calls == [True, True]  # report (by head where the model allows it), then dla --by head
    reported = {r.component: r.contribution for r in an.dla.rows}
    rows = {r["component"]: r["contribution"] for r in data["rows"]}
    assert len(rows) == 1 + 1 + 2 * (4 + 1 + 1) + 1  # embed, pos_embed, per layer 4 heads + bias + mlp, bias
    assert reported.keys() == rows.keys()
    assert [reported[k] for k in rows] == pytest.approx(list(rows.values()), abs=1e-6)
    assert an.dla.total == pytest.approx(data["total"], abs=1e-6) and an.dla.logit == pytest.approx(data["logit"])


def test_soft_capped_logits_are_decomposed_before_the_cap_and_post_norm_heads_through_the_frozen_norm():
    import models

    if "gemma2" not in models.ARCHS:
        pytest.skip("no tiny Gemma 2 in tests/models.py")
    from conftest import build_gpt2_tokenizer

    from anatomy_cli import engine
    from anatomy_cli.analyses.dla import logit_attribution
    from anatomy_cli.engine import decompose

    model = models.build_model("gemma2")
    lm = engine.from_model(model, build_gpt2_tokenizer(), name="gemma2")
    enc = engine.encode(lm, [PROMPT])
    cache = engine.run(lm, enc, decompose.names(lm), positions=[[-1]])[0]
    result = logit_attribution(lm, cache, 881)
    with torch.no_grad():
        hidden = model.model(torch.tensor([IDS])).last_hidden_state[0, -1]
        raw = float(model.lm_head(hidden)[881])                     # before final_logit_softcapping
        capped = float(hf_logits(model, IDS)[881])
    cap = model.config.final_logit_softcapping
    assert capped == pytest.approx(cap * float(torch.tanh(torch.tensor(raw / cap))), rel=1e-5)
    assert result.logit == pytest.approx(raw, rel=1e-5) and result.total == pytest.approx(raw, rel=1e-4)
    # issue 42: per head through the sandwich norm, its scale frozen at this prompt: the rows still add up
    heads = engine.run(lm, enc, decompose.names(lm, by_head=True), positions=[[-1]])[0]
    by_head = logit_attribution(lm, heads, 881, by_head=True)
    assert by_head.head_norm == "post_attention_layernorm" and by_head.total == pytest.approx(raw, rel=1e-4)
