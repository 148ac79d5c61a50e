"""The TopK fit's faster step (issue 62 item 2): the sparse backward (only the k chosen encoder rows per row get
gradients) gives the dense TopK's loss and gradients, per block and cross-layer, and Adam runs fused."""

from __future__ import annotations

import pytest
import torch

from anatomy_cli.engine import clt_fit
from anatomy_cli.engine import heap
from anatomy_cli.engine import sae_fit
from anatomy_cli.engine import sparse_topk


def dense_reference(x, W, b, W_dec, b_dec, k, subtract):
    """relu(x Wᵀ + b) with the dense TopK under autograd, decoded with a dense matmul."""
    pre = torch.relu((x - b_dec if subtract else x) @ W.T + b)
    top = pre.topk(k, dim=-1)
    acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
    return acts @ W_dec + b_dec


@pytest.mark.parametrize("transcode", [False, True])
def test_the_sparse_backward_gives_the_dense_gradients(transcode):
    gen = torch.Generator().manual_seed(7)
    d, f, k, rows = 8, 40, 5, 64
    coder = sae_fit.TopKCoder(d, f, k, transcode=transcode)
    with torch.no_grad():
        for p in coder.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    x, t = torch.randn(rows, d, generator=gen), torch.randn(rows, d, generator=gen)
    ref = [p.detach().clone().requires_grad_() for p in (coder.encoder.weight, coder.encoder.bias, coder.W_dec,
                                                          coder.b_dec)]
    want = sae_fit.fvu(dense_reference(x, *ref, k, not transcode), t)
    got = sae_fit.fvu(coder(x), t)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    want.backward()
    got.backward()
    for r, p in zip(ref, (coder.encoder.weight, coder.encoder.bias, coder.W_dec, coder.b_dec), strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-4, atol=1e-6)
    assert int((coder.encoder.weight.grad.abs().sum(1) > 0).sum()) <= rows * k


def test_the_clt_step_uses_the_sparse_backward_and_fused_adam():
    gen = torch.Generator().manual_seed(8)
    coder = clt_fit.CrossLayerCoder(2, 6, 20, 3)
    with torch.no_grad():
        for p in coder.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    xs = torch.randn(2, 30, 6, generator=gen)
    clt_fit.loss(coder, xs, xs).backward()
    for layer in range(2):  # the encoder rows no row chose get no gradient at all
        pre = torch.relu(xs[layer] @ coder.W_enc[layer].T + coder.b_enc[layer]).detach()
        chosen = torch.zeros(20, dtype=torch.bool)
        chosen[pre.topk(3, dim=-1).indices.flatten()] = True
        assert torch.equal(coder.W_enc[layer].grad.abs().sum(1) > 0, chosen)
    opt = sae_fit.adam(coder.parameters(), 1e-3)
    assert opt.defaults["fused"] is True


@pytest.mark.parametrize("shift", [0.0, -3.0])  # -3: most rows have fewer than k positive pre-activations
@pytest.mark.parametrize("f", [30, 256])  # 256: the forward's matmul in 4 blocks with their running maximum
def test_sparse_topk_gives_the_dense_topk_values_and_gradients_for_x_weight_bias_and_decoder(shift, f):
    gen = torch.Generator().manual_seed(11)
    rows, d, k, d_out = 48, 7, 6, 5
    x, W = torch.randn(rows, d, generator=gen), torch.randn(f, d, generator=gen)
    b, dec = torch.randn(f, generator=gen) + shift, torch.randn(f, d_out, generator=gen)
    w_out, v_out = torch.randn(rows, k, generator=gen), torch.randn(rows, d_out, generator=gen)
    ours = [t.clone().requires_grad_() for t in (x, W, b, dec)]
    ref = [t.clone().requires_grad_() for t in (x, W, b, dec)]
    decoded, acts, idx = sparse_topk.sparse_topk(*ours, k)
    pre = torch.relu(ref[0] @ ref[1].T + ref[2])  # the dense TopK, by hand: gather the k largest of the ReLU
    dense = torch.zeros(rows, f).scatter(1, idx, pre.gather(1, idx))
    torch.testing.assert_close(acts, dense.gather(1, idx))
    torch.testing.assert_close(acts.sort(-1).values, pre.topk(k, dim=-1).values.sort(-1).values)
    torch.testing.assert_close(decoded, dense @ ref[3])  # the decoder as a dense matmul
    # a loss through both outputs: the activations' gradient sums the decoder's part and the direct one
    ((acts * w_out).sum() + (decoded * v_out).sum()).backward()
    ((dense.gather(1, idx) * w_out).sum() + ((dense @ ref[3]) * v_out).sum()).backward()
    for a, r in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-5, atol=1e-6)
    assert bool((idx.sort(-1).values.diff(dim=-1) > 0).all())  # k distinct latents a row, in no set order


