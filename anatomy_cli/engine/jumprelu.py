"""JumpReLU with the straight-through estimator for its thresholds (Rajamanoharan et al. 2024, "Jumping Ahead";
SAELens' ``JumpReLUTrainingSAE``), what ``fit-sae --activation jumprelu`` trains, per block and cross-layer.

A feature's activation is ``z · (z > θ)`` (``z`` its pre-activation, ``θ = exp(log_threshold) > 0`` its
threshold); the sparsity term is built on its L0, ``Σ_f (z_f > θ_f)`` per row, averaged over the rows. Both are step
functions of ``θ``, so their gradients with respect to ``θ`` are the pseudo-derivatives of the paper (a rectangle
kernel ``K(u) = 1`` for ``|u| < 1/2``, of width ``bandwidth`` ε): ``∂(z·H(z − θ))/∂θ = −(θ/ε) K((z − θ)/ε)`` and
``∂H(z − θ)/∂θ = −(1/ε) K((z − θ)/ε)``, summed over the rows; ``z`` gets the gradient ``H(z − θ)`` through the
activation and none through the L0. ``θ`` is trained as ``log_threshold`` (SAELens' parametrisation).

The sparsity term holds the mean L0 near a target ``k`` (``--k``) instead of only pushing it down: ``(L0/k − 1)²``
per block (:func:`l0_penalty`, the ``target_l0`` form of Marks et al.'s ``dictionary_learning`` JumpReLU trainer,
its ``sparsity_penalty`` our ``l0_coeff``), so the thresholds rise while the L0 is over ``k`` and fall while it is
under. A plain ``λ · L0`` (the paper's, SAELens' ``step`` mode) settles wherever ``λ`` balances the reconstruction,
which a user cannot know beforehand.

The start: SAELens and the paper start every ``θ`` at 0.001 (:data:`INIT_THRESHOLD`) with the bandwidth 0.001, on
activations scaled to unit variance per dimension, and train for 10⁵ steps and more, at a learning rate of about
1e-4. Here the fit starts each feature's threshold from the data instead (:func:`initial_log_threshold`, at the
first step, as the encoder bias is centred): the value its pre-activation exceeds on ``k / d_sae`` of the first
rows, so the fit starts at the target L0; never below :data:`INIT_THRESHOLD`.

The pace (:func:`pace`): Adam moves every encoder weight by about the learning rate per step, so a pre-activation
``z = w·x + b`` can move by up to ``lr · ‖x‖₁`` per step (SmolLM2's block-3 MLP input: ‖x‖₁ ≈ 43, so 0.016 per step
against a median starting threshold of 0.13), while ``log θ`` moves by about ``lr`` (0.04% of θ per step). At one
learning rate the encoder outran the thresholds and the L0 rose from k (32) to 563 in 32 steps. ``log θ`` therefore
learns at ``lr · mean ‖x‖₁ / median θ₀`` (its own Adam group), a threshold as fast as the pre-activations it is
compared to; **at most ``bandwidth``** (the kernel's width as a fraction of the median threshold), so that one
Adam step moves a threshold by about one kernel width at most.

Why the cap is the kernel's width: the estimator's gradient for ``θ`` comes only from the rows inside its window
(``|z − θ| < ε/2``), and Adam moves ``log θ`` by about its learning rate whatever the gradient's size. A step of
several widths carries a threshold past every row that gave it the gradient; above every pre-activation of its
feature plus ``ε/2`` it gets no gradient back, from the reconstruction or the L0 term, and Adam's momentum carries
it further: the feature dies. Until issue 62's follow-up the cap was 0.25 (a step of up to 28%, five kernel widths
at unit scale): a per-layer JumpReLU transcoder on SmolLM2 (7,812 rows, 1,024 latents, target L0 16) ended with
50% (block 3) and 75% (block 15) of its latents dead, a 12-block CLT with 27% of its features firing on none of
2,016 training rows; at the kernel's width 1.8% and 5.8% dead, and 11% (docs/commands/sae.md).

The idle (:func:`replace_idle`, the CLT's fit): a feature that fired on none of the last :data:`REPLACE_EVERY`
batches all the same has its threshold placed again from the batch, as at the start. Issue 62's 30-block CLT, at
the old cap, had lost 78–92% of blocks 1–11's features, their L0 at 1.4 against a target of 16.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

INIT_THRESHOLD = 1e-3  # SAELens' jumprelu_init_threshold: here the least start
INIT_ROWS = 4096  # the first rows whose pre-activations place the starting thresholds
REPLACE_EVERY = 25  # steps: a feature that fired on none of the last this many batches has its threshold placed again


def _kernel(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """The rectangle kernel ``K((z − θ)/ε)``: 1 where ``|z − θ| < ε/2``."""
    u = (z - theta) / bandwidth
    return ((u > -0.5) & (u < 0.5)).to(z.dtype)


class AutogradCtx(Protocol):
    """What the autograd Functions here and in engine/sae_fit.py use of the ``ctx`` torch passes them."""

    saved_tensors: tuple[torch.Tensor, ...]
    needs_input_grad: tuple[bool, ...]
    bandwidth: float  # the JumpReLU's kernel width, kept by its forward for its backward

    def save_for_backward(self, *tensors: torch.Tensor) -> None: ...
    def mark_non_differentiable(self, *tensors: torch.Tensor) -> None: ...


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: AutogradCtx, z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
        ctx.save_for_backward(z, theta)
        ctx.bandwidth = bandwidth
        return z * (z > theta)

    @staticmethod
    def backward(ctx: AutogradCtx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        z, theta = ctx.saved_tensors
        k = _kernel(z, theta, ctx.bandwidth)
        g_theta = (-(theta / ctx.bandwidth) * k * grad).reshape(-1, theta.shape[-1]).sum(0)
        return (z > theta) * grad, g_theta, None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx: AutogradCtx, z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
        ctx.save_for_backward(z, theta)
        ctx.bandwidth = bandwidth
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: AutogradCtx, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        z, theta = ctx.saved_tensors
        k = _kernel(z, theta, ctx.bandwidth)
        g_theta = (-(1.0 / ctx.bandwidth) * k * grad).reshape(-1, theta.shape[-1]).sum(0)
        return torch.zeros_like(z), g_theta, None


def jumprelu(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """``z · (z > θ)`` with the straight-through gradient for ``θ`` (``z [rows, F]``, ``θ [F]``)."""
    out: torch.Tensor = _JumpReLU.apply(z, theta, bandwidth)  # type: ignore[no-untyped-call]
    return out


def jumprelu_sparse(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(acts, idx)``, each ``[rows, m]``, idx ascending in each row: :func:`jumprelu` of ``z [rows, F]`` at the
    ``m`` features of each row that can carry a value or a gradient, those with ``z > θ − ε/2`` (active, or in the
    kernel's window), padded with other features (their value and gradients 0), ``m`` the most any row has. With
    ``engine.sparse_topk.sparse_decode`` it is ``jumprelu(z, θ, ε) @ decoder``, values and gradients, without the
    dense product (a JumpReLU CLT decodes to every later block: engine/clt_fit.py)."""
    gap = z.detach() - theta.detach()
    near = gap / bandwidth > -0.5  # the kernel's own test (:func:`_kernel`), or above it
    m = max(1, int(near.sum(-1).max()))
    key = torch.where(near, gap, float("-inf"))  # the near features first
    idx = key.topk(m, dim=-1, sorted=False).indices.sort(dim=-1).values
    acts = jumprelu(z.gather(-1, idx).reshape(1, -1), theta[idx].reshape(-1), bandwidth)  # θ per entry
    return acts.view(idx.shape), idx


