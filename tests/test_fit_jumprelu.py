"""`anatomy fit-sae --activation jumprelu` (issue 62 item 1): the JumpReLU's loss and one Adam step, per block and
cross-layer, against a reference written here with plain autograd (the straight-through estimator as a surrogate
whose derivative is the paper's pseudo-derivative); the written files read back by `sae`'s and `circuit`'s readers
encode as the trained coder does; the fits end to end on a tiny model."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.engine import clt_fit
from anatomy_cli.engine import jumprelu as ste
from anatomy_cli.engine import sae_fit

runner = CliRunner()
EPS, LR = 1e-8, 1e-2  # Adam's eps; Adam's first step is p -= lr g / (|g| + eps)


def ref_jumprelu(z: torch.Tensor, log_theta: torch.Tensor, width: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(z·H(z − θ), the row-mean L0) whose autograd gradients are Rajamanoharan et al.'s: z gets H(z − θ) through
    the activation and nothing through the L0; θ gets −(θ/ε)K and −(1/ε)K, K the rectangle kernel."""
    theta = log_theta.exp()
    on = (z > theta).float().detach()
    kernel = ((z - theta).abs() < width / 2).float().detach()
    act_sur = -(theta.detach() / width) * kernel * theta  # d/dθ: −(θ/ε) K
    step_sur = -(1.0 / width) * kernel * theta  # d/dθ: −(1/ε) K
    act = z * on + act_sur - act_sur.detach()
    step = on + step_sur - step_sur.detach()
    return act, step.sum(-1).mean()


def ref_fvu(y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return ((y - t) ** 2).sum() / ((t - t.mean(0)) ** 2).sum()


def randomise(module: torch.nn.Module, gen: torch.Generator, *, theta: float) -> None:
    """Every parameter random; the thresholds near ``theta`` (so that some pre-activations sit in the kernel)."""
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "log_threshold" in name:
                param.copy_(torch.log(theta + 0.05 * torch.rand(param.shape, generator=gen)))
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.5)