@pytest.mark.skipif(heap._glibc() is None, reason="glibc's mallopt only")
def test_kept_pages_lets_a_training_step_reuse_the_last_steps_memory():
    """Without it glibc can hand a step's freed temporaries back and the next step page-faults them in afresh
    (counted by hand on glibc 2.36: 4,900 faults a step at SmolLM2's width, the benchmark's size); within it,
    almost none."""
    import resource

    torch.manual_seed(0)
    coder = sae_fit.TopKCoder(256, 2048, 16, transcode=True)
    opt, x = sae_fit.adam(coder.parameters(), 1e-3), torch.randn(256, 256)

    def faults(steps: int) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            sae_fit.fvu(coder(x), x).backward()
            opt.step()
            opt.zero_grad()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    with heap.kept_pages():
        faults(3)  # the first steps take their pages (and Adam's state)
        assert faults(4) < 1200  # 4 steps' temporaries paged in afresh: ~10,000 faults (the first steps' count)
        with heap.kept_pages():  # nested: the outer block keeps its settings
            pass
        assert faults(4) < 1200
    assert heap._depth == [0]
    faults(1)  # after it: the free pages were handed back; taken again once
    # and kept, the thresholds left where glibc's own sliding ones end: 42-285 faults here, 1,225 once in CI (other
    # allocations move glibc's sliding thresholds); a trim threshold reset low pages every step afresh (~10,000)
    assert faults(4) < 2500


def test_train_counts_the_latents_its_own_forward_chose_and_the_clt_step_too():
    gen = torch.Generator().manual_seed(5)
    d, f, k, rows = 6, 24, 3, 20
    x, t = torch.randn(rows, d, generator=gen), torch.randn(rows, d, generator=gen)
    coder = sae_fit.TopKCoder(d, f, k, transcode=True)
    W = coder.encoder.weight.detach().clone()
    b = -x.mean(0) @ W.T  # train's first-step centring of a transcoder's encoder bias
    top = torch.relu(x @ W.T + b).topk(k, dim=-1)  # the dense TopK before the one step, by hand
    want = torch.zeros(f, dtype=torch.bool)
    want[top.indices[top.values > 0]] = True
    got = sae_fit.train(x, t, coder, epochs=1, batch=rows, lr=1e-3)["fired"]
    assert torch.equal(got, want)
    clt = clt_fit.CrossLayerCoder(2, d, f, k)
    xs = torch.randn(2, rows, d, generator=gen)
    want = torch.zeros(2, f, dtype=torch.bool)
    for layer in range(2):
        pre = torch.relu(xs[layer] @ clt.W_enc[layer].detach().T + clt.b_enc[layer].detach())
        chosen = pre.topk(k, dim=-1)
        want[layer, chosen.indices[chosen.values > 0]] = True
    fired = torch.zeros(2, f, dtype=torch.bool)
    clt_fit.step(clt, sae_fit.adam(clt.parameters(), 1e-3), xs, xs, fired)
    assert torch.equal(fired, want)


