"""docs/examples/anatomy_tour.py (the article's steps from Python) runs on the real SmolLM2 file, and what it
prints agrees with the model: " much" is SmolLM2's top next token after "Thank you very", as transformers'
own forward says."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

TOUR = Path(__file__).resolve().parents[1] / "docs" / "examples" / "anatomy_tour.py"


def test_the_tour_runs_on_smollm2(smollm2_lm, smollm2_hf, capsys):
    import torch

    before = sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in smollm2_lm.model.modules())
    seen = runpy.run_path(str(TOUR), init_globals={"lm": smollm2_lm})
    out = capsys.readouterr().out
    assert "p(much):" in out
    model, tok = smollm2_hf
    ids = tok("Thank you very", return_tensors="pt").input_ids
    with torch.no_grad():
        probs = torch.softmax(model(ids).logits[0, -1].double(), -1)
    top = seen["nx"].to_dict()["top"][0]
    assert top["token_id"] == int(probs.argmax()) == tok.encode(" much")[0]
    assert top["probability"] == pytest.approx(float(probs.max()), abs=1e-4)
    assert sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in smollm2_lm.model.modules()) == before
