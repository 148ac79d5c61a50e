"""`diff` on the real SmolLM2-135M-Instruct (Q4_1 GGUF): against its own weights saved by save_pretrained,
against a Q8_0 copy requantized by docs/quantization.md's recipe (gguf's writer and quantizer), against random weights of its shape.

Each real model loads at most once per session (fixtures); the weight figures are checked against numpy
on the raw files, the activation figures against transformers' ``output_hidden_states`` of both models.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from test_requantize import requantize

PROMPT = "The capital of Germany is"


@pytest.fixture(scope="session")
def smollm2_q8(smollm2_gguf, tmp_path_factory) -> Path:
    """SmolLM2 requantized to Q8_0 by docs/quantization.md's recipe (~10 s CPU; built once per machine, keyed by
    the source file's and the recipe's digests), copied into this session's directory under its usual name."""
    import hashlib
    import shutil

    from conftest import cached_file
    from test_requantize import recipe

    from anatomy_cli.models.identity import file_sha256

    key = f"smollm2-q8_0-{file_sha256(smollm2_gguf)[:16]}-{hashlib.sha256(recipe().encode()).hexdigest()[:16]}"
    built = cached_file(key, ".gguf", lambda path: requantize(smollm2_gguf, path))
    out = tmp_path_factory.mktemp("smollm2-q8") / "SmolLM2-135M-Instruct.Q8_0.gguf"
    shutil.copyfile(built, out)
    return out


@pytest.fixture(scope="session")
def smollm2_reader(smollm2_gguf):
    from anatomy_cli.analyses import diff

    return diff.open_weights(str(smollm2_gguf))