def l0(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """The mean over rows of the number of features with ``z > θ``, with the straight-through gradient for ``θ``."""
    out: torch.Tensor = _Step.apply(z, theta, bandwidth)  # type: ignore[no-untyped-call]
    return out.sum(-1).mean()


def l0_penalty(l0: torch.Tensor, target: float) -> torch.Tensor:
    """The sparsity term of a mean L0 ``l0`` (:func:`l0`, with its straight-through gradient) against the target
    ``target``: ``(l0 / target − 1)²``, 0 at the target."""
    return (l0 / target - 1.0).pow(2)


def kernel_width(bandwidth: float, log_theta: torch.Tensor) -> float:
    """The kernel's width ε for thresholds ``log_theta`` placed from the data: ``bandwidth`` times their median (the
    width in the thresholds' own units, whatever the activations' scale)."""
    return bandwidth * float(log_theta.detach().exp().median())


def pace(opt: torch.optim.Optimizer, x_in: torch.Tensor, log_theta: torch.Tensor, bandwidth: float) -> float:
    """Set the learning rate of ``opt``'s last parameter group (``log θ``, alone in it) to the first group's times
    ``mean ‖x_in‖₁ / median θ`` (``x_in [..., d]``: the rows the encoder reads; ``log_theta``: the placed
    thresholds), so that a threshold moves per step about as far as a pre-activation can (module docstring); at
    most ``bandwidth`` (the kernel's width over the median threshold, :func:`kernel_width`): a step moves a
    threshold by about one kernel width at most. Returns the factor used."""
    lr = float(opt.param_groups[0]["lr"])
    rate = min(float(x_in.abs().sum(-1).mean() / log_theta.detach().exp().median()), bandwidth / lr)
    opt.param_groups[-1]["lr"] = lr * rate
    return rate


def log_threshold(*shape: int) -> torch.nn.Parameter:
    """``log θ`` of every feature at :data:`INIT_THRESHOLD`."""
    return torch.nn.Parameter(torch.full(shape, math.log(INIT_THRESHOLD)))


@torch.no_grad()
def initial_log_threshold(z: torch.Tensor, l0: float) -> torch.Tensor:
    """``log θ [F]`` at which each feature fires on about ``l0 / F`` of the rows of ``z [rows, F]`` (its
    ``⌈rows · l0 / F⌉``-th largest value), at least ``log INIT_THRESHOLD``."""
    rows, features = z.shape
    above = min(rows - 1, max(1, math.ceil(rows * l0 / features)))
    theta = z.kthvalue(rows - above, dim=0).values  # ``above`` rows lie strictly above it (ties aside)
    return theta.clamp_min(INIT_THRESHOLD).log()


@torch.no_grad()
def replace_idle(log_theta: torch.Tensor, z: torch.Tensor, idle: torch.Tensor, l0: float,
                 momentum: torch.Tensor | None) -> int:
    """Place again the thresholds of the features idle for :data:`REPLACE_EVERY` steps or more (``idle [F]``: the
    steps since each last fired), as at the start: where each fires on ``l0 / F`` of the rows of ``z [rows, F]``
    (the batch's pre-activations; :func:`initial_log_threshold`; why: the module docstring). Their ``idle`` is
    reset, and their Adam momentum (``momentum``, ``log θ``'s ``exp_avg``, or None before the first step)
    zeroed, so that the placed threshold moves by its own gradient only. Returns how many were placed."""
    dead = idle >= REPLACE_EVERY
    count = int(dead.sum())
    if count:
        log_theta[dead] = initial_log_threshold(z, l0)[dead]
        idle[dead] = 0
        if momentum is not None:
            momentum[dead] = 0
    return count
