"""fit-sae's training batches (misc71 item 1): an epoch's remainder of under 8 rows (``declare.shared.MIN_ROWS``)
joins the batch before it. As a batch of its own, 1 row had no variance around its own mean and an FVU of its
error over 1e-30, and the 1e30 loss's gradient corrupted Adam's moments. A per-layer coder's steps against a
hand-written loop over the folded batches, a cross-layer coder's batches and its resume, and the rule's batches for
remainders 0, under 8 and 8 or more (those unchanged)."""

from __future__ import annotations

import copy

import pytest
import torch

from anatomy_cli.engine import clt_fit
from anatomy_cli.engine import sae_fit


@pytest.mark.parametrize(("rows", "batch", "want"), [
    (33, 32, [(0, 33)]),  # remainder 1: one batch of 33
    (71, 32, [(0, 32), (32, 71)]),  # remainder 7: the second batch 39 rows
    (72, 32, [(0, 32), (32, 64), (64, 72)]),  # remainder 8: a batch of its own, as before
    (64, 32, [(0, 32), (32, 64)]),  # no remainder: as before
    (5, 32, [(0, 5)]),  # one batch, nothing to fold into
    (12, 4, [(0, 4), (4, 8), (8, 12)]),  # batches under 8 rows, no remainder: as before
    (14, 4, [(0, 4), (4, 8), (8, 14)]),  # ... a remainder of 2 joins the last
])
def test_a_remainder_under_8_rows_joins_the_batch_before(rows, batch, want):
    assert sae_fit.epoch_batches(rows, batch) == want


def _hand_fit(x: torch.Tensor, coder: sae_fit.TopKCoder, *, epochs: int, lr: float) -> list[float]:
    """sparsify's TopK SAE step written out (dense TopK, the FVU, the decoder's parallel gradient removed, unit
    rows), one step per epoch over all the rows of ``x``: the batches of rows = batch + 1 as the rule folds them."""
    w, b, w_dec = (p.detach().clone().requires_grad_() for p in (coder.encoder.weight, coder.encoder.bias,
                                                                 coder.W_dec))
    b_dec = x.mean(0).clone().requires_grad_()  # the first step's b_dec: the target's mean
    opt = torch.optim.Adam([w, b, w_dec, b_dec], lr=lr, fused=True)
    g, curve = torch.Generator().manual_seed(0), []
    for _ in range(epochs):
        xb = x[torch.randperm(len(x), generator=g)]
        pre = torch.relu((xb - b_dec) @ w.T + b)
        top = pre.topk(coder.k, dim=-1)
        y = torch.zeros_like(pre).scatter(-1, top.indices, top.values) @ w_dec + b_dec
        loss = ((y - xb) ** 2).sum() / ((xb - xb.mean(0)) ** 2).sum()
        loss.backward()
        with torch.no_grad():
            w_dec.grad -= (w_dec.grad * w_dec).sum(-1, keepdim=True) * w_dec
        opt.step()
        opt.zero_grad()
        with torch.no_grad():
            w_dec /= w_dec.norm(dim=1, keepdim=True) + torch.finfo(w_dec.dtype).eps
        curve.append(float(loss.detach()))
    return curve


def test_rows_one_past_the_batch_train_one_step_an_epoch_as_a_hand_written_loop(monkeypatch):
    """33 rows at --batch-size 32: before, each epoch's second step was 1 row and its FVU about 1e30 (here
    computed: the error of the one row over 1e-30); now each epoch is one step of 33 rows, every loss under 2, each
    equal to the hand-written loop's."""
    torch.manual_seed(0)
    x = torch.randn(33, 8)
    coder = sae_fit.TopKCoder(8, 16, 3)
    epochs, lr = 4, 1e-2
    want = _hand_fit(x, coder, epochs=epochs, lr=lr)
    seen: list[int] = []
    objective = sae_fit.objective

    def counting(c, xb, yb, fired=None):
        seen.append(len(xb))
        return objective(c, xb, yb, fired)

    monkeypatch.setattr(sae_fit, "objective", counting)
    got = sae_fit.train(x, x, coder, epochs=epochs, batch=32, lr=lr)
    assert seen == [33] * epochs and got["steps"] == epochs
    assert max(got["fvu"]) < 2
    assert got["fvu"] == pytest.approx(want, rel=1e-4)
    one_row = x[:1]  # the old tail batch's loss, by hand: its error over the clamp of a zero variance
    assert float(((one_row - x.mean(0)) ** 2).sum() / 1e-30) > 1e29


def test_a_clt_folds_its_tail_and_a_resumed_fit_is_the_uninterrupted_one(monkeypatch):
    """A 2-block CLT on 35 rows at batch 32 (remainder 3): one step of 35 rows an epoch, each summed FVU under 10 (2
    blocks, about 1 each at the start); stopped after step 2 and resumed from that checkpoint, the coder is the
    uninterrupted one, bit for bit; a checkpoint's settings name the fold (an older one of such a fit is refused)."""
    gen = torch.Generator().manual_seed(4)
    xs, targets = torch.randn(2, 35, 8, generator=gen), torch.randn(2, 35, 8, generator=gen)

    def coder() -> clt_fit.CrossLayerCoder:
        torch.manual_seed(1)
        return clt_fit.CrossLayerCoder(2, 8, 16, 3)

    kept: list[dict] = []
    step = clt_fit.step
    sizes: list[int] = []

    def counting(c, opt, xb, tb, fired=None):
        sizes.append(xb.shape[1])
        return step(c, opt, xb, tb, fired)

    monkeypatch.setattr(clt_fit, "step", counting)
    whole = coder()
    done = clt_fit.train(xs, targets, whole, epochs=4, batch=32, lr=1e-2, every=2,
                         keep=lambda state: kept.append(copy.deepcopy(state)))  # as the task writes it
    assert sizes == [35] * 4 and done["steps"] == 4 and max(done["fvu"]) < 10
    resumed = coder()
    again = clt_fit.train(xs, targets, resumed, epochs=4, batch=32, lr=1e-2, state=kept[0])
    assert again["fvu"] == done["fvu"]
    for (name, a), b in zip(whole.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    settings = clt_fit.settings_of(whole, rows=35, epochs=4, batch=32, lr=1e-2, seed=0, data="")
    assert settings["tail"] == "folded"
    assert "tail" not in clt_fit.settings_of(whole, rows=41, epochs=4, batch=32, lr=1e-2, seed=0, data="")
