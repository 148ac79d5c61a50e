"""The TopK of an encoder's ReLU with its decoder's row sum, and a backward that touches the chosen rows alone
(issue 62 item 2): :func:`sparse_topk`, used by the TopK fits of engine/sae_fit.py and engine/clt_fit.py. The
measurements behind its form are in docs/performance.md ("The TopK fit's step against sparsify's")."""

from __future__ import annotations

import warnings

import numpy
import torch

from anatomy_cli.engine.jumprelu import AutogradCtx


class _SparseTopK(torch.autograd.Function):
    """:func:`sparse_topk`'s forward (one dense matmul, the TopK of its ReLU, the decoder's rows summed) and
    backward (the k chosen rows of each weight: sparse products, no dense ``[rows, d_sae]`` one)."""

    @staticmethod
    def forward(ctx: AutogradCtx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                decoder: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        pre, first = _pre_activations(x, weight, bias, k)
        acts, idx = largest(pre, k, first)  # each row's latents in no set order (the backward sorts them by latent)
        acts.clamp_min_(0)  # the ReLU on the k values only
        decoded = torch.nn.functional.embedding_bag(idx, decoder, per_sample_weights=acts, mode="sum")
        ctx.save_for_backward(x, weight, decoder, idx, acts)
        ctx.mark_non_differentiable(idx)
        return decoded, acts, idx

    @staticmethod
    def backward(ctx: AutogradCtx, grad_decoded: torch.Tensor, grad_acts: torch.Tensor,
                 _: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        x, weight, decoder, idx, acts = ctx.saved_tensors
        n, needs = weight.shape[0], ctx.needs_input_grad
        by_latent = _by_latent(idx, n)
        grad_acts = grad_acts + _sampled(by_latent, decoder, grad_decoded).view(idx.shape)
        g = grad_acts * (acts > 0)  # the ReLU's derivative (a chosen 0 passes nothing)
        grad_x = grad_w = grad_b = grad_dec = None
        if needs[0]:  # Σ_j g[r, j] W[idx[r, j]]: an embedding_bag, no [rows, k, d] copy
            grad_x = torch.nn.functional.embedding_bag(idx, weight, per_sample_weights=g, mode="sum")
        if needs[1]:  # row f of ∂W: Σ over the (r, j) that chose f of g[r, j] x[r]
            grad_w = _rows_product(by_latent, g, x)
        if needs[2]:
            grad_b = weight.new_zeros(n).index_add_(0, idx.reshape(-1), g.reshape(-1))
        if needs[3]:  # row f of ∂decoder: Σ over the (r, j) that chose f of acts[r, j] grad_decoded[r]
            grad_dec = _rows_product(by_latent, acts, grad_decoded)
        return grad_x, grad_w, grad_b, grad_dec, None


def _csr(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # torch's once-per-process "CSR support is in beta" warning, not the user's
        warnings.simplefilter("ignore")
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _by_latent(idx: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """The transposed pattern, ``[n, rows]``: (its row pointers, its columns (the rows that chose each latent,
    in order), the permutation of the flattened ``[rows, k]`` values into that order, rows)."""
    rows, k = idx.shape
    flat = idx.reshape(-1)
    perm = _stable_order(flat, n)  # stable: each latent's rows ascending
    crow = flat.new_zeros(n + 1)
    torch.cumsum(torch.bincount(flat, minlength=n), 0, out=crow[1:])
    return crow, perm // k, perm, rows


def _stable_order(flat: torch.Tensor, n: int) -> torch.Tensor:
    """``flat.argsort(stable=True)`` for latent ids below ``n``: on the CPU with ``n`` ≤ 2¹⁵ numpy's radix sort of
    the ids as int16 (0.07 ms for the benchmark's 8,192 ids against torch's 0.40, one thread; the same order)."""
    if flat.device.type != "cpu" or n > 2**15:
        return flat.argsort(stable=True)
    return torch.from_numpy(numpy.argsort(flat.to(torch.int16).numpy(), kind="stable")).to(flat.dtype)


def _sampled(by_latent: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], decoder: torch.Tensor,
             grad: torch.Tensor) -> torch.Tensor:
    """``[rows·k]``: ``decoder[idx[r, j]] · grad[r]`` at the flattened (r, j), a sampled product over the
    by-latent pattern (each chosen decoder row read once, the ``[rows, d]`` gradient from cache: 1.2 ms at the
    benchmark's size against 1.6 ms over the by-row pattern, the same values), put back in (r, j) order."""
    crow, col, perm, rows = by_latent
    pattern = _csr(crow, col, grad.new_zeros(len(col)), (len(crow) - 1, rows))
    values = torch.sparse.sampled_addmm(pattern, decoder, grad.T, beta=0.0).values()
    return torch.empty_like(values).scatter_(0, perm, values)


def _rows_product(by_latent: tuple[torch.Tensor, torch.Tensor, torch.Tensor, int], values: torch.Tensor,
                  dense: torch.Tensor) -> torch.Tensor:
    """``[n, dense width]``: row f the sum of ``values[r, j] · dense[r]`` over the (r, j) that chose latent f,
    one sparse × dense product written once (``addmm`` with ``beta=0`` into fresh memory: measured 3× faster
    than ``torch.sparse.mm``, which zero-fills first, and 5× faster than k ``index_add_``; an ``embedding_bag``
    with a bag per latent, 0.8 ms against 1.1 alone, did not change the step's time)."""
    crow, col, perm, rows = by_latent
    out = dense.new_empty(len(crow) - 1, dense.shape[1])
    pattern = _csr(crow, col, values.reshape(-1).index_select(0, perm), (len(crow) - 1, rows))
    return torch.addmm(out, pattern, dense, beta=0, out=out)


_LEVEL = 4  # each level of largest's maxima: the max of 4 columns of the level below


def _pays(n: int, k: int) -> bool:
    """Whether a level of maxima over ``n`` columns pays for top k (``n/4`` columns, each level's ``topk`` then
    reading ``4k`` candidates a row)."""
    return n % _LEVEL == 0 and n // _LEVEL >= _LEVEL * k


def _pre_activations(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     k: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(x weightᵀ + bias, its first level of maxima [rows, n/4] or None)``: the matmul as 4 ``addmm``, one per
    column quarter, each into its own contiguous block of a blocked ``[4, rows, n/4]`` output (column ``j·n/4 + c``
    in ``[j, :, c]``; the same products, at the benchmark's size bit for bit one ``linear``'s; 16.8 ms against
    17.1 for ``addmm`` into each quarter's strided columns of one ``[rows, n]``, alone, one thread, loaded), each
    quarter folded into the running maximum as it is made: column c of the maxima is the max of columns ``c +
    j·n/4``, :func:`largest`'s first level, which a pass over the whole ``[rows, n]`` output after one matmul read
    back from memory (0.43–0.53 ms of CPU in the benchmark's step, loaded, against 0.15 in cache;
    docs/performance.md). A ``[rows, n]`` ``linear`` and None where that level does not pay (:func:`_pays`)."""
    n = weight.shape[0]
    if not _pays(n, k):
        return torch.nn.functional.linear(x, weight, bias), None
    width = n // _LEVEL
    pre = x.new_empty(_LEVEL, x.shape[0], width)
    first = None
    for j in range(_LEVEL):
        block = torch.addmm(bias[j * width:(j + 1) * width], x, weight[j * width:(j + 1) * width].T, out=pre[j])
        first = block.clone() if first is None else torch.maximum(first, block, out=first)
    return pre, first


def _under(below: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the ``[rows, 4k]`` columns of level ``below`` under ``cols [rows, k]`` of the level above it, column ``c +
    j·n/4`` at ``j·k + i`` for ``c = cols[:, i]``, and their values). ``below``: ``[rows, n]``, or blocked ``[4,
    rows, n/4]`` (column ``j·n/4 + c`` in ``[j, :, c]``: :func:`_pre_activations`), read through a gather on its
    ``[rows, 4, n/4]`` view (0.08 ms at the benchmark's size against 0.43 for ``take`` at flat offsets)."""
    rows, k = cols.shape
    span = below.shape[2] if below.dim() == 3 else below.shape[1] // _LEVEL
    under = (cols.unsqueeze(1) + torch.arange(0, _LEVEL * span, span, device=cols.device)[:, None]).view(rows, -1)
    if below.dim() == 2:
        return under, below.gather(1, under)
    return under, below.permute(1, 0, 2).gather(2, cols.unsqueeze(1).expand(rows, _LEVEL, k)).view(rows, -1)


def _keys(values: torch.Tensor) -> torch.Tensor:
    """int32 keys in the order of the float32 ``values`` (NaN the largest, as ``topk`` has it; -0.0 just below
    0.0, which are equal values): the float's bits with the magnitude bits of negatives flipped. torch's CPU
    ``topk`` on int32 takes ~0.65 of its time on float32 (no NaN-aware comparison): 0.54 against 0.85 ms for
    ``[256, 288]``, k 32. Other dtypes than float32: the values themselves."""
    if values.dtype != torch.float32:
        return values
    bits = torch.nan_to_num(values, nan=float("inf"), posinf=float("inf"), neginf=float("-inf")).view(torch.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def largest(pre: torch.Tensor, k: int, first: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(values, indices)``, each ``[rows, k]`` in no set order: each row's k largest of ``pre [rows, n]``, the
    values exactly ``pre.topk(k)``'s (where values tie, possibly other indices of the tied values). torch's CPU
    ``topk`` costs 4 ms for the benchmark's ``[256, 4608]`` (a branchy selection, ~4–10 ns an element); this one
    takes the maxima of strided column groups of 4, twice (``[rows, n/4]``, ``[rows, n/16]``, vectorised
    passes; ``first``: the first level where the caller has it, :func:`_pre_activations`), the top k of the
    coarsest level, and descends: the k largest of a level lie in the 4 columns under each of the k largest
    maxima above it (an element under none of them has k larger ones above it, one under each), so each level's
    ``topk`` reads 4k candidates a row, as int32 keys (:func:`_keys`): ~2.3 ms. Where ``n`` does not divide by 4
    or k is too large for a level to pay (``n/4 < 4k``), it is ``topk`` itself. ``pre`` may be blocked ``[4, rows,
    n/4]`` where ``first`` is given (:func:`_pre_activations`)."""
    rows, levels = pre.shape[-2], [pre] if first is None else [pre, first]
    while _pays(levels[-1].shape[1], k) and len(levels) < 3:
        below = levels[-1]
        levels.append(below.reshape(rows, _LEVEL, below.shape[1] // _LEVEL).amax(1))  # column c: max of c + j·n/4
    if len(levels) == 1:
        top = pre.topk(k, dim=-1, sorted=False)
        return top.values, top.indices
    cols = chosen = _keys(levels.pop()).topk(k, dim=-1, sorted=False).indices
    while levels:
        cols, candidates = _under(levels.pop(), cols)  # [rows, 4k]
        chosen = _keys(candidates).topk(k, dim=-1, sorted=False).indices
        cols = cols.gather(1, chosen)
    return candidates.gather(1, chosen), cols


class _SparseDecode(torch.autograd.Function):
    """:func:`sparse_decode`: an ``embedding_bag`` forward, the TopK's sparse backward for the values and the
    decoder."""

    @staticmethod
    def forward(ctx: AutogradCtx, acts: torch.Tensor, idx: torch.Tensor, decoder: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(acts, idx, decoder)
        return torch.nn.functional.embedding_bag(idx, decoder, per_sample_weights=acts, mode="sum")

    @staticmethod
    def backward(ctx: AutogradCtx, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, torch.Tensor | None]:
        acts, idx, decoder = ctx.saved_tensors
        by_latent = _by_latent(idx, decoder.shape[0])
        grad_acts = _sampled(by_latent, decoder, grad).view(idx.shape) if ctx.needs_input_grad[0] else None
        grad_dec = _rows_product(by_latent, acts, grad) if ctx.needs_input_grad[2] else None
        return grad_acts, None, grad_dec


def sparse_decode(acts: torch.Tensor, idx: torch.Tensor, decoder: torch.Tensor) -> torch.Tensor:
    """``[rows, d_out]``: ``Σ_j acts[:, j] decoder[idx[:, j]]`` (``acts``, ``idx``: ``[rows, m]``, each row's
    latents in ascending order), what ``dense @ decoder`` gives for the ``[rows, d_sae]`` matrix holding ``acts``
    at ``idx`` and 0 elsewhere, values and gradients (tested), at ``rows·m`` of its ``rows·d_sae`` products:
    a JumpReLU CLT's decoders (engine/clt_fit.py)."""
    out: torch.Tensor = _SparseDecode.apply(acts, idx, decoder)  # type: ignore[no-untyped-call]
    return out


def sparse_topk(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, decoder: torch.Tensor,
                k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(decoded [rows, d_out], top_acts [rows, k], top_indices [rows, k])``: the TopK of ``relu(x weightᵀ +
    bias)`` and ``Σ_j top_acts[:, j] decoder[top_indices[:, j]]``, with a sparse backward. The forward is the one
    dense matmul and its TopK (the ReLU applied to the k values: where fewer than k are positive, the rest are 0
    as the dense TopK's, whichever latents they name) and an ``embedding_bag`` over the decoder's k rows; the
    backward touches the chosen rows alone: ``g[r, j] x[r]`` into rows ``idx[r, j]`` of the weight's gradient
    (``2·rows·k·d`` FLOPs, where the dense TopK's backward multiplies a dense ``[rows, d_sae]`` gradient by ``x``,
    as many FLOPs as the forward), ``acts[r, j] ∂decoded[r]`` into the decoder's, each as one sparse × dense
    product, and the activations' gradient as a sampled product. Values and gradients are the dense TopK's
    (tested)."""
    decoded, acts, idx = _SparseTopK.apply(x, weight, bias, decoder, k)  # type: ignore[no-untyped-call]
    return decoded, acts, idx
