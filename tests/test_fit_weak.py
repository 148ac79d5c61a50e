"""Fits too weak to read are said to be (issue 61, item 5): a fitted lens against the logit lens on held-out text at
fit time and on the prompt where `lens --lens` reads it; transcoders whose reconstruction explains little of the
MLP output where `circuit` uses them; `fit-sae`'s too-weak dictionaries in one line. Before the fix none of these
notes existed (a 2-prompt Jacobian lens read "HETATM" at blocks 0-21 in silence)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

import anatomy_cli as api
from anatomy_cli.analyses.lens_check import MARGIN
from anatomy_cli.analyses.lens_check import LensCheck
from anatomy_cli.cli.main import app

PROMPT = "The quick brown fox jumps over the lazy dog"


def test_weak_rows_are_those_not_within_the_margin_of_the_logit_lens():
    check = LensCheck(("embed", 0, 1, 2), (5.0, 4.0, 1.0, 2.0), (6.0, 20.0, 10.0, 3.0), 12)
    assert check.weak == tuple(r for r, f, g in zip(check.reads, check.kl_fitted, check.kl_logit) if f > MARGIN * g)
    assert check.weak == ("embed", 2)
    note = check.note("the tuned lens DIR", "this prompt")
    assert "embed and block 2 (2 of 4 rows" in note and "too weak to read" in note
    assert LensCheck((0,), (1.0,), (10.0,), 3).note("x", "y") is None


def _identity_lens(path, lm):
    d, n = lm.info.d_model, lm.n_layers
    torch.save({"J": {b: torch.eye(d) for b in range(n - 1)}, "n_prompts": 2, "source_layers": list(range(n - 1)),
                "d_model": d}, path)
    return path


def test_the_check_is_the_logit_lens_kl_by_hand_and_an_identity_lens_is_flagged(tiny_lm, tmp_path):
    from anatomy_cli.engine import fitted_lens
    from anatomy_cli.models.lens_choice import parse
    from anatomy_cli.tasks._lens_check import check_ids

    lm = tiny_lm("llama")
    lens = fitted_lens.open_lens(parse(f"jacobian:{_identity_lens(tmp_path / 'eye.pt', lm)}"),
                                 d_model=lm.info.d_model, n_layers=lm.n_layers)
    ids = lm.tokenizer.hf(PROMPT)["input_ids"]
    check = check_ids(lm, lens, ids)
    with torch.no_grad():  # transformers' own hidden states, final norm and LM head
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
        final = torch.log_softmax(out.logits[0].double(), -1)
        want = []
        for b in range(lm.n_layers - 1):
            h = out.hidden_states[b + 1][0]
            q = torch.log_softmax(lm.model.lm_head(lm.model.model.norm(h)).double(), -1)
            want.append(float((final.exp() * (final - q)).sum(-1).mean()))
    assert check.reads == tuple(range(lm.n_layers - 1)) and check.tokens == len(ids)
    torch.testing.assert_close(torch.tensor(check.kl_logit), torch.tensor(want), rtol=1e-5, atol=1e-6)
    assert check.kl_fitted == pytest.approx(check.kl_logit, rel=1e-6)  # J = I reads as the logit lens
    assert check.weak == check.reads


def test_lens_says_when_the_fitted_lens_is_too_weak_on_the_prompt(tiny_model_dir, tiny_lm, tmp_path):
    lens = _identity_lens(tmp_path / "eye.pt", tiny_lm("llama"))
    res = CliRunner().invoke(app, ["lens", PROMPT, "--model", str(tiny_model_dir("llama")), "--lens",
                                   f"jacobian:{lens}", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert f"the jacobian lens {lens} is not within {MARGIN:g}x the logit lens's KL" in res.stderr
    assert "on this prompt" in res.stderr and "too weak to read" in res.stderr
    json.loads(res.stdout)  # stdout stays the result


def test_fit_lens_checks_the_written_lens_on_held_out_text(tiny_lm, tmp_path):
    from anatomy_cli.tasks import notes

    lm = tiny_lm("llama")
    collected = notes.Collected()
    with notes.using_notes(collected):
        r = api.fit_lens(lm, "jacobian", [PROMPT + " and runs away into the forest"], out=tmp_path / "j.pt",
                         skip_first=2, dim_batch=16)
    check = r.data["held_out_check"]
    assert [row["reads"] for row in check["rows"]] == list(range(lm.n_layers - 1))
    weak = [row["reads"] for row in check["rows"] if row["kl_fitted_nats"] > MARGIN * row["kl_logit_nats"]]
    assert check["weak"] == weak
    assert bool(weak) == any("too weak to read" in w and "held-out text" in w for w in collected.warnings)


def test_circuit_says_when_its_transcoders_are_too_weak(tiny_model_dir, tiny_lm, tmp_path):
    """On 8 positions or more (the prompt's 1..: MIN_ROWS, the rule sae's warnings apply); a shorter
    prompt's FVE says little and is not judged (it was: circuit called 4 positions' FVE too weak)."""
    from test_circuit import random_transcoders
    from test_circuit import write_transcoder_set

    from anatomy_cli.analyses import circuit as algo
    from anatomy_cli.analyses.sae import too_weak
    from anatomy_cli.declare.shared import MIN_ROWS

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    tdir = write_transcoder_set(tmp_path / "tc", lm, tcs)
    for prompt in (PROMPT, "The capital of France is"):  # FVE at positions 1..: 8 positions, then 4 (not judged)
        ids = torch.tensor(lm.tokenizer.hf(prompt)["input_ids"])
        fve = algo.setup(lm, ids, tcs).fve
        assert all(f < 0.5 for f in fve)  # random transcoders explain nothing
        weak = [layer for layer, f in enumerate(fve) if too_weak(f, len(ids) - 1)]
        assert weak == (list(range(lm.n_layers)) if len(ids) - 1 >= MIN_ROWS else [])
        graph = tmp_path / f"graph-{len(ids)}.json"
        res = CliRunner().invoke(app, ["circuit", prompt, "--model", str(tiny_model_dir("llama")),
                                       "--transcoders", str(tdir), "--max-feature-nodes", "8", "-f", "json",
                                       "--json", str(graph)])
        assert res.exit_code == 0, res.output
        said = f"the transcoders are too weak to read at {len(weak)} of {lm.n_layers} blocks"
        assert (said in res.stderr) is bool(weak) and ("too weak" in res.stderr) is bool(weak), res.stderr
        # the result's JSON says its warnings too, always a list (empty: none); the Neuronpedia graph JSON
        # (--json, circuit-tracer's own keys) does not
        warned = [line.removeprefix("warning: ") for line in res.stderr.splitlines() if line.startswith("warning: ")]
        assert json.loads(res.stdout)["warnings"] == warned and len(warned) == bool(weak)
        assert sorted(json.loads(graph.read_text())) == ["links", "metadata", "nodes", "qParams"]
    # a prompt over the context, kept by --truncate left: the encoding's warning comes first, then the graph's
    long = " ".join([PROMPT] * 10)
    n = len(lm.tokenizer.hf(long)["input_ids"])
    assert n > lm.info.n_ctx
    model = str(tiny_model_dir("llama"))
    res = CliRunner().invoke(app, ["circuit", long, "--model", model, "--transcoders",
                                   str(tdir), "--max-feature-nodes", "8", "--truncate", "left", "-f", "json"])
    assert res.exit_code == 0, res.output
    warned = json.loads(res.stdout)["warnings"]
    assert [w.split(":")[0] for w in warned] == [f"prompt is {n} tokens; {model} takes at most {lm.info.n_ctx}",
                                                 f"the transcoders are too weak to read at {lm.n_layers} of "
                                                 f"{lm.n_layers} blocks on this prompt (FVE under 0.5 of the MLP output"]
    assert all(f"warning: {w}" in res.stderr.splitlines() for w in warned), res.stderr
    # the Python API's Result carries the same warnings as the notes it said them to
    from anatomy_cli.tasks import notes
    from anatomy_cli.text.options import PromptOptions

    said = notes.Collected()
    with notes.using_notes(said):
        r = api.circuit(lm, long, transcoders=str(tdir), max_feature_nodes=8, prompts=PromptOptions(truncate="left"))
    assert r.data["warnings"] == said.warnings and [w.split(";")[0] for w in said.warnings] == \
        [f"prompt is {n} tokens", warned[1].split(";")[0]]
    # --estimate computes no graph: its JSON has the encoding's warning alone
    res = CliRunner().invoke(app, ["circuit", long, "--model", model, "--transcoders", str(tdir), "--truncate", "left",
                                   "--estimate", "-f", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["warnings"] == warned[:1] and f"warning: {warned[0]}" in res.stderr.splitlines()


def test_fve_is_the_mlp_outputs_by_hand(tiny_lm):
    from test_circuit import random_transcoders

    from anatomy_cli.analyses import circuit as algo
    from anatomy_cli.engine import replacement as rep

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    ids = torch.tensor(lm.tokenizer.hf("The capital of France is")["input_ids"])
    s = algo.setup(lm, ids, tcs)
    with rep.frozen(lm), torch.no_grad():
        fw = rep.forward(lm, ids, algo.as_stack(tcs), 1)
    for layer, f in enumerate(s.fve):
        target = fw.mlp_out[layer][0][1:].double()
        err = s.errors[layer, 1:].double()
        assert f == pytest.approx(float(1 - err.pow(2).sum() / (target - target.mean(0)).pow(2).sum()), rel=1e-9)
