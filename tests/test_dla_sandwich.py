"""`dla --by head` on Gemma 2/3 (sandwich norms): each head through the post-attention norm, its scale frozen
at this prompt, and the rows add up to the model's own logit difference (issue 42, item 3)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.models import adapters

runner = CliRunner()
PROMPT = "The capital of Germany is"


@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("arch", ["gemma2", "gemma3"])
def test_heads_sum_to_the_logit_difference_through_the_frozen_norm(arch, tiny_model_dir):
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    path = tiny_model_dir(arch)
    args = ["dla", PROMPT, "--model", str(path), "--device", "cpu", "--target", " Berlin", "--foil", " Paris"]
    result = runner.invoke(app, [*args, "--by", "head", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    # the model's own logit difference, from transformers alone (the last hidden state is after the final
    # norm; the LM head before Gemma 2's soft-capping)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    berlin, paris = tok.encode(" Berlin"), tok.encode(" Paris")
    assert len(berlin) == len(paris) == 1
    ids = torch.tensor([data["token_ids"]])
    with torch.no_grad():
        hidden = model.model(ids).last_hidden_state[0, -1]
        logits = model.lm_head(hidden)
    want = float(logits[berlin[0]] - logits[paris[0]])
    rows = data["rows"]
    heads = [r for r in rows if r["head"] is not None]
    assert len(heads) == model.config.num_hidden_layers * model.config.num_attention_heads
    assert sum(r["contribution"] for r in rows) == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert data["total"] == pytest.approx(want, rel=1e-4, abs=1e-5)
    assert data["head_norm_frozen"] == "post_attention_layernorm"
    # each layer's heads (no projection bias in Gemma) add up to that layer's row of --by layer
    by_layer = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    layer_rows = {r["layer"]: r["contribution"] for r in by_layer["rows"] if r["component"].endswith(".attn")}
    for layer, value in layer_rows.items():
        assert sum(r["contribution"] for r in heads if r["layer"] == layer) == pytest.approx(value, abs=1e-5)
    table = runner.invoke(app, [*args, "--by", "head", "--format", "table"]).stdout
    assert "post_attention_layernorm (the norm after attention), its scale frozen" in " ".join(table.split())


def test_a_family_whose_attention_does_not_split_into_heads_is_named():
    from dataclasses import replace

    assert adapters.heads_split(adapters.GEMMA2) == "norm"
    assert adapters.heads_split(adapters.LLAMA) == adapters.heads_split(adapters.PHI3) == "projection"
    assert all(adapters.heads_split(a) for a in adapters.ADAPTERS if not a.post_ln)
    odd = replace(adapters.LLAMA, attn_out=adapters.Tap("mlp"))
    assert adapters.heads_split(odd) is None


def test_dla_by_head_refuses_such_a_family_before_the_weights_load(tiny_model_dir, monkeypatch):
    from anatomy_cli.engine import loader
    from anatomy_cli.tasks import dla as task

    monkeypatch.setattr(task, "heads_split", lambda adapter: None)
    monkeypatch.setattr(loader.DIRECT, "load_weights", lambda opened: pytest.fail("weights loaded"))
    result = runner.invoke(app, ["dla", PROMPT, "--model", str(tiny_model_dir("llama")), "--target", " Berlin",
                                 "--by", "head"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: ") and result.stderr.rstrip().endswith(
        "attention output does not split into heads: `dla --by head` needs each head's part; use --by layer")
