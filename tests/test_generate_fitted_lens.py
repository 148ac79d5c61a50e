"""`generate --lens` with a fitted lens (issue 48): each step's lens probabilities equal a hand computation from
transformers' own residual stream (the generated sequence replayed in one forward), through the lens' matrices and
a hand-written RMSNorm + LM head; a bare ``--lens`` keeps meaning the logit lens."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_fitted_lens import LAYERS
from test_fitted_lens import D
from test_fitted_lens import _hidden_states
from test_fitted_lens import _save_jacobian
from test_fitted_lens import _save_tuned
from test_fitted_lens import _unembed
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app

runner = CliRunner()
PROMPT = "Thank you very much for the"
N = 3


def _expected(lm, ids, n_prompt, read):
    """``[steps][blocks]``: the chosen token's probability at block b's output (hidden row b + 1) of the
    position that predicted it, read through ``read(row, h)`` (None: no reading)."""
    hs = _hidden_states(lm, ids)
    grid = []
    for s in range(len(ids) - n_prompt):
        pos, token = n_prompt - 1 + s, ids[n_prompt + s]
        row = []
        for b in range(LAYERS):
            h = read(b + 1, hs[b + 1, pos])
            with torch.no_grad():
                row.append(None if h is None else float(torch.softmax(_unembed(lm, h).double(), -1)[token]))
        grid.append(row)
    return grid


def _check(steps, expected):
    for st, want in zip(steps, expected, strict=True):
        for got, w in zip(st.lens, want, strict=True):
            assert (got is None) == (w is None)
            if w is not None:
                assert got == pytest.approx(w, abs=1e-5)


def test_fitted_lenses_in_generate_read_the_hand_computation(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    g = torch.Generator().manual_seed(5)
    j0 = (torch.eye(D) + 0.3 * torch.randn(D, D, generator=g))
    jac = _save_jacobian(tmp_path / "j.pt", {0: j0}, dtype=torch.float32)
    a = [0.2 * torch.randn(D, D, generator=g) for _ in range(LAYERS)]
    b = [0.1 * torch.randn(D, generator=g) for _ in range(LAYERS)]
    tuned = _save_tuned(tmp_path / "tuned", a, b)

    out = api.generate(lm, PROMPT, max_new_tokens=N, lens=f"jacobian:{jac}")
    ids = out.data["token_ids"] + list(out.result.token_ids)
    n_prompt = len(out.data["token_ids"])
    _check(out.result.steps, _expected(lm, ids, n_prompt,
                                       lambda row, h: h @ j0.T if row == 1 else h if row == LAYERS else None))
    assert out.data["lens"] == f"jacobian:{jac}"
    assert all(st.lens[0] is not None and st.lens[-1] is not None for st in out.result.steps)

    out = api.generate(lm, PROMPT, max_new_tokens=N, lens=f"tuned:{tuned}")
    ids = out.data["token_ids"] + list(out.result.token_ids)
    _check(out.result.steps, _expected(lm, ids, len(out.data["token_ids"]),
                                       lambda row, h: h + h @ a[row].T + b[row] if row < LAYERS else h))

    plain = api.generate(lm, PROMPT, max_new_tokens=N, lens=True)
    ids = plain.data["token_ids"] + list(plain.result.token_ids)
    _check(plain.result.steps, _expected(lm, ids, len(plain.data["token_ids"]), lambda row, h: h))


def test_a_jacobian_lens_leaves_unfitted_blocks_null_in_json(tiny_lm, tiny_model_dir, tmp_path):
    lm = tiny_lm("llama")
    jac = _save_jacobian(tmp_path / "j.pt", {1: torch.eye(D)})  # only the last block: block 0 has no reading
    out = api.generate(lm, PROMPT, max_new_tokens=2, lens=f"jacobian:{jac}")
    assert all(st.lens[0] is None and st.lens[1] is not None for st in out.result.steps)
    model = str(tiny_model_dir("llama"))
    res = runner.invoke(app, ["generate", PROMPT, "--model", model, "--max-new-tokens", "2",
                              "--lens", f"jacobian:{jac}", "--format", "json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["lens"] == f"jacobian:{jac}"
    assert [s["lens"][0] for s in data["steps"]] == [None, None]
    assert all(not math.isnan(s["lens"][1]) for s in data["steps"])


def test_a_bare_lens_flag_keeps_meaning_the_logit_lens(tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("llama"))
    bare = runner.invoke(app, ["generate", PROMPT, "--model", model, "--max-new-tokens", "2", "--lens",
                               "--format", "json"])
    named = runner.invoke(app, ["generate", PROMPT, "--model", model, "--max-new-tokens", "2", "--lens", "logit",
                                "--format", "json"])
    none = runner.invoke(app, ["generate", PROMPT, "--model", model, "--max-new-tokens", "2", "--format", "json"])
    assert bare.exit_code == named.exit_code == none.exit_code == 0, bare.output
    b, n = json.loads(bare.stdout), json.loads(named.stdout)
    assert b["lens"] == n["lens"] == "logit" and b["steps"] == n["steps"]
    assert all(len(s["lens"]) == LAYERS for s in b["steps"])
    assert json.loads(none.stdout)["lens"] is None and "lens" not in json.loads(none.stdout)["steps"][0]
    # a lens of another width is refused before the weights load; a bad value is a usage error
    wide = tmp_path / "wide.pt"
    torch.save({"J": {0: torch.eye(D + 1)}, "n_prompts": 1, "source_layers": [0], "d_model": D + 1}, wide)
    res = runner.invoke(app, ["generate", PROMPT, "--model", model, "--lens", f"jacobian:{wide}"])
    assert res.exit_code == 2 and f"fitted for d_model {D + 1}" in res.output, res.output
    res = runner.invoke(app, ["generate", PROMPT, "--model", model, "--lens", "kaleidoscope"])
    assert res.exit_code == 2 and "use logit, tuned:DIR" in res.output, res.output
