"""JumpReLU with the straight-through estimator for its thresholds (Rajamanoharan et al. 2024, "Jumping Ahead";
SAELens' ``JumpReLUTrainingSAE``), what ``fit-sae --activation jumprelu`` trains, per block and cross-layer.

A feature's activation is ``z · (z > θ)`` (``z`` its pre-activation, ``θ = exp(log_threshold) > 0`` its
threshold); the sparsity penalty is its L0, ``Σ_f (z_f > θ_f)`` per row, averaged over the rows. Both are step
functions of ``θ``, so their gradients with respect to ``θ`` are the pseudo-derivatives of the paper (a rectangle
kernel ``K(u) = 1`` for ``|u| < 1/2``, of width ``bandwidth`` ε): ``∂(z·H(z − θ))/∂θ = −(θ/ε) K((z − θ)/ε)`` and
``∂H(z − θ)/∂θ = −(1/ε) K((z − θ)/ε)``, summed over the rows; ``z`` gets the gradient ``H(z − θ)`` through the
activation and none through the L0. ``θ`` is trained as ``log_threshold`` (SAELens' parametrisation).

The start: SAELens and the paper start every ``θ`` at 0.001 (:data:`INIT_THRESHOLD`) with the bandwidth 0.001, on
activations scaled to unit variance per dimension, and train for 10⁵ steps and more, at a learning rate of about
1e-4. ``θ`` moves by about the learning rate per Adam step in ``log θ``, so a fit of a few hundred steps leaves it
where it started: at 0.001 about half of the centred pre-activations clear it (measured: a held-out L0 of 3,613
of 4,608 latents after a docs-sized fit). Here the fit starts each feature's threshold from the data instead
(:func:`initial_log_threshold`, at the first step, as the encoder bias is centred): the value its pre-activation
exceeds on ``k / d_sae`` of the first rows (``k`` the TopK setting), so the fit starts at TopK's mean L0 and the
penalty and the reconstruction move ``θ`` from there; never below :data:`INIT_THRESHOLD`.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

INIT_THRESHOLD = 1e-3  # SAELens' jumprelu_init_threshold: here the least start
INIT_ROWS = 4096  # the first rows whose pre-activations place the starting thresholds


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


def l0(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """The mean over rows of the number of features with ``z > θ``, with the straight-through gradient for ``θ``."""
    out: torch.Tensor = _Step.apply(z, theta, bandwidth)  # type: ignore[no-untyped-call]
    return out.sum(-1).mean()


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