@pytest.mark.parametrize(("n", "k", "ties"), [(1024, 16, False), (1024, 16, True), (1000, 8, False), (40, 5, True)])
def test_largest_gives_torch_topks_values_at_indices_holding_them(n, k, ties):
    """1024 columns, k 16: two levels of maxima (256, 64); 1000: one (250 does not divide by 4); 40: topk itself.
    With ties (integer values) the indices may name other tied columns, never the same column twice."""
    gen = torch.Generator().manual_seed(3)
    pre = torch.randint(0, 6, (64, n), generator=gen).float() if ties else torch.randn(64, n, generator=gen)
    values, indices = sparse_topk.largest(pre, k)
    want = pre.topk(k, dim=-1).values
    assert torch.equal(values.sort(-1, descending=True).values, want)
    assert torch.equal(pre.gather(1, indices), values)
    assert torch.equal(indices.sort(-1).values.diff(dim=-1) > 0, torch.ones(64, k - 1, dtype=torch.bool))
    if not ties:
        assert torch.equal(indices.sort(-1).values, pre.topk(k, dim=-1).indices.sort(-1).values)


def test_the_blocked_encoder_matmul_equals_one_linear_and_its_maxima_feed_largest():
    """At 256 latents, k 4 the forward's matmul runs as 4 column blocks with their running maximum (largest's
    first level); the int32 keys its topk reads order as the floats do (NaN the largest, as topk)."""
    gen = torch.Generator().manual_seed(12)
    x, W, b = torch.randn(32, 24, generator=gen), torch.randn(256, 24, generator=gen), torch.randn(256, generator=gen)
    blocked, first = sparse_topk._pre_activations(x, W, b, 4)
    pre = blocked.permute(1, 0, 2).reshape(32, 256)  # column quarter j in blocked[j]
    torch.testing.assert_close(pre, x @ W.T + b)
    assert torch.equal(first, pre.reshape(32, 4, 64).amax(1))
    values, indices = sparse_topk.largest(blocked, 4, first)
    assert torch.equal(values.sort(-1, descending=True).values, pre.topk(4, dim=-1).values)
    assert torch.equal(pre.gather(1, indices), values)
    ascending = torch.tensor([float("-inf"), -3e38, -1.5, -1e-45, -0.0, 0.0, 1e-45, 1.5, 3e38, float("inf")])
    keys = sparse_topk._keys(torch.cat([ascending, torch.tensor([float("nan")])]))
    assert bool((keys[:10].diff() > 0).all()) and int(keys[10]) == int(keys[9])  # NaN as +inf: above the rest


def test_the_sparse_jumprelu_decode_gives_the_dense_values_and_gradients():
    """A JumpReLU CLT's decode (issue 62: the dense ``[rows, F] x [F, (L − l)·d]`` product made the 30-block step
    2.5 h at load 7): every feature in the kernel's window carries the threshold's gradient, active or not."""
    from anatomy_cli.engine import jumprelu as ste

    gen = torch.Generator().manual_seed(12)
    rows, f, d_out, width = 40, 30, 9, 0.4
    z0, theta0 = torch.randn(rows, f, generator=gen), torch.rand(f, generator=gen) + 0.5
    dec0, weight = torch.randn(f, d_out, generator=gen), torch.randn(rows, d_out, generator=gen)
    ours = [t.clone().requires_grad_() for t in (z0, theta0, dec0)]
    ref = [t.clone().requires_grad_() for t in (z0, theta0, dec0)]
    acts, idx = ste.jumprelu_sparse(ours[0], ours[1], width)
    got = sparse_topk.sparse_decode(acts, idx, ours[2])
    u = (ref[0] - ref[1]) / width  # by hand: the value z·H(z − θ), z's gradient H(z − θ), θ's −(θ/ε)·K(u)
    window = ((u > -0.5) & (u < 0.5)).float().detach()
    active = (ref[0] > ref[1]).float().detach()
    feats = ref[0] * active - (ref[1] * window - (ref[1] * window).detach()) * (ref[1] / width).detach()
    want = feats @ ref[2]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(idx, idx.sort(-1).values)
    assert 0 < int(window.sum()) and int(((u <= -0.5).sum(-1)).min()) > 0  # both kinds of feature present
    (got * weight).sum().backward()
    (want * weight).sum().backward()
    for a, r in zip(ours, ref, strict=True):
        torch.testing.assert_close(a.grad, r.grad, rtol=1e-4, atol=1e-5)  # θ's: sums of 40 rows, in another order
    torch.testing.assert_close(ste.jumprelu(z0, theta0, width) @ dec0, got.detach(), rtol=1e-5, atol=1e-6)