def check_adam_step(refs: list[torch.Tensor], mine: list[torch.Tensor]) -> None:
    for theirs, ours in zip(refs, mine, strict=True):
        want = theirs.detach() - LR * theirs.grad / (theirs.grad.abs() + EPS)
        torch.testing.assert_close(ours.detach(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transcode", [False, True])
def test_per_layer_loss_and_one_adam_step_equal_a_hand_written_reference(transcode):
    gen = torch.Generator().manual_seed(3)
    d, f, rows, width, coeff = 6, 12, 40, 0.2, 0.05
    coder = sae_fit.JumpReLUCoder(d, f, transcode=transcode, bandwidth=width, l0_coeff=coeff, target_l0=3)
    randomise(coder, gen, theta=0.3)
    x, t = torch.randn(rows, d, generator=gen), torch.randn(rows, d, generator=gen)
    W, b = coder.encoder.weight.detach().clone(), coder.encoder.bias.detach().clone()
    Wd, bd, lt = coder.W_dec.detach().clone(), coder.b_dec.detach().clone(), coder.log_threshold.detach().clone()
    refs = [W, b, Wd, bd, lt]
    for r in refs:
        r.requires_grad_()
    z = (x if transcode else x - bd) @ W.T + b
    act, l0 = ref_jumprelu(z, lt, width)
    fit = ref_fvu(act @ Wd + bd, t)
    ref = fit + coeff * (l0 / 3 - 1) ** 2  # the sparsity term: the mean L0 against the target, 3
    loss, part = sae_fit.objective(coder, x, t)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(part, fit, rtol=1e-5, atol=1e-6)
    ref.backward()
    assert float(lt.grad.abs().sum()) > 0  # some pre-activations in the kernel: the thresholds learn
    loss.backward()
    torch.optim.Adam(coder.parameters(), lr=LR).step()
    check_adam_step(refs, [coder.encoder.weight, coder.encoder.bias, coder.W_dec, coder.b_dec, coder.log_threshold])


def test_clt_loss_and_one_adam_step_equal_a_hand_written_reference():
    gen = torch.Generator().manual_seed(4)
    n, d, f, rows, width, coeff = 3, 6, 10, 30, 0.2, 0.05
    coder = clt_fit.CrossLayerCoder(n, d, f, 2, jumprelu={"bandwidth": width, "l0_coeff": coeff})
    randomise(coder, gen, theta=0.3)
    xs, targets = torch.randn(n, rows, d, generator=gen), torch.randn(n, rows, d, generator=gen)
    p = {name: prm.detach().clone().requires_grad_() for name, prm in coder.named_parameters()}
    ys = [p["b_dec"][m].expand(rows, d) for m in range(n)]
    penalty = torch.zeros(())
    for layer in range(n):
        z = xs[layer] @ p[f"W_enc.{layer}"].T + p["b_enc"][layer]
        act, l0 = ref_jumprelu(z, p["log_threshold"][layer], width)
        penalty = penalty + (l0 / 2 - 1) ** 2  # each block's mean L0 against k, 2
        for j in range(n - layer):
            ys[layer + j] = ys[layer + j] + act @ p[f"W_dec.{layer}"][:, j]
    fit = sum(ref_fvu(ys[m], targets[m]) for m in range(n))
    ref = fit + coeff * penalty
    torch.testing.assert_close(clt_fit.loss(coder, xs, targets), ref, rtol=1e-5, atol=1e-6)
    ref.backward()
    assert float(p["log_threshold"].grad.abs().sum()) > 0
    got = clt_fit.step(coder, torch.optim.Adam(coder.parameters(), lr=LR), xs, targets)
    assert got == pytest.approx(float(fit.detach()), rel=1e-5)  # the step reports the FVU part
    check_adam_step([p[name] for name, _ in coder.named_parameters()], [q for _, q in coder.named_parameters()])


def test_the_thresholds_start_where_each_feature_fires_on_k_of_d_sae_of_the_first_rows():
    gen = torch.Generator().manual_seed(3)
    z = torch.randn(1000, 50, generator=gen) + torch.arange(50) / 10  # each feature its own scale of values
    theta = ste.initial_log_threshold(z, 5).exp()  # 5 of 50 features: each fires on a tenth of the rows
    want = z.sort(dim=0).values[899].clamp_min(ste.INIT_THRESHOLD)  # 100 values lie above the 900th smallest
    torch.testing.assert_close(theta, want, rtol=1e-6, atol=0)  # (exp of its log: the last digit may differ)
    assert all(100 <= int((z[:, f] > theta[f]).sum()) <= 101 for f in range(50))
    assert torch.equal(ste.initial_log_threshold(-z.abs(), 5), torch.full((50,), math.log(ste.INIT_THRESHOLD)))


def dense_transcoder_rows(rows: int = 4096, d: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed transcoder problem whose inputs are dense and off-centre (as an MLP's input is): on it Adam moves
    the pre-activations far faster than a threshold learning at the encoder's rate."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=gen) @ (torch.randn(d, d, generator=gen) / d ** 0.5) + 0.5
    return x, torch.tanh(x @ torch.randn(d, d, generator=gen) / d ** 0.5)


def held_out_l0s(x: torch.Tensor, y: torch.Tensor, k: int) -> list[float]:
    """The mean L0 on the last 512 rows after every step of a 56-step fit on the others (d_sae 256; while it
    trains the coder reads its input at unit scale: the held-out rows over the training rows' RMS)."""
    torch.manual_seed(0)
    coder = sae_fit.make_coder(x.shape[1], 256, k, transcode=True, jumprelu={"bandwidth": 0.05, "l0_coeff": 1.0})
    held, l0s = x[-512:] / rms(x[:-512]), []

    def l0_now(i: int, n: int) -> None:
        with torch.no_grad():
            l0s.append(float((coder.features(held) != 0).sum(-1).float().mean()))
    sae_fit.train(x[:-512], y[:-512], coder, epochs=4, batch=256, lr=sae_fit.default_lr(256), progress=l0_now)
    return l0s


def test_the_l0_stays_near_the_target_k(monkeypatch):
    """Issue 62: the thresholds start at a mean L0 of k; the sparsity term (L0/k − 1)² and log θ's own pace hold it
    there (within 1.5× from the 15th step on). At the encoder's learning rate (no pace) the same fit ends over
    3× k: the drift measured on SmolLM2 (k 32 → 563)."""
    x, y = dense_transcoder_rows()
    k = 8
    l0s = held_out_l0s(x, y, k)
    assert 0.5 * k < l0s[0] < 1.5 * k
    assert all(k / 1.5 < v < 1.5 * k for v in l0s[14:]), l0s
    monkeypatch.setattr(ste, "pace", lambda opt, x_in, log_theta, bandwidth: 1.0)
    assert held_out_l0s(x, y, k)[-1] > 3 * k


def test_a_jumprelu_clt_holds_each_blocks_l0_near_k():
    """The cross-layer fit's sparsity term is per block and its pace one for all blocks: two blocks of different
    scales both end near k (8); at the encoder's rate one ended at 27, the other at 3."""
    x, y = dense_transcoder_rows()
    xs, ys = torch.stack([x, 2 * x + 0.1]), torch.stack([y, 0.5 * y])
    torch.manual_seed(0)
    coder = clt_fit.CrossLayerCoder(2, 32, 256, 8, jumprelu={"bandwidth": 0.05, "l0_coeff": 1.0})
    clt_fit.train(xs[:, :-512], ys[:, :-512], coder, epochs=4, batch=256, lr=sae_fit.default_lr(256))
    theta = coder.log_threshold.detach().exp()
    with torch.no_grad():
        l0s = [float((coder.thresholded(m, xs[m, -512:], theta[m]) != 0).sum(-1).float().mean()) for m in range(2)]
    assert all(8 / 1.5 < v < 8 * 1.5 for v in l0s), l0s


def test_the_pace_and_the_kernel_width_follow_the_placed_thresholds():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(100, 6, generator=gen)
    log_theta = torch.log(torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0]))
    opt = sae_fit.adam([{"params": [torch.nn.Parameter(torch.zeros(3))]}, {"params": [torch.nn.Parameter(log_theta)]}],
                       0.01)
    rate = ste.pace(opt, x, log_theta, 0.5)
    assert rate == pytest.approx(float(x.abs().sum(1).mean()) / 2.0, rel=1e-6)  # mean ‖x‖₁ / median θ
    assert opt.param_groups[1]["lr"] == pytest.approx(0.01 * rate) and opt.param_groups[0]["lr"] == 0.01
    assert ste.kernel_width(0.05, log_theta) == pytest.approx(0.1, rel=1e-6)
    # tiny thresholds: capped where log θ's rate is the bandwidth, a step of one kernel width at the median θ
    assert ste.pace(opt, x, log_theta - 10, 0.05) == pytest.approx(0.05 / 0.01)
    assert opt.param_groups[1]["lr"] == pytest.approx(0.05)


def test_no_step_moves_a_threshold_past_its_kernels_width():
    """Issue 62: the estimator's gradient for θ comes from the rows inside its window only; a step of several
    widths carried thresholds past every row that gave it (the pace's old cap, 0.25: five widths), and their
    features died. Every Adam step of a real fit moves each θ by at most about one kernel width relative to it
    (exp(±bandwidth) as a ratio, Adam's bias-corrected step being at most about its rate), the first step exactly
    by its rate where the feature's gradient is not 0."""
    x, y = dense_transcoder_rows()
    torch.manual_seed(0)
    width = 0.02  # here ``lr · mean ‖x‖₁ / median θ₀`` is 0.044: the cap binds
    coder = sae_fit.make_coder(32, 256, 8, transcode=True, jumprelu={"bandwidth": width, "l0_coeff": 1.0})
    moves: list[torch.Tensor] = []
    before = [None]
    orig_step = torch.optim.Adam.step

    def step(self, *a, **k):
        before[0] = coder.log_threshold.detach().clone()
        out = orig_step(self, *a, **k)
        moves.append((coder.log_threshold.detach() - before[0]).abs())
        return out
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch.optim.Adam, "step", step)
        sae_fit.train(x[:1024], y[:1024], coder, epochs=2, batch=256, lr=sae_fit.default_lr(256))
    assert len(moves) == 8
    first = moves[0][moves[0] > 0]
    assert len(first) > 100 and torch.allclose(first, torch.full_like(first, width), rtol=1e-3)
    assert max(float(m.max()) for m in moves) < width * 1.6


def test_the_written_per_layer_file_encodes_as_the_trained_coder(tmp_path):
    from anatomy_cli.engine.sae import Dictionary
    from anatomy_cli.models.sae import read

    gen = torch.Generator().manual_seed(5)
    for transcode in (False, True):
        coder = sae_fit.JumpReLUCoder(6, 12, transcode=transcode)
        randomise(coder, gen, theta=0.3)
        folder = tmp_path / f"t{int(transcode)}"
        sae_fit.save_saelens(coder, folder, hook="blocks.1.mlp.hook_in" if transcode else "blocks.1.hook_resid_post",
                             hook_out="blocks.1.hook_mlp_out" if transcode else "blocks.1.hook_resid_post",
                             model_name="tiny")
        sae = read.read(folder)
        assert sae.architecture == "jumprelu" and (sae.site_out != sae.site) == transcode
        x = torch.randn(20, 6, generator=gen)
        d = Dictionary(sae)
        with torch.no_grad():
            want = coder.features(x)
            torch.testing.assert_close(d.encode(x), want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(d.decode(want, x), coder(x), rtol=1e-5, atol=1e-6)


def test_the_written_clt_keeps_its_learnt_thresholds(tmp_path):
    from anatomy_cli.engine.replacement import Transcoder
    from anatomy_cli.models import transcoders

    gen = torch.Generator().manual_seed(6)
    coder = clt_fit.CrossLayerCoder(2, 6, 10, 2, jumprelu={"bandwidth": 1e-3, "l0_coeff": 1e-3})
    randomise(coder, gen, theta=0.3)
    theta = clt_fit.thresholds(coder, torch.randn(2, 5, 6, generator=gen))
    torch.testing.assert_close(theta, coder.log_threshold.detach().exp())
    clt_fit.save(coder, theta, tmp_path, scan="t", model_name="tiny")
    ts = transcoders.describe(tmp_path)
    x = torch.randn(2, 15, 6, generator=gen)
    for layer in range(2):
        arrays = transcoders.load_layer(ts, layer)
        tc = Transcoder(**{k: torch.as_tensor(arrays[k]) for k in ("W_enc", "b_enc", "b_dec", "threshold")},
                        W_dec=torch.zeros(10, 0))
        z = torch.nn.functional.linear(x[layer], coder.W_enc[layer], coder.b_enc[layer]).detach()
        torch.testing.assert_close(tc.encode(x[layer]), z * (z > theta[layer]))


# ---- unit scale (issue 62): trained on x / s(x) and target / s(target), folded back; s the typical row's RMS ----

def rms(t: torch.Tensor) -> float:
    """The lower median over the rows of each row's root mean square (``sae_fit.typical_rms``), in numpy."""
    a = t.double().numpy()
    per_row = np.sort(np.sqrt((a * a).mean(-1)))
    return float(per_row[(len(per_row) - 1) // 2])


def test_a_jumprelu_transcoder_folded_from_unit_scale_encodes_the_raw_input_as_trained(tmp_path):
    """The fold: W_enc / s_x with b_enc and θ as trained, since (W / s_x) x + b = W (x / s_x) + b is the trained
    pre-activation, compared to the trained threshold; the decoder and b_dec times s_y. The file written after it
    encodes the raw input to the activations computed here from the unit-scale weights, and decodes to their
    reconstruction times s_y."""
    from anatomy_cli.engine.sae import Dictionary
    from anatomy_cli.models.sae import read

    gen = torch.Generator().manual_seed(7)
    x, t = 0.1 * torch.randn(60, 6, generator=gen) + 0.05, 3 * torch.randn(60, 6, generator=gen) + 1
    coder = sae_fit.JumpReLUCoder(6, 12, transcode=True)
    randomise(coder, gen, theta=0.3)
    sx, sy = sae_fit.unit_scales(coder, x, t)
    assert sx == pytest.approx(rms(x), rel=1e-6) and sy == pytest.approx(rms(t), rel=1e-6)
    W, b, Wd, bd = (q.detach().clone() for q in (coder.encoder.weight, coder.encoder.bias, coder.W_dec, coder.b_dec))
    theta = coder.log_threshold.detach().exp()
    z = (x / sx) @ W.T + b
    acts = z * (z > theta)
    assert 0 < int((acts != 0).sum()) < acts.numel()  # some fire, some do not
    sae_fit.fold_scales(coder, sx, sy)
    assert torch.equal(coder.log_threshold.exp(), theta) and torch.equal(coder.encoder.bias, b)
    sae_fit.save_saelens(coder, tmp_path, hook="blocks.1.mlp.hook_in", hook_out="blocks.1.hook_mlp_out",
                         model_name="tiny")
    d = Dictionary(read.read(tmp_path))
    with torch.no_grad():
        torch.testing.assert_close(d.encode(x), acts, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(d.decode(acts, x), (acts @ Wd + bd) * sy, rtol=1e-5, atol=1e-5)


def test_a_jumprelu_transcoders_thresholds_are_placed_from_the_scaled_rows():
    """At the first step each threshold is where its latent fires on k / d_sae of the rows the encoder reads, the
    scaled ones: after the fold every latent fires on ⌈400 · 3 / 20⌉ = 60 of the 400 raw rows (inputs of RMS 20:
    thresholds placed from the raw rows would not)."""
    gen = torch.Generator().manual_seed(8)
    x = 20 * torch.randn(400, 6, generator=gen) + 5
    torch.manual_seed(0)
    coder = sae_fit.make_coder(6, 20, 3, transcode=True, jumprelu={"bandwidth": 0.05, "l0_coeff": 1.0})
    sae_fit.train(x, torch.tanh(x), coder, epochs=0, batch=64, lr=1e-3)  # the start alone, folded
    with torch.no_grad():
        fired = (coder.features(x) != 0).sum(0)  # (the row at the threshold: one more where the fold rounds)
    assert all(60 <= int(n) <= 61 for n in fired), fired


def test_a_jumprelu_clt_folded_from_unit_scale_equals_a_hand_computation():
    gen = torch.Generator().manual_seed(9)
    n, d, f, rows = 2, 6, 10, 30
    xs = torch.randn(n, rows, d, generator=gen) * torch.tensor([0.1, 20.0])[:, None, None]
    targets = 3 * torch.randn(n, rows, d, generator=gen) + 1
    coder = clt_fit.CrossLayerCoder(n, d, f, 2, jumprelu={"bandwidth": 0.05, "l0_coeff": 1.0})
    randomise(coder, gen, theta=0.3)
    sx, sy = clt_fit.unit_scales(coder, xs, targets)
    torch.testing.assert_close(sx, torch.tensor([rms(xs[0]), rms(xs[1])], dtype=torch.float32))
    torch.testing.assert_close(sy, torch.tensor([rms(targets[0]), rms(targets[1])], dtype=torch.float32))
    p = {name: q.detach().clone() for name, q in coder.named_parameters()}
    theta = p["log_threshold"].exp()
    ys, acts = [p["b_dec"][m].expand(rows, d) for m in range(n)], []
    for layer in range(n):  # the trained coder on x / s_x, by hand
        z = xs[layer] / sx[layer] @ p[f"W_enc.{layer}"].T + p["b_enc"][layer]
        acts.append(z * (z > theta[layer]))
        for j in range(n - layer):
            ys[layer + j] = ys[layer + j] + acts[-1] @ p[f"W_dec.{layer}"][:, j]
    clt_fit.fold_scales(coder, sx, sy)
    assert torch.equal(coder.log_threshold, p["log_threshold"]) and torch.equal(coder.b_enc, p["b_enc"])
    with torch.no_grad():
        for layer in range(n):
            torch.testing.assert_close(coder.thresholded(layer, xs[layer], theta[layer]), acts[layer],
                                       rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(clt_fit.jumprelu_forward(coder, xs, theta)[0],
                                   torch.stack([ys[m] * sy[m] for m in range(n)]), rtol=1e-5, atol=1e-5)


def clt_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Two blocks of 256 rows whose inputs differ in scale 30-fold."""
    gen = torch.Generator().manual_seed(10)
    xs = torch.randn(2, 256, 6, generator=gen) * torch.tensor([0.1, 3.0])[:, None, None] + 0.2
    return xs, torch.tanh(xs @ torch.randn(6, 6, generator=gen))


def a_jumprelu_clt(seed: int = 0) -> clt_fit.CrossLayerCoder:
    torch.manual_seed(seed)
    return clt_fit.CrossLayerCoder(2, 6, 16, 3, jumprelu={"bandwidth": 0.05, "l0_coeff": 1.0})


def test_a_jumprelu_clts_thresholds_start_from_each_blocks_scaled_rows():
    xs, ys = clt_rows()
    coder = a_jumprelu_clt()
    clt_fit.train(xs, ys, coder, epochs=0, batch=64, lr=1e-3)  # the start alone, folded
    theta = coder.log_threshold.detach().exp()
    with torch.no_grad():  # every feature of both blocks on ⌈256 · 3 / 16⌉ = 48 of the raw rows
        for layer in range(2):
            fired = (coder.thresholded(layer, xs[layer], theta[layer]) != 0).sum(0)
            assert all(48 <= int(n) <= 49 for n in fired), (layer, fired)  # 49: the row at the threshold


def test_a_resumed_jumprelu_clt_fit_equals_an_uninterrupted_one(monkeypatch):
    """The checkpoint (through torch.save, as --checkpoint writes it) keeps the unit scales, the thresholds, their
    kernel widths, their own learning rate and each feature's idle count: the fit resumed at step 4 of 8 ends bit
    for bit where the uninterrupted one does. One threshold is pushed above every row after step 1, so that its
    feature is idle across the checkpoint and placed again after it (step 6, ``REPLACE_EVERY`` 5)."""
    import io

    monkeypatch.setattr(ste, "REPLACE_EVERY", 5)
    xs, ys = clt_rows()

    def push(coder: clt_fit.CrossLayerCoder, done: int) -> None:
        if done == 1:
            coder.log_threshold.data[0, 5] = math.log(1000.0)

    whole = a_jumprelu_clt()
    clt_fit.train(xs, ys, whole, epochs=2, batch=64, lr=1e-2, progress=lambda done, steps: push(whole, done))
    assert float(whole.log_threshold[0, 5].detach().exp()) < 100  # placed again
    saved: list[bytes] = []

    def keep(state: dict) -> None:
        buf = io.BytesIO()
        torch.save(state, buf)
        saved.append(buf.getvalue())

    cut = a_jumprelu_clt()

    def stop(done: int, steps: int) -> None:
        push(cut, done)
        if done == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        clt_fit.train(xs, ys, cut, epochs=2, batch=64, lr=1e-2, every=2, keep=keep, progress=stop)
    state = torch.load(io.BytesIO(saved[-1]))
    assert len(state["curve"]) == 4 and int(state["coder"]["idle"][0, 5]) == 3
    torch.testing.assert_close(state["scales"][0], torch.tensor([rms(xs[0]), rms(xs[1])], dtype=torch.float32))
    resumed = a_jumprelu_clt(seed=1)  # other starting weights: the checkpoint's replace them
    clt_fit.train(xs, ys, resumed, epochs=2, batch=64, lr=1e-2, state=state)
    theirs = dict(whole.state_dict())
    assert all(torch.equal(q, theirs[name]) for name, q in resumed.state_dict().items())
    assert not torch.equal(resumed.log_threshold, state["coder"]["log_threshold"])  # the thresholds learnt


def test_an_idle_features_threshold_is_placed_again_and_its_momentum_zeroed():
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(40, 4, generator=gen) + 1.0
    log_theta = torch.log(torch.tensor([0.5, 100.0, 100.0, 0.7]))  # features 1 and 2 above every row
    idle = torch.tensor([0, ste.REPLACE_EVERY, ste.REPLACE_EVERY - 1, 3])  # 2 not idle long enough yet
    momentum = torch.ones(4)
    assert ste.replace_idle(log_theta, z, idle, 2.0, momentum) == 1
    column = np.sort(z[:, 1].double().numpy())  # 2 of 4 features per row: each on ⌈40 · 2 / 4⌉ = 20 rows
    want = np.log(np.float32([0.5, column[19], 100.0, 0.7]))  # 20 values lie above the 20th smallest
    np.testing.assert_allclose(log_theta.numpy(), want, rtol=1e-6)
    assert idle.tolist() == [0, 0, ste.REPLACE_EVERY - 1, 3] and momentum.tolist() == [1.0, 0.0, 1.0, 1.0]


def test_a_clt_threshold_pushed_above_every_pre_activation_comes_back(monkeypatch):
    """Issue 62's runaway: at 30 blocks the thresholds of 78-92% of blocks 1-11's features passed every
    pre-activation, where neither term's gradient reaches them (the kernel is 0 there), and stayed dead. Here one
    threshold is pushed to 1,000 after the first step: without re-placement it is still there at the end and the
    feature never fires; with it, the threshold is placed again at the step its idle count reaches
    ``REPLACE_EVERY`` (step 26), on that step's batch (hand computation), and the feature fires again."""
    xs, ys = clt_rows()

    def fit(every: int) -> tuple[clt_fit.CrossLayerCoder, dict[int, float]]:
        monkeypatch.setattr(ste, "REPLACE_EVERY", every)
        coder, seen = a_jumprelu_clt(), {}

        def push(done: int, steps: int) -> None:
            if done == 1:
                coder.log_threshold.data[0, 5] = math.log(1000.0)
            if done == 26:  # epoch 6 (4 steps an epoch), its second batch of 64 rows, at unit scale
                idx = torch.randperm(256, generator=torch.Generator().manual_seed(6))[64:128]
                x = xs[0, idx].double().numpy() / rms(xs[0])
                z = x @ coder.W_enc[0].detach().double().numpy()[5] + float(coder.b_enc[0, 5].detach())
                seen[-26] = max(float(np.sort(z)[64 - 12 - 1]), ste.INIT_THRESHOLD)  # 3 of 16: 12 of 64 rows above
            seen[done] = float(coder.log_threshold[0, 5].detach().exp())
        clt_fit.train(xs, ys, coder, epochs=8, batch=64, lr=1e-2, progress=push)
        return coder, seen

    def fires(coder: clt_fit.CrossLayerCoder) -> int:
        with torch.no_grad():
            return int((coder.thresholded(0, xs[0], coder.log_threshold[0].exp()) != 0)[:, 5].sum())

    stuck, seen = fit(10**9)
    assert seen[32] > 100 and fires(stuck) == 0
    back, seen = fit(25)
    assert seen[25] > 100 and seen[26] == pytest.approx(seen[-26], rel=1e-5)
    assert fires(back) > 0


@pytest.fixture
def corpus(tmp_path):
    words = ("cat", "dog", "bird", "fox", "owl", "cow", "hen", "elk")
    text = " ".join(f"The {w} sat by the {v} and saw it." for w in words for v in words)
    path = tmp_path / "corpus.txt"
    path.write_text(text + "\n")
    return path


@pytest.mark.parametrize("more", [[], ["--clt"]])
def test_the_fits_end_to_end_write_what_sae_and_circuit_read(tiny_model_dir, corpus, tmp_path, more):
    model = tiny_model_dir("llama")
    out = tmp_path / "out"
    result = runner.invoke(app, ["fit-sae", str(corpus), "--model", str(model), "--layer", "all", "--transcoder",
                                 "--activation", "jumprelu", "--out", str(out), "--ctx", "32", "--max-tokens", "256",
                                 "--d-sae", "32", "--epochs", "2", "--batch-size", "64", "--lr", "0.003",
                                 "--format", "json", *more])
    assert result.exit_code == 0, result.output
    assert "fit-sae: a JumpReLU" in result.stderr and "d_sae 32, target L0 32, L0 coefficient 1:" in result.stderr
    record = json.loads(result.stdout)
    rows = record["blocks"]
    assert len(rows) == 2 and all(r["health"]["l0_mean"] >= 0 for r in rows)
    assert record["jumprelu"] == {"bandwidth": 0.05, "l0_coeff": 1.0}  # what was fitted, not "TopK, k 32"
    if not more:
        cfg = json.loads((out / "layers.0.mlp" / "cfg.json").read_text())
        assert cfg["architecture"] == "jumprelu" and cfg["hook_name_out"] == "blocks.0.hook_mlp_out"
    # each writer records the positions the fit's rows left out (sae then measures its health without them)
    import yaml  # type: ignore[import-untyped]

    from anatomy_cli.models.ct_block import read_dictionary
    from anatomy_cli.models.sae.read import read

    recorded = yaml.safe_load((out / "config.yaml").read_text()) if more else cfg
    block = read_dictionary(out, hook="0", values=False) if more else read(out / "layers.0.mlp")
    assert recorded["skipped_positions"] == block.skipped_positions == sae_fit.SKIPPED == 1
    traced = runner.invoke(app, ["circuit", "The cat sat by the door", "--model", str(model), "--transcoders",
                                 str(out), "--format", "json"])
    assert traced.exit_code == 0, traced.output


def test_a_jumprelu_clt_checkpoint_from_before_the_pace_cap_is_refused(tmp_path):
    """Adam's state keeps log θ's learning rate, set once at the start (``jumprelu.pace``): a checkpoint written
    when its cap was 0.25 would go on at that rate. Its settings lack ``pace_cap``, so the resume is refused in one
    line naming it."""
    from anatomy_cli.engine.checkpoint import Checkpoint
    from anatomy_cli.errors import UsageError

    settings = clt_fit.settings_of(a_jumprelu_clt(), rows=128, epochs=2, batch=64, lr=1e-2, seed=0, data="d")
    assert settings["pace_cap"] == "bandwidth"
    before = {k: v for k, v in settings.items() if k != "pace_cap"}
    path = tmp_path / "clt.ckpt"
    Checkpoint(path, before, command="fit-sae").save({"curve": [1.0]})
    with pytest.raises(UsageError, match=r"other settings \(pace_cap\)"):
        Checkpoint(path, settings, command="fit-sae").load()
    assert Checkpoint(path, before, command="fit-sae").load()["curve"] == [1.0]