def _numpy_rows(path_a: Path, path_b: Path, layers: set) -> dict[tuple[int | None, str], dict[str, float]]:
    """The weight rows of ``layers`` (None: outside the blocks) from the raw GGUF tensors with numpy, grouped by
    llama.cpp's own tensor names.

    llama.cpp permutes Llama's q/k rows; that permutation moves the elements of A and B alike, so the
    norms and dot products here equal those of transformers' layout."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    def group(name: str) -> tuple[int | None, str]:
        m = re.match(r"blk\.(\d+)\.", name)
        layer = int(m.group(1)) if m else None
        if "norm" in name:
            return layer, "norm_other"
        if ".attn_" in name:
            return layer, "attention"
        if ".ffn_" in name:
            return layer, "ffn"
        return layer, {"token_embd.weight": "token_embedding", "output.weight": "lm_head"}[name]

    a, b = GGUFReader(path_a), GGUFReader(path_b)
    tb = {t.name: t for t in b.tensors}
    sums: dict = {}
    for t in a.tensors:
        if group(t.name)[0] not in layers:
            continue
        x = dequantize(t.data, t.tensor_type).astype(np.float64).ravel()
        u = tb[t.name]
        y = dequantize(u.data, u.tensor_type).astype(np.float64).ravel()
        s = sums.setdefault(group(t.name), np.zeros(4))
        s += [x @ x, y @ y, x @ y, (y - x) @ (y - x)]
        s_max = sums.setdefault(group(t.name) + ("max",), np.zeros(1))
        s_max[0] = max(s_max[0], np.abs(y - x).max())
    return {k: {"rel_change": np.sqrt(s[3] / s[0]), "cosine": s[2] / np.sqrt(s[0] * s[1]),
                "max_abs_delta": sums[k + ("max",)][0]} for k, s in sums.items() if len(k) == 2}


def _cached_numpy_rows(path_a: Path, path_b: Path, layers: set) -> dict[tuple[int | None, str], dict[str, float]]:
    """:func:`_numpy_rows`, computed once per machine (gguf's numpy dequantization: ~5-12 CPU s) and read back after:
    keyed by both files' digests, its own source, the gguf and numpy versions and the layers."""
    import hashlib
    import inspect
    from importlib.metadata import version

    from conftest import cached_value

    from anatomy_cli.models.identity import file_sha256

    recipe = hashlib.sha256(inspect.getsource(_numpy_rows).encode()).hexdigest()[:16]
    key = (f"diff-numpy-{file_sha256(path_a)[:16]}-{file_sha256(path_b)[:16]}-{recipe}-gguf{version('gguf')}"
           f"-numpy{np.__version__}-layers{'.'.join(sorted(map(str, layers)))}")
    return cached_value(key, lambda: _numpy_rows(path_a, path_b, layers))


def test_gguf_against_its_weights_saved_by_save_pretrained_is_zero(smollm2_reader, smollm2_dir):
    from anatomy_cli.analyses import diff

    with diff.open_weights(str(smollm2_dir)) as saved:
        result = diff.diff_weights(smollm2_reader, saved)
    assert result.tied_head and len(result.tensors) == 272
    assert result.total.n_params == 134_515_008
    for row in result.rows + (result.total,):
        assert row.rel_change <= 1e-7 and row.cosine == pytest.approx(1.0, abs=1e-7) and row.max_abs_delta <= 1e-6
    assert {t for r in result.rows for t in r.b_types} == {"F32"}


def test_requantized_copy_small_nonzero_and_equal_to_numpy(smollm2_gguf, smollm2_reader, smollm2_q8):
    from anatomy_cli.analyses import diff

    with diff.open_weights(str(smollm2_q8)) as q8:
        result = diff.diff_weights(smollm2_reader, q8)
    layers = {0, 11, 23, 29, None}  # numpy on every tensor would double the test's time; these cover each kind
    reference = _cached_numpy_rows(smollm2_gguf, smollm2_q8, layers)
    assert {(r.layer, r.component) for r in result.rows if r.layer in layers} == set(reference)
    assert len(result.rows) == 30 * 3 + 2
    for row in result.rows:
        ref = reference.get((row.layer, row.component))
        if ref is not None:
            assert row.rel_change == pytest.approx(ref["rel_change"], rel=1e-9, abs=1e-15)
            assert row.cosine == pytest.approx(ref["cosine"], abs=1e-12)
            assert row.max_abs_delta == pytest.approx(ref["max_abs_delta"], rel=1e-6)
        if row.a_types == row.b_types:  # F32 norms copied; the embedding was Q8_0 already: one rounding, no change
            assert (row.rel_change, row.max_abs_delta) == (0.0, 0.0), row
        else:  # Q4_1 values rounded to Q8_0: small, never zero
            assert row.b_types == ("Q8_0",) and row.a_types == ("Q4_1",)
            assert 1e-3 < row.rel_change < 2e-2 and 0.9999 < row.cosine < 1.0 and row.max_abs_delta > 0


def _hf_states(model, ids):
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return [h[0].double() for h in out.hidden_states], torch.log_softmax(out.logits[0, -1].double(), -1)


def _check_against_hf(result, lm_a, lm_b, ids):
    ha, la = _hf_states(lm_a.model, ids)
    hb, lb = _hf_states(lm_b.model, ids)
    cos = torch.nn.functional.cosine_similarity
    for layer in range(len(ha) - 1):  # transformers' last hidden state is after the final norm
        row = result.layers[layer]
        assert row.cos == pytest.approx(float(cos(ha[layer][-1], hb[layer][-1], dim=0)), abs=1e-5)
        assert row.cos_mean == pytest.approx(float(cos(ha[layer], hb[layer], dim=-1).mean()), abs=1e-5)
        rel = float((ha[layer][-1] - hb[layer][-1]).norm() / ha[layer][-1].norm())
        assert row.rel_delta == pytest.approx(rel, rel=1e-3, abs=1e-6)
    assert result.kl_nats == pytest.approx(float((la.exp() * (la - lb)).sum()), rel=1e-3, abs=1e-7)


def test_activations_q4_1_against_q8_0_are_small_and_nonzero(smollm2_lm, smollm2_q8):
    from anatomy_cli import engine
    from anatomy_cli.analyses import diff

    enc = engine.encode(smollm2_lm, [PROMPT])
    kept_a = diff.keep(smollm2_lm, enc)
    lm_b = engine.load(str(smollm2_q8), device="cpu")
    kept_b = diff.keep(lm_b, enc)
    result = diff.compare(kept_a[0], kept_b[0], lambda i: (lm_b.tokenizer.piece(i), None), target_id=None)
    _check_against_hf(result, smollm2_lm, lm_b, enc[0].ids)
    for row in result.layers[1:]:  # layer 0: the embedding, Q8_0 in both and unchanged
        assert 0 < row.rel_delta < 0.2 and row.cos > 0.98 and 0 < row.lens_kl_nats < 0.5
    assert result.layers[0].rel_delta == 0.0 and result.layers[0].lens_kl_nats == 0.0
    assert result.top_a[0].token == result.top_b[0].token == "·Berlin" and result.a_top1_rank_in_b == 1
    assert 0 < result.kl_nats < 0.05


def test_trained_against_random_weights_of_its_shape(smollm2_lm, smollm2_reader, smollm2_dir, tmp_path):
    from anatomy_cli import engine
    from anatomy_cli.analyses import diff

    lm_r = engine.load(str(smollm2_dir), device="cpu", init="random")
    lm_r.model.save_pretrained(tmp_path)
    with diff.open_weights(str(tmp_path)) as random:
        weights = diff.diff_weights(smollm2_reader, random)
    for row in weights.rows:
        if row.component in ("attention", "ffn", "token_embedding"):
            assert 0.7 < row.rel_change < 5 and abs(row.cosine) < 0.05, row
    enc = engine.encode(smollm2_lm, [PROMPT])
    result = diff.compare(diff.keep(smollm2_lm, enc)[0], diff.keep(lm_r, enc)[0],
                          lambda i: (lm_r.tokenizer.piece(i), None))
    _check_against_hf(result, smollm2_lm, lm_r, enc[0].ids)
    for row in result.layers:
        assert row.rel_delta > 0.5 and row.cos < 0.5 and row.lens_kl_nats > 0.1, row
    assert result.a_top1_rank_in_b > 1 and result.kl_nats > 1
