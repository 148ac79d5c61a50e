"""`anatomy fit-sae --transcoder --layer all --clt`: a cross-layer transcoder fitted on a tiny random llama's
activations (issue 62 item 1): its loss and one Adam step against plain torch written here, a resumed fit against an
uninterrupted one, the written folder read by circuit-tracer 0.5.0 (its own venv, tests/test_circuit_reference.py's
machinery) to the graph ``anatomy circuit`` makes of it, and the refusals before the weights load."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import random_clt
from safetensors.torch import load_file
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app
from anatomy_cli.engine import clt_fit
from anatomy_cli.errors import UsageError

runner = CliRunner()
WORDS = ("cat", "dog", "bird", "fox", "owl", "cow", "hen", "elk")
PLACES = ("door", "sky", "tree", "moon", "sea", "hill", "road", "barn")


@pytest.fixture
def corpus(tmp_path):
    text = " ".join(f"The {w} sat by the {v} and the {u} saw it." for w in WORDS for v in PLACES for u in WORDS[:3])
    path = tmp_path / "corpus.txt"
    path.write_text(text + "\n")
    return path


def fit(model_dir, corpus, out, *more, lr: str | None = "0.003"):
    rate = ["--lr", lr] if lr else []
    return runner.invoke(app, ["fit-sae", str(corpus), "--model", str(model_dir), "--layer", "all", "--transcoder",
                               "--clt", "--out", str(out), "--ctx", "32", "--max-tokens", "384", "--d-sae", "32",
                               "--k", "4", "--epochs", "2", "--batch-size", "64", *rate, "--format", "json", *more])


# ---- the loss and one step against plain torch ----

def reference_loss(p: dict, xs: torch.Tensor, targets: torch.Tensor, k: int) -> torch.Tensor:
    """The CLT's loss written out: per block TopK of relu(x W_encᵀ + b_enc) as a dense vector; block m's
    reconstruction sums a_l W_dec_l[:, m - l] over l ≤ m plus b_dec_m; the loss sums each block's FVU."""
    n = len(p["W_enc"])
    ys = [p["b_dec"][m].expand_as(targets[m]) for m in range(n)]
    for layer in range(n):
        pre = torch.relu(xs[layer] @ p["W_enc"][layer].T + p["b_enc"][layer])
        top = pre.topk(k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
        for j in range(n - layer):
            ys[layer + j] = ys[layer + j] + acts @ p["W_dec"][layer][:, j]
    return sum(((ys[m] - targets[m]) ** 2).sum() / ((targets[m] - targets[m].mean(0)) ** 2).sum() for m in range(n))


def test_loss_and_one_adam_step_equal_a_hand_written_reference():
    gen = torch.Generator().manual_seed(1)
    n, d, f, k, rows, lr = 3, 8, 16, 3, 24, 1e-2
    coder = clt_fit.CrossLayerCoder(n, d, f, k)
    with torch.no_grad():  # every parameter random (the fit's decoders start at zero: no encoder gradient then)
        for param in coder.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    xs, targets = torch.randn(n, rows, d, generator=gen), torch.randn(n, rows, d, generator=gen)
    p = {"W_enc": [w.detach().clone().requires_grad_() for w in coder.W_enc], "b_enc": coder.b_enc.detach().clone(),
         "W_dec": [w.detach().clone().requires_grad_() for w in coder.W_dec], "b_dec": coder.b_dec.detach().clone()}
    p["b_enc"].requires_grad_()
    p["b_dec"].requires_grad_()
    ref = reference_loss(p, xs, targets, k)
    torch.testing.assert_close(clt_fit.loss(coder, xs, targets), ref, rtol=1e-5, atol=1e-6)
    ref.backward()
    got = clt_fit.step(coder, torch.optim.Adam(coder.parameters(), lr=lr), xs, targets)
    assert got == pytest.approx(float(ref.detach()), rel=1e-5)
    eps = 1e-8  # Adam's first step: m̂ = g, v̂ = g², so p -= lr g / (|g| + eps)
    flat = [*p["W_enc"], p["b_enc"], *p["W_dec"], p["b_dec"]]
    mine = [*coder.W_enc, coder.b_enc, *coder.W_dec, coder.b_dec]
    for theirs, ours in zip(flat, mine):
        want = theirs.detach() - lr * theirs.grad / (theirs.grad.abs() + eps)
        torch.testing.assert_close(ours.detach(), want, rtol=1e-5, atol=1e-6)


def test_the_folded_clt_equals_the_one_trained_at_unit_scale_by_hand():
    gen = torch.Generator().manual_seed(2)
    n, d, f, k = 3, 8, 16, 3
    xs = 0.1 * torch.randn(n, 40, d, generator=gen) * torch.tensor([1.0, 2.0, 3.0])[:, None, None]
    targets = 3 * torch.randn(n, 40, d, generator=gen) + 1
    coder = clt_fit.CrossLayerCoder(n, d, f, k)
    with torch.no_grad():  # a trained coder (its decoders start at zero)
        for param in coder.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.3)
    sx, sy = clt_fit.unit_scales(coder, xs, targets)
    def typical(t):  # per block: the lower median over the rows of each row's RMS
        per_row = (t ** 2).mean(2).sqrt().sort(dim=1).values
        return per_row[:, (t.shape[1] - 1) // 2]
    torch.testing.assert_close(sx, typical(xs))
    torch.testing.assert_close(sy, typical(targets))
    p = {"W_enc": [w.detach().clone() for w in coder.W_enc], "b_enc": coder.b_enc.detach().clone(),
         "W_dec": [w.detach().clone() for w in coder.W_dec], "b_dec": coder.b_dec.detach().clone()}
    pres, ys = [], [p["b_dec"][m].expand(40, d) for m in range(n)]  # the trained coder on x / s_x, by hand
    for layer in range(n):
        pre = torch.relu(xs[layer] / sx[layer] @ p["W_enc"][layer].T + p["b_enc"][layer])
        top = pre.topk(k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
        pres.append(pre)
        for j in range(n - layer):
            ys[layer + j] = ys[layer + j] + acts @ p["W_dec"][layer][:, j]
    clt_fit.fold_scales(coder, sx, sy)
    with torch.no_grad():
        torch.testing.assert_close(coder(xs), torch.stack([ys[m] * sy[m] for m in range(n)]), rtol=1e-5, atol=1e-5)
        for layer in range(n):  # the same pre-activations: the thresholds chosen after the fold are the trained TopK's
            torch.testing.assert_close(coder.pre(layer, xs[layer]), pres[layer], rtol=1e-5, atol=1e-6)
    assert torch.equal(coder.b_enc, p["b_enc"])


def test_thresholds_keep_each_features_topk_firing_count():
    """The JumpReLU fires as often as the TopK did, and each threshold is, bit for bit, the rule's value from each
    feature's pre-activations sorted by hand (halfway between its n-th and (n+1)-th largest; n = every row: its
    smallest; n = 0: its largest), in chunks of rows or not (thresholds orders only the largest n + 1)."""
    torch.manual_seed(0)
    coder = clt_fit.CrossLayerCoder(2, 8, 16, 3)
    with torch.no_grad():
        coder.b_enc[1, 0] = 100.0  # fires on every row
    xs = torch.randn(2, 200, 8)
    theta = clt_fit.thresholds(coder, xs)
    assert torch.equal(clt_fit.thresholds(coder, xs, chunk=64), theta)
    for layer in range(2):
        pre = coder.pre(layer, xs[layer])
        acts, idx = pre.topk(3, dim=-1)
        topk = torch.bincount(idx[acts > 0], minlength=16)
        jump = ((pre > theta[layer]) & (pre > 0)).sum(0)
        every = topk == 200  # θ its smallest pre-activation: `pre > θ` leaves that one row out
        assert torch.equal(jump[~every], topk[~every])  # continuous pre-activations: no ties
        assert torch.equal(jump[every], topk[every] - 1)
        for f in range(16):
            col, n = sorted(pre[:, f].tolist(), reverse=True), int(topk[f])
            want = col[0] if n == 0 else (col[n - 1] + col[min(n, 199)]) / 2
            assert float(theta[layer, f]) == float(torch.tensor(max(want, 0.0)))
    assert int(torch.bincount(coder.pre(1, xs[1]).topk(3, dim=-1).indices[:, 0], minlength=16)[0]) == 200


# ---- the fit end to end: resume, circuit-tracer ----

def test_resumed_fit_equals_an_uninterrupted_one(tiny_model_dir, corpus, tmp_path, monkeypatch):
    model = tiny_model_dir("llama")
    whole = fit(model, corpus, tmp_path / "whole")
    assert whole.exit_code == 0, whole.output
    assert "fit-sae: a TopK cross-layer transcoder at blocks 0-1 (2 blocks)" in whole.stderr  # the cost first
    # the model as the per-block fits name it (resolve.recorded), read back as features reads a block of it
    from anatomy_cli.models.ct_block import read_dictionary

    block = read_dictionary(tmp_path / "whole", hook="1", values=False)
    assert block.model_name == str(model.resolve())
    assert block.context_size == 32  # the fit's --ctx, in config.yaml as the per-block configs record it
    assert block.skipped_positions == 1  # each window's first position, left out of the rows (issue 68)
    real_step, calls = clt_fit.step, []

    def interrupted(*args):
        calls.append(1)
        if len(calls) == 5:
            raise KeyboardInterrupt
        return real_step(*args)

    checkpoint = tmp_path / "clt.ckpt"
    monkeypatch.setattr(clt_fit, "probe_step_seconds", lambda *a, **kw: 0.01)  # the estimate's steps are not counted
    monkeypatch.setattr(clt_fit, "step", interrupted)
    stopped = fit(model, corpus, tmp_path / "resumed", "--checkpoint", str(checkpoint), "--checkpoint-every", "2")
    assert stopped.exit_code != 0 and checkpoint.is_file()
    monkeypatch.setattr(clt_fit, "step", real_step)
    resumed = fit(model, corpus, tmp_path / "resumed", "--checkpoint", str(checkpoint), "--checkpoint-every", "2")
    assert resumed.exit_code == 0, resumed.output
    assert "resuming from" in resumed.stderr and json.loads(resumed.stdout)["clt"]["resumed_at_step"] == 4
    for name in ("W_enc_0", "W_enc_1", "W_dec_0", "W_dec_1"):
        a, b = load_file(tmp_path / "whole" / f"{name}.safetensors"), load_file(tmp_path / "resumed" / f"{name}.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[t], b[t]) for t in a), name
    other = fit(model, corpus, tmp_path / "other", "--checkpoint", str(checkpoint), "--k", "5")
    assert other.exit_code == 2 and "other settings (k)" in other.output


def test_circuit_tracer_reads_the_fitted_clt_to_anatomys_graph(tiny_model_dir, tiny_lm, corpus, tmp_path):
    """circuit-tracer 0.5.0's ``load_clt`` + ``attribute`` on the folder fit-sae wrote equals ``anatomy circuit``'s
    graph of it, as circuit-tracer reads that graph back (active and selected features, adjacency to 1e-4)."""
    from test_circuit_reference import BATCH
    from test_circuit_reference import MAX_FEATURE_NODES
    from test_circuit_reference import PROMPT
    from test_circuit_reference import anatomy_circuit
    from test_circuit_reference import assert_same_graph
    from test_circuit_reference import ct_python
    from test_circuit_reference import run_ct

    python = ct_python()
    if python is None:
        pytest.skip("circuit-tracer is not installed: .ci/run builds .venv-ct (or set ANATOMY_CT_PYTHON)")
    model = tiny_model_dir("llama")
    out = tmp_path / "ct"
    out.mkdir()
    done = fit(model, corpus, out / "transcoders", "--epochs", "2")
    assert done.exit_code == 0, done.output
    mine = tmp_path / "anatomy"
    mine.mkdir()
    anatomy_circuit(tiny_lm("llama"), model, out / "transcoders", mine, graph_json=False)
    run_ct(python, "attribute", "--model", model, "--out", out, "--prompt", PROMPT, "--max-feature-nodes",
           MAX_FEATURE_NODES, "--batch-size", BATCH, "--check", mine / "graph.pt")
    ref = torch.load(out / "reference.pt", weights_only=False)
    got = torch.load(out / "check.pt", weights_only=False)
    assert len(ref["active_features"]) > 0 and ref["scan"] == "anatomy-clt-transcoders"
    assert_same_graph(got, ref)


# ---- refusals before the weights load ----

@pytest.fixture
def no_weights(monkeypatch):
    from anatomy_cli.engine import loader

    monkeypatch.setattr(loader.DIRECT, "load_weights", lambda opened: pytest.fail("the weights were loaded"))


@pytest.mark.parametrize("args, message", [
    (["--layer", "all"], "--clt fits a cross-layer transcoder: give --transcoder too"),
    (["--layer", "1", "--transcoder"], "--clt reads every block and writes to every later one: give --layer all, "
     "not --layer 1"),
])
def test_clt_refusals_come_before_the_weights_load(tiny_model_dir, corpus, tmp_path, no_weights, args, message):
    res = runner.invoke(app, ["fit-sae", str(corpus), "--model", str(tiny_model_dir("llama")), "--clt", "--out",
                              str(tmp_path / "o"), *args])
    assert res.exit_code == 2 and message in res.output, res.output
    with pytest.raises(UsageError, match="reads every block and writes to every later one"):
        api.fit_sae(str(tiny_model_dir("llama")), str(corpus), layer="0-1", transcoder=True, clt=True,
                    out=tmp_path / "o")


# ---- the spliced CE/KL (every block's MLP output replaced by the CLT's reconstruction) ----

def test_spliced_logits_equal_a_forward_with_plain_hooks_on_transformers_mlps(tiny_lm):
    """The CLT spliced into every block, closed loop: a PyTorch pre-hook on each of transformers' own MLPs reads
    its input, encodes it with the block's JumpReLU, and a forward hook replaces the MLP's output with the sum of
    the decoders of this and every earlier block; the CE and KL by hand from those logits."""
    from anatomy_cli.analyses.sae import next_token_ce
    from anatomy_cli.analyses.sae import next_token_kl

    lm = tiny_lm("llama")
    n = lm.n_layers
    coder, theta, points = random_clt(lm, 16, 4, seed=2)
    ids = [1, 5, 9, 22, 7, 3, 14, 30]
    clean, spliced = clt_fit.spliced_logits(lm, ids, coder, theta, points)
    acts = {}

    def pre_hook(i):
        def fn(module, args):
            z = args[0][0] @ coder.W_enc[i].T + coder.b_enc[i]
            acts[i] = z * (z > theta[i])
        return fn

    def out_hook(m, skip):
        def fn(module, args, out):
            y = coder.b_dec[m].clone()
            for layer in range(m + 1):
                y = y + acts[layer] @ coder.W_dec[layer][:, m - layer]
            return torch.cat([out[:, :skip], y[None][:, skip:]], 1)  # the first ``skip`` positions as they were
        return fn

    layers = lm.model.model.layers
    x = torch.tensor([ids])

    def hooked(skip):
        handles = [h for i in range(n) for h in (layers[i].mlp.register_forward_pre_hook(pre_hook(i)),
                                                  layers[i].mlp.register_forward_hook(out_hook(i, skip)))]
        try:
            with torch.no_grad():
                return lm.model(x).logits[0]
        finally:
            for h in handles:
                h.remove()

    want = hooked(0)
    # fit-sae's held-out check: position 0 keeps the model's MLP outputs and is left out (sae_fit.SKIPPED)
    skipped = clt_fit.spliced_logits(lm, ids, coder, theta, points, skip=1)
    torch.testing.assert_close(skipped[1], hooked(1)[1:], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        want_clean = lm.model(x).logits[0]
    torch.testing.assert_close(clean, want_clean, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(skipped[0], want_clean[1:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(spliced, want, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(spliced, clean, atol=1e-2)  # the splice changed something
    logp, logq = want_clean.double().log_softmax(-1), want.double().log_softmax(-1)
    ce = -sum(float(logq[i, ids[i + 1]]) for i in range(len(ids) - 1)) / (len(ids) - 1)
    assert next_token_ce(spliced, ids) == pytest.approx(ce, rel=1e-4)
    kl = float((logp.exp() * (logp - logq)).sum(-1).mean())
    assert next_token_kl(clean, spliced) == pytest.approx(kl, rel=1e-4)


def test_the_clt_fit_reports_the_spliced_ce_and_kl(tiny_model_dir, corpus, tmp_path, monkeypatch):
    rates = []
    real_train = clt_fit.train
    monkeypatch.setattr(clt_fit, "train", lambda *a, lr, **kw: rates.append(lr) or real_train(*a, lr=lr, **kw))
    result = fit(tiny_model_dir("llama"), corpus, tmp_path / "clt", lr=None)
    assert result.exit_code == 0, result.output
    # without --lr a CLT trains at sparsify's rate for its 32 features, not the per-layer transcoders' four times
    # it (at 4x a 30-block SmolLM2 CLT diverged over 492 steps: docs/commands/sae.md)
    assert rates == [pytest.approx(2e-4 / (32 / 2**14) ** 0.5)] == [json.loads(result.stdout)["lr"]]
    rows = json.loads(result.stdout)["blocks"]
    figures = {(r["health"]["ce_clean_nats"], r["health"]["ce_spliced_nats"], r["health"]["kl_spliced_nats"])
               for r in rows}
    assert len(figures) == 1  # every block spliced at once: one set of figures
    clean, spliced, kl = figures.pop()
    assert clean > 0 and spliced > 0 and kl >= 0


def _by_hand(fve: float, dead: float, what: str) -> list[str]:
    """fit-sae's warning rule for a block's held-out FVE (over 31 positions here, at least 8: judged) and dead
    fraction, written out: under 0.5 (under 0: worse than the mean), over half dead."""
    out = []
    if fve < 0:
        out.append(f"FVE {fve:.3f} < 0: the reconstruction is worse than the held-out window's mean activation; the "
                   "SAE does not fit this model or site")
    elif fve < 0.5:
        out.append(f"FVE {fve:.3f} < 0.5: the reconstruction explains less than half of the activation's variance on "
                   "this held-out window; the SAE fits this model or site poorly")
    if dead > 0.5:
        out.append(f"{dead:.0%} of the {what} never fired in the last epoch (over 50%): train on more tokens, or give "
                   "a smaller --d-sae")
    return out


def test_a_clt_blocks_warnings_follow_the_per_layer_fits_rule(tiny_model_dir, corpus, tmp_path):
    """A short CLT fit (2 epochs at 0.003) leaves both blocks weak: each row warns of its held-out FVE under 0.5 as
    a per-layer fit's row does (before, a CLT's rows warned of dead features only), its text the per-layer fit's
    for the same figure, and the summary says what the rows warn of. The per-layer transcoders of the same corpus:
    the same rule on their FVEs (their rows also carry their own splice's scale and KL warnings)."""
    result = fit(tiny_model_dir("llama"), corpus, tmp_path / "clt")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["blocks"]
    weak = [r["layer"] for r in rows if r["health"]["fve"] < 0.5]
    assert weak == [0, 1], [r["health"]["fve"] for r in rows]  # the case the trial met: every block weak
    for r in rows:
        assert r["warnings"] == _by_hand(r["health"]["fve"], r["dead_fraction"], "features"), r
    assert "2 warnings on blocks 0-1 (the held-out window's health)" in result.stderr, result.stderr
    per_layer = runner.invoke(app, ["fit-sae", str(corpus), "--model", str(tiny_model_dir("llama")), "--layer", "all",
                                    "--transcoder", "--out", str(tmp_path / "pl"), "--ctx", "32", "--max-tokens",
                                    "384", "--d-sae", "32", "--k", "4", "--epochs", "2", "--batch-size", "64", "--lr",
                                    "0.003", "--format", "json"])
    assert per_layer.exit_code == 0, per_layer.output
    for r in json.loads(per_layer.stdout)["blocks"]:
        fve_and_dead = [w for w in r["warnings"] if w.startswith("FVE ") or "never fired" in w]
        assert fve_and_dead == _by_hand(r["health"]["fve"], r["dead_fraction"], "latents"), r
