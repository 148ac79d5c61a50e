"""Issue 41 item 9: the corpus lens' chunked fp32 statistics against a float64 reference written here."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from anatomy_cli import engine
from anatomy_cli.corpus.lens_sums import lens_mask
from anatomy_cli.corpus.lens_sums import lens_sums
from anatomy_cli.corpus.lens_sums import sum64


def reference(model, ids: torch.Tensor, every: int, first_window: int) -> dict[str, np.ndarray]:
    """Per metric, float64 [rows, b] sums, from transformers' own forward: float64 log-softmax of each row's logits."""
    b, t = ids.shape
    base = model.transformer
    grabbed = {}
    hook = base.h[-1].register_forward_hook(
        lambda _m, _a, out: grabbed.__setitem__("last", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            out = model(ids, output_hidden_states=True)
            hs = [*out.hidden_states[:-1], grabbed["last"]]                 # raw, before the final norm
            logp = [torch.log_softmax(model.lm_head(base.ln_f(h)).double(), -1) for h in hs]
    finally:
        hook.remove()
    rows = len(logp)
    sums = {m: np.zeros((rows, b)) for m in ("kl_nats", "top1_agree", "ce_bits", "entropy_nats")}
    for w in range(b):
        for p in range(t):
            if (p - (first_window + w)) % every:
                continue
            final = logp[-1][w, p]
            for l in range(rows):
                lp = logp[l][w, p]
                sums["kl_nats"][l, w] += 0.0 if l == rows - 1 else max(0.0, float((final.exp() * (final - lp)).sum()))
                sums["top1_agree"][l, w] += float(lp.argmax() == final.argmax())
                sums["entropy_nats"][l, w] += -float((lp.exp() * lp).sum())
                if p + 1 < t:
                    sums["ce_bits"][l, w] += -float(lp[ids[w, p + 1]]) / math.log(2.0)
    return sums


@pytest.mark.parametrize("every", [1, 3])
def test_chunked_statistics_equal_a_float64_reference(tiny_lm, every):
    lm = tiny_lm("gpt2")
    ids = torch.randint(0, lm.vocab_size, (2, 9), generator=torch.Generator().manual_seed(every))
    names = engine.residual_names(lm)
    with torch.inference_mode(), engine.capture(lm, names) as store:
        engine.forward(lm, ids)
    resid = [store[n] for n in names]
    rows = len(resid)
    n = int(lens_mask(2, 9, 2, every).sum())
    # blocks of 2 positions: block boundaries fall inside windows and between them
    out = lens_sums(lm, resid, ids, 2, every, max_elements=2 * lm.vocab_size * rows)
    ref = reference(lm.model, ids, every, 2)
    assert n > 4
    for metric, (sums, counts) in out.items():
        # fp32 exp and runs of 16 in fp32: lse to ~1e-9 nats, which KL (a difference of two) inherits
        np.testing.assert_allclose(sums, ref[metric], rtol=1e-5 if metric == "kl_nats" else 1e-7, atol=1e-9,
                                   err_msg=metric)
        assert counts.shape == (rows, 2)
    # one block of everything gives the same sums (to float rounding)
    whole = lens_sums(lm, resid, ids, 2, every)
    for metric in out:
        np.testing.assert_allclose(whole[metric][0], out[metric][0], rtol=1e-5 if metric == "kl_nats" else 1e-7,
                                   atol=1e-9)


def test_sum64_accumulates_runs_in_float64():
    # runs of 16 values of 257 sum exactly in fp32; their total (odd, ~2.7e8) needs 29 bits: float64 only
    n = 16 * 2 ** 16 + 5
    x = torch.full((2, n), 257.0, dtype=torch.float32)
    assert sum64(x).tolist() == [257.0 * n] * 2
    assert float(x[0].sum()) != 257.0 * n                                 # what an fp32 sum gives


def test_the_expected_cost_comes_from_the_first_windows_timing():
    from anatomy_cli.corpus.runner import Progress
    from anatomy_cli.tasks._corpus_status import _cost

    first = Progress(tokens=1024, done=1024, budget=20000, elapsed=128.0, seconds={}, shards=0, resumed=0,
                     windows=2, planned=16)
    assert _cost(first, 20000) == ("corpus: expected cost: about 40 min for the 18,976 tokens left "
                                   "(from the first 2 windows' timing: 8.0 tokens/s)")
    assert _cost(first, 1500) is None                                       # 476 tokens left: a minute at most
    assert _cost(first, None).startswith("corpus: expected cost: 2 min per 1,000 tokens (from the first 2 windows'")
    one = dataclasses.replace(first, windows=1)                             # one window: singular, "window's"
    assert _cost(one, 20000) == ("corpus: expected cost: about 40 min for the 18,976 tokens left "
                                 "(from the first window's timing: 8.0 tokens/s)")


def test_status_and_cost_lines_go_to_stderr_and_stdout_stays_json(tiny_model_dir, tmp_path, cached_load, monkeypatch):
    """On a terminal the status line and the expected-cost line are drawn on stderr; stdout is the JSON alone."""
    import json
    from pathlib import Path

    from terminal import on_terminal

    root = Path(__file__).resolve().parents[1]
    src = tmp_path / "c.txt"
    src.write_text((root / "docs" / "article.md").read_text()[:600])
    stdout, drawn = on_terminal(["corpus", str(src), "--model", str(tiny_model_dir("gpt2")), "--ctx", "16", "--no-lens",
                                 "--format", "json"], monkeypatch)
    assert json.loads(stdout)["tokens"] > 16                       # stdout: the JSON and nothing else
    assert "expected cost" not in stdout and "tokens/s" not in stdout
    assert "corpus: expected cost: " in drawn and "per 1,000 tokens" in drawn
    assert "corpus: planning the first shard" in drawn or "windows planned" in drawn


def test_an_interrupted_run_says_what_is_kept_and_how_to_resume(tiny_model_dir, tmp_path, cached_load, monkeypatch):
    """Ctrl-C during `corpus --out DIR`: one line names the finished shards kept and the way on (exit 130)."""
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app
    from anatomy_cli.corpus import runner
    from anatomy_cli.corpus.runner import Progress

    def interrupted(*args, progress, **kwargs):
        progress(Progress(tokens=64, done=64, budget=None, elapsed=1.0, seconds={}, shards=2, resumed=1, windows=4,
                          planned=8))
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run", interrupted)
    src = tmp_path / "c.txt"
    src.write_text("The cat sat on the mat. " * 20, encoding="utf-8")
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["corpus", str(src), "-m", str(tiny_model_dir("gpt2")), "--out", str(out)])
    assert res.exit_code == 130 and res.stdout == ""
    assert f"corpus: interrupted; 3 finished shards kept in {out}: run the same command again to resume" in res.stderr
