"""`anatomy ablate`: every row against an ablation written here with plain forward hooks on the
transformers model, identities, batching and errors."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("cached_load")
PROMPT = "The cat sat on the mat because"      # GPT-2: 7 tokens
TARGET, FOIL = " it", " the"


def ablate(model_dir, *args, prompt=PROMPT):
    result = runner.invoke(app, ["ablate", prompt, "--model", str(model_dir), "--device", "cpu", *args])
    return result


def ablate_json(model_dir, *args, prompt=PROMPT):
    result = ablate(model_dir, "--format", "json", *args, prompt=prompt)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def hand_ablation(model, adapter, ids, layer, component, head, mode, position, d_head):
    """Knock out one component of ``model`` (its own hooks, not the engine's); logits at ``position``."""
    block = model.base_model.get_submodule(adapter.blocks)[layer]

    def knock(t):
        t = t.clone()
        cols = slice(head * d_head, (head + 1) * d_head) if component == "head" else slice(None)
        t[0, :, cols] = 0 if mode == "zero" else t[0, :, cols].mean(dim=0, keepdim=True)
        return t

    if component == "head":
        handle = block.get_submodule(adapter.attn_o).register_forward_pre_hook(lambda m, a: (knock(a[0]), *a[1:]))
    else:
        module = block.get_submodule({"attn": adapter.attn_out, "mlp": adapter.mlp_out}[component].module)
        handle = module.register_forward_hook(
            lambda m, a, o: knock(o) if torch.is_tensor(o) else (knock(o[0]), *o[1:]))
    try:
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, position].double()
    finally:
        handle.remove()


@pytest.mark.parametrize("arch,mode", [("gpt2", "zero"), ("llama", "mean"), ("gpt_neox", "zero")])
def test_rows_equal_hand_written_hooks(tiny_model_dir, arch, mode):
    import models

    from anatomy_cli.models import adapters

    data = ablate_json(tiny_model_dir(arch), "--target", TARGET, "--mode", mode, "--position", "-2")
    model = models.build_model(arch)
    adapter = adapters.for_config(model.config)
    ids, target = data["token_ids"], data["target"]["token_id"]
    assert data["position"] == len(ids) - 2 and data["metric"] == "logprob" and data["mode"] == mode
    with torch.no_grad():
        intact = torch.log_softmax(model(torch.tensor([ids])).logits[0, -2].double(), -1)[target]
    assert data["clean_metric"] == pytest.approx(float(intact), abs=1e-5)
    assert [(r["layer"], r["component"], r["head"]) for r in data["rows"]] == [
        (0, "attn", None), (0, "mlp", None), (1, "attn", None), (1, "mlp", None)]
    for row in data["rows"]:
        logits = hand_ablation(model, adapter, ids, row["layer"], row["component"], None, mode, -2, 8)
        expected = float(torch.log_softmax(logits, -1)[target])
        assert row["metric"] == pytest.approx(expected, abs=1e-5), row
        assert row["effect"] == pytest.approx(expected - float(intact), abs=1e-5)
    assert max(abs(r["effect"]) for r in data["rows"]) > 1e-4  # the ablations do something


@pytest.mark.parametrize("arch", ["gpt2", "qwen2"])
def test_heads_with_a_foil_equal_hand_written_hooks_and_batched_equals_single(tiny_model_dir, arch):
    import models

    from anatomy_cli.models import adapters

    model_dir = tiny_model_dir(arch)
    data = ablate_json(model_dir, "--target", TARGET, "--foil", FOIL, "--heads", "--mode", "mean")
    assert data["metric"] == "logit_diff" and data["foil"]["token"] == "·the"
    assert [(r["layer"], r["component"], r["head"]) for r in data["rows"]] == [
        (layer, "head", h) for layer in range(2) for h in range(4)]
    model = models.build_model(arch)
    adapter = adapters.for_config(model.config)
    t, f = data["target"]["token_id"], data["foil"]["token_id"]
    for row in data["rows"]:
        logits = hand_ablation(model, adapter, data["token_ids"], row["layer"], "head", row["head"], "mean", -1, 8)
        assert row["metric"] == pytest.approx(float(logits[t] - logits[f]), abs=1e-5), row
    single = ablate_json(model_dir, "--target", TARGET, "--foil", FOIL, "--heads", "--mode", "mean",
                         "--batch-size", "1")
    assert [r["metric"] for r in single["rows"]] == pytest.approx([r["metric"] for r in data["rows"]], abs=1e-6)


def test_identities_layer_option_and_stdin(tiny_model_dir):
    model_dir = tiny_model_dir("llama")
    # One token: its mean over the prompt's positions is itself, so mean ablation changes nothing.
    one = ablate_json(model_dir, "--target", TARGET, "--mode", "mean", "--heads", prompt="Hello")
    assert [r["effect"] for r in one["rows"]] == pytest.approx([0.0] * 8, abs=1e-6)
    full = ablate_json(model_dir, "--target", TARGET)
    last = ablate_json(model_dir, "--target", TARGET, "--layer", "-1")
    assert [r["layer"] for r in last["rows"]] == [1, 1]
    assert [r["metric"] for r in last["rows"]] == pytest.approx([r["metric"] for r in full["rows"][2:]], abs=1e-6)
    result = runner.invoke(app, ["ablate", "-", "--model", str(model_dir), "--target", TARGET, "-f", "jsonl"],
                           input=f"{PROMPT}\nHello\n")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["prompt"] for d in lines] == [PROMPT, "Hello"]
    assert [r["metric"] for r in lines[0]["rows"]] == pytest.approx([r["metric"] for r in full["rows"]], abs=1e-6)


def test_tsv_and_table(tiny_model_dir):
    model_dir = tiny_model_dir("gpt2")
    tsv = ablate(model_dir, "--target", TARGET, "--format", "tsv")
    assert tsv.exit_code == 0, tsv.stderr
    lines = tsv.stdout.splitlines()
    assert lines[0] == "layer\tcomponent\thead\tmetric\teffect" and len(lines) == 5
    assert "metric log p(·it); intact run: " in tsv.stderr
    table = ablate(model_dir, "--target", TARGET, "--format", "table", "--init", "random")
    text = " ".join(table.stdout.split())
    assert table.exit_code == 0 and "zero ablation" in text and "untrained" in text and "effect" in text


def test_errors(tiny_model_dir):
    model_dir = tiny_model_dir("gpt2")
    for args, message in [((), "--target TEXT or --target-id N is required"), (("--target", TARGET, "--layer", "2"), "--layer 2 is out"),
                          (("--target", TARGET, "--position", "7"), "--position 7 is out of range"),
                          (("--target", TARGET, "--foil", TARGET), "same token"),
                          (("--target", TARGET, "--mode", "median"), "")]:
        result = ablate(model_dir, *args)
        assert result.exit_code == 2 and result.stdout == "" and message in result.stderr, (args, result.stderr)
    assert ablate(model_dir, "--target", TARGET, prompt="").exit_code == 2
    bert = ablate(tiny_model_dir("bert"), "--target", "it", prompt="the cat")
    assert bert.exit_code == 2 and "is an encoder" in bert.stderr
