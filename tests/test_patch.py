"""`anatomy patch`: the batched patching core against hooks written here, identities, the CLI, and
causal tracing on the real SmolLM2."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.analyses.patch import logit_metric
from anatomy_cli.analyses.patch import normalize
from anatomy_cli.cli.main import app
from anatomy_cli.engine import interventions as iv

runner = CliRunner()
CLEAN, CORRUPT = "The cat sat on the mat", "The dog sat on the rug"   # GPT-2: 6 tokens each, differ at 1 and 5
TARGET, FOIL = 100, 200
METRIC = logit_metric(TARGET, FOIL)
SITES = ["resid_pre", "attn_out", "mlp_out", "head", "resid_post"]


def ids(lm, text):
    return engine.encode(lm, [text])[0].ids


def hand_patch(lm, clean_ids, corrupt_ids, site, layer, column):
    """The same patch with a plain forward hook on the transformers model: metric of the patched run."""
    name = f"blocks.{layer}.{iv.SITES[site].hook}"
    module, side = lm.points[name]
    store = {}

    def keep(value):  # returns None: a hook that returns a value replaces the activation
        store["x"] = (value if torch.is_tensor(value) else value[0]).clone()

    grab = (module.register_forward_pre_hook(lambda m, a: keep(a[0])) if side == "input"
            else module.register_forward_hook(lambda m, a, o: keep(o)))
    with torch.no_grad():
        lm.model(torch.tensor([clean_ids]))
    grab.remove()
    source = store["x"]

    def edit(t):
        t = t.clone()
        if site == "head":
            cols = slice(column * lm.d_head, (column + 1) * lm.d_head)
            t[0, :, cols] = source[0, :, cols]
        else:
            t[0, column] = source[0, column]
        return t

    if side == "input":
        handle = module.register_forward_pre_hook(lambda m, a: (edit(a[0]), *a[1:]))
    else:
        handle = module.register_forward_hook(lambda m, a, o: edit(o) if torch.is_tensor(o) else (edit(o[0]), *o[1:]))
    try:
        with torch.no_grad():
            logits = lm.model(torch.tensor([corrupt_ids])).logits[0, -1]
    finally:
        handle.remove()
    return float(logits[TARGET] - logits[FOIL])


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_cells_equal_a_hand_written_hook_and_batched_equals_single(tiny_lm, arch):
    lm = tiny_lm(arch)
    clean, corrupt = ids(lm, CLEAN), ids(lm, CORRUPT)
    assert len(clean) == len(corrupt) == 6
    for site in SITES:
        run = iv.patch_grid(lm, clean, corrupt, site, reduce=METRIC, batch_size=5)
        n_cols = lm.n_heads if site == "head" else 6
        assert run.grid.shape == (lm.n_layers, n_cols) and run.columns == tuple(range(n_cols))
        for layer, column in [(0, 1), (1, n_cols - 1)]:
            assert float(run.grid[layer, column]) == pytest.approx(
                hand_patch(lm, clean, corrupt, site, layer, column), abs=1e-5), (site, layer, column)
        single = iv.patch_grid(lm, clean, corrupt, site, reduce=METRIC, batch_size=1)
        torch.testing.assert_close(single.grid, run.grid, atol=1e-6, rtol=0)
        with torch.no_grad():
            ref = lm.model(torch.tensor([clean, corrupt])).logits[:, -1]
        assert float(run.clean) == pytest.approx(float(ref[0, TARGET] - ref[0, FOIL]), abs=1e-5)
        assert float(run.corrupt) == pytest.approx(float(ref[1, TARGET] - ref[1, FOIL]), abs=1e-5)


@pytest.mark.parametrize("arch", ["gpt2", "qwen2", "gpt_neox"])
def test_identities(tiny_lm, arch):
    lm = tiny_lm(arch)
    clean, corrupt = ids(lm, CLEAN), ids(lm, CORRUPT)
    differ = tuple(i for i, (a, b) in enumerate(zip(clean, corrupt)) if a != b)
    assert differ == (1, 5)
    # resid_pre of layer 0 at every differing position: the corrupt run becomes the clean run.
    clean_run = engine.run(lm, engine.encode(lm, [CLEAN]), ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_post"])[0]
    first = [iv.Edit("resid_pre", 0, positions=differ, value=clean_run["resid_pre", 0][list(differ)])]
    last = [iv.Edit("resid_post", lm.n_layers - 1, positions=(5,), value=clean_run["resid_post", -1][5:])]
    base, edited = iv.run_edits(lm, corrupt, [first, last, []], reduce=METRIC)
    grid = iv.patch_grid(lm, clean, corrupt, "resid_post", reduce=METRIC)
    m_clean, m_corrupt = float(grid.clean), float(grid.corrupt)
    assert m_clean != m_corrupt
    assert normalize(float(edited[0]), m_clean, m_corrupt) == pytest.approx(1.0, abs=1e-4)
    assert normalize(float(edited[1]), m_clean, m_corrupt) == pytest.approx(1.0, abs=1e-4)
    assert float(edited[2]) == float(base[0]) == pytest.approx(m_corrupt, abs=1e-5)
    # The last layer's residual at the final position, as a grid cell, is the clean run.
    assert normalize(float(grid.grid[-1, -1]), m_clean, m_corrupt) == pytest.approx(1.0, abs=1e-4)
    # Positions where the prompts agree carry nothing at layer 0 (causal: nothing differs yet).
    pre = iv.patch_grid(lm, clean, corrupt, "resid_pre", reduce=METRIC)
    assert float(pre.grid[0, 0]) == pytest.approx(m_corrupt, abs=1e-6)
    # CORRUPT patched with itself: every cell of every site is the corrupt run (normalized 0).
    for site in SITES:
        same = iv.patch_grid(lm, clean, corrupt, site, reduce=METRIC, source_ids=corrupt)
        values = [normalize(float(m), m_clean, m_corrupt) for m in same.grid.flatten()]
        assert values == pytest.approx([0.0] * len(values), abs=1e-5), site


def test_edits_are_checked_and_hooks_removed(tiny_lm):
    from anatomy_cli.errors import UsageError

    lm = tiny_lm("gpt2")
    corrupt = ids(lm, CORRUPT)
    bad = [[iv.Edit("resid_pre", 2, mode="zero")], [iv.Edit("head", 0, head=4, mode="zero")],
           [iv.Edit("mlp_out", 0, positions=(6,), mode="zero")], [iv.Edit("resid_mid_typo", 0, mode="zero")]]
    for row, message in zip(bad, ["layer 2 is out of range", "head 4 is out of range", "position 6 is out of range",
                                  "unknown site"]):
        with pytest.raises(UsageError, match=message):
            iv.run_edits(lm, corrupt, [row], reduce=METRIC)
    with pytest.raises(UsageError, match="different token counts"):
        iv.patch_grid(lm, ids(lm, CLEAN), corrupt[:-1], "resid_pre", reduce=METRIC)
    # Ours only: transformers installs its own output-capturing hooks once per model and keeps them.
    ours = [fn for m in lm.model.modules() for fn in (*m._forward_hooks.values(), *m._forward_pre_hooks.values())
            if getattr(getattr(fn, "func", fn), "__module__", "").startswith("anatomy_cli")]
    assert ours == []


# ---------------------------------------------------------------- CLI (tiny models, loaded once)

def invoke(*args):
    return runner.invoke(app, list(args))


def patch_cli(model_dir, *args, clean=CLEAN, corrupt=CORRUPT):
    return invoke("patch", clean, corrupt, "--model", str(model_dir), "--device", "cpu", *args)


@pytest.mark.usefixtures("cached_load")
def test_cli_json_equals_the_core(tiny_model_dir, tiny_lm):
    lm = tiny_lm("llama")
    result = patch_cli(tiny_model_dir("llama"), "--target", " mat", "--foil", " rug", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    target, foil = ids(lm, " mat")[0], ids(lm, " rug")[0]
    run = iv.patch_grid(lm, ids(lm, CLEAN), ids(lm, CORRUPT), "resid_pre", reduce=logit_metric(target, foil))
    assert data["site"] == "resid_pre" and data["metric"] == "logit_diff"
    assert data["target"] == {"token_id": target, "token": "·mat", "text": " mat"} and data["foil"]["token"] == "·rug"
    assert data["clean"]["tokens"] == ["The", "·cat", "·sat", "·on", "·the", "·mat"]
    assert data["differing_positions"] == [1, 5]
    assert data["clean_metric"] == pytest.approx(float(run.clean), abs=1e-9)
    assert data["corrupt_metric"] == pytest.approx(float(run.corrupt), abs=1e-9)
    cells = data["cells"]
    assert len(cells) == lm.n_layers * 6
    assert set(cells[0]) == {"layer", "position", "head", "value", "metric"}
    assert [(c["layer"], c["position"], c["head"]) for c in cells[:7]] == [(0, p, None) for p in range(6)] + [(1, 0, None)]
    for c in cells:
        m = float(run.grid[c["layer"], c["position"]])
        assert c["metric"] == pytest.approx(m, abs=1e-9)
        assert c["value"] == pytest.approx((m - data["corrupt_metric"]) / (data["clean_metric"] - data["corrupt_metric"]))
    heads = json.loads(patch_cli(tiny_model_dir("llama"), "--target", " mat", "--site", "head", "-f", "json").stdout)
    assert heads["metric"] == "logit" and len(heads["cells"]) == lm.n_layers * lm.n_heads
    assert {(c["position"], c["head"]) for c in heads["cells"][:4]} == {(None, h) for h in range(4)}


@pytest.mark.usefixtures("cached_load")
def test_cli_table_tsv_and_batch_size(tiny_model_dir):
    model = tiny_model_dir("gpt2")
    tsv = patch_cli(model, "--target", " mat", "--foil", " rug", "--site", "mlp_out")
    assert tsv.exit_code == 0, tsv.stderr
    lines = tsv.stdout.splitlines()
    assert lines[0] == "layer\tposition\thead\tvalue\tmetric" and len(lines) == 1 + 2 * 6
    one = patch_cli(model, "--target", " mat", "--foil", " rug", "--site", "mlp_out", "--batch-size", "1")
    # The same cells, one patched run per forward: equal to float32 rounding (batch shapes change BLAS blocking).
    assert [line.split("\t")[:3] for line in one.stdout.splitlines()] == [line.split("\t")[:3] for line in lines]
    assert [float(line.split("\t")[3]) for line in one.stdout.splitlines()[1:]] == pytest.approx(
        [float(line.split("\t")[3]) for line in lines[1:]], abs=1e-6)
    table = patch_cli(model, "--target", " mat", "--format", "table", "--init", "random")
    text = " ".join(table.stdout.split())
    assert table.exit_code == 0 and "layer x position" in text and "1 ·cat*" in text and "untrained" in text
    same = patch_cli(model, "--target", " mat", "-f", "json", corrupt=CLEAN)
    data = json.loads(same.stdout)
    assert data["clean_metric"] == data["corrupt_metric"] and {c["value"] for c in data["cells"]} == {None}


@pytest.mark.usefixtures("cached_load")
def test_cli_errors(tiny_model_dir):
    model = tiny_model_dir("gpt2")
    result = patch_cli(model, "--target", " mat", corrupt="The dog sat on a red rug")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.strip() == ("error: CLEAN and CORRUPT must have the same number of tokens: CLEAN is 6 "
                                     "(The ·cat ·sat ·on ·the ·mat), CORRUPT is 7 (The ·dog ·sat ·on ·a ·red ·rug)")
    for args, message in [((), "--target TEXT or --target-id N is required"), (("--target", " mat", "--foil", " mat"), "same token"),
                          (("--target", "mat rug"), "is 2 tokens"), (("--target", " mat", "--site", "nope"), "")]:
        result = patch_cli(model, *args)
        assert result.exit_code == 2 and message in result.stderr, (args, result.stderr)
    assert patch_cli(model, "--target", " mat", clean="").exit_code == 2
    bert = patch_cli(tiny_model_dir("bert"), "--target", "mat", clean="the cat", corrupt="the dog")
    assert bert.exit_code == 2 and "is an encoder" in bert.stderr


# ---------------------------------------------------------------- the real model: causal tracing

EIFFEL = "The Eiffel Tower is in the city of"      # The ·E iffel ·Tower ·is ·in ·the ·city ·of
COLOSSEUM = "The Colosseum is in the city of"      # The ·Col osse um ·is ·in ·the ·city ·of
EARLY, LATE = (0, 1, 2, 3), (26, 27, 28, 29)


def test_smollm2_causal_tracing(smollm2_lm):
    lm = smollm2_lm
    clean, corrupt = ids(lm, EIFFEL), ids(lm, COLOSSEUM)
    assert len(clean) == len(corrupt) == 9 and lm.n_layers == 30
    paris, rome = ids(lm, " Paris")[0], ids(lm, " Rome")[0]
    run = iv.patch_grid(lm, clean, corrupt, "resid_pre", reduce=logit_metric(paris, rome), layers=EARLY + LATE,
                        batch_size=36)
    m_clean, m_corrupt = float(run.clean), float(run.corrupt)
    assert m_clean > 2 and m_corrupt < -5  # Paris for the tower, Rome for the Colosseum
    value = (run.grid - m_corrupt) / (m_clean - m_corrupt)  # [8 layers, 9 positions]
    subject, last = [1, 2, 3], 8
    early, late = value[:4], value[4:]
    # Early layers: the subject's tokens carry the answer; the last token does not yet.
    assert early[:, subject].max(dim=1).values.min() > 0.7
    assert early[:, last].abs().max() < 0.05
    # Late layers: it has moved to the last position; the subject's tokens no longer matter.
    assert late[:, last].min() > 0.6
    assert late[:, subject].abs().max() < 0.1
    # Positions the prompts share (is, in, the, city) matter little anywhere.
    assert value[:, 4:8].abs().max() < 0.25
