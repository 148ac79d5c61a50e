"""A norm's per-channel gain and bias, and TransformerLens' ``ln2.hook_normalized`` read from the norm's input.

TransformerLens' norms hook their normalised vector before the gain: ``blocks.L.ln2.hook_normalized`` is
``n = x / RMS(x)`` (LayerNorm: ``(x - mean) / σ``) of the norm's input ``x``, and the MLP reads ``y = g · n + β``.
anatomy computes ``n`` from ``x`` (:func:`normalized`: the norm's own epsilon, in float32 as the families' norms
compute it, given back in ``x``'s dtype), not from ``y``: where a gain is 0 (the real Gemma-3-270M, weight −1, in
17 of its 18 blocks) ``y`` has lost ``n``. ``anatomy sae`` hooks the pre-MLP norm's input (:func:`mlp_norm_module`)
and writes an SAE's output back through the gain (:meth:`NormGain.output`); ``circuit``'s frozen replacement model
computes the same ``n`` from the same input with its frozen denominator (engine/replacement.py). :func:`probe` reads
``(g, β)`` off any norm (Llama's ``weight``, Gemma's ``1 + weight``, LayerNorm's ``weight`` and ``bias``),
:func:`centred` whether it subtracts the mean; the replacement model probes its norms the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.models.sae.names import mlp_norm


def eps(module: torch.nn.Module) -> float:
    """A norm's epsilon (``eps``, Llama's ``variance_epsilon``; 1e-6 when it names none)."""
    return float(getattr(module, "eps", getattr(module, "variance_epsilon", 1e-6)))


def probe(module: torch.nn.Module, d: int, device: torch.device, dtype: torch.dtype
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(gain, bias)`` (float32 ``[d]``) of a norm, read by calling its forward on 0 and on ±1 (mean 0, RMS 1);
    no hook fires and nothing is left on the module."""
    v = torch.tensor([1.0, -1.0], dtype=torch.float32).repeat((d + 1) // 2)[:d].to(device)
    v = v - v.mean()
    v = v / v.pow(2).mean().sqrt()
    with torch.no_grad():
        beta = module.forward(torch.zeros(1, d, dtype=dtype, device=device)).float()[0]
        gain = (module.forward(v[None].to(dtype)).float()[0] - beta) / v * (1.0 + eps(module)) ** 0.5
    return gain, beta


def centred(module: torch.nn.Module, d: int, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether a norm subtracts the mean (LayerNorm) or not (RMSNorm): a constant input normalises to 0 in a
    LayerNorm, so its output is the bias, its output on 0 (where every gain is 0 the two agree whatever the norm:
    then ``torch.nn.LayerNorm`` says)."""
    if isinstance(module, torch.nn.LayerNorm):
        return True
    with torch.no_grad():
        zero = module.forward(torch.zeros(1, d, dtype=dtype, device=device)).float()
        ones = module.forward(torch.ones(1, d, dtype=dtype, device=device)).float()
    return bool(torch.allclose(ones, zero, rtol=0, atol=1e-6 * (1 + float(zero.abs().max()))))


def normalized(x: torch.Tensor, centre: bool, epsilon: float, scale: torch.Tensor | None = None) -> torch.Tensor:
    """TransformerLens' ``hook_normalized`` of a norm's input ``x [..., d]``: ``x / sqrt(mean(x²) + eps)``
    (``centre``: ``(x - mean) / sqrt(var + eps)``), in float32, given back in ``x``'s dtype. ``scale [..., 1]``:
    that denominator given (circuit's frozen one) instead of computed."""
    xf = x.float()
    if centre:
        xf = xf - xf.mean(-1, keepdim=True)
    if scale is None:  # as Llama's and Gemma's RMSNorm, torch's LayerNorm: times rsqrt
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + epsilon)).to(x.dtype)
    return (xf / scale).to(x.dtype)


@dataclass(frozen=True)
class NormGain:
    """A norm's ``gain [d]`` and ``beta [d]`` (float32): its output is ``gain * n + beta``, ``n`` its normalised
    vector (TransformerLens' ``hook_normalized``, :meth:`of` its input); ``centre``: a LayerNorm's mean is
    subtracted first; ``eps``: its epsilon."""

    gain: torch.Tensor
    beta: torch.Tensor
    centre: bool = False
    eps: float = 1e-6

    def of(self, x: torch.Tensor) -> torch.Tensor:
        """``n`` of the norm's input ``x [..., d]`` (:func:`normalized`), in ``x``'s dtype."""
        return normalized(x, self.centre, self.eps)

    def output(self, n: torch.Tensor) -> torch.Tensor:
        """The norm's output ``gain * n + beta`` of a normalised vector ``n [..., d]``, in ``n``'s dtype."""
        return (n.float() * self.gain.to(n.device) + self.beta.to(n.device)).to(n.dtype)


def mlp_norm_module(lm: LoadedModel, layer: int) -> torch.nn.Module:
    """The norm whose output block ``layer``'s MLP reads (models/sae/names.py ``mlp_norm``: UsageError where the
    MLP reads no norm's output): the input of ``ln2.hook_normalized``."""
    block = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer]
    module: torch.nn.Module = block.get_submodule(mlp_norm(lm.adapter, lm.name))
    return module


def mlp_norm_gain(lm: LoadedModel, layer: int) -> NormGain:
    """The gain, bias, centring and epsilon of block ``layer``'s pre-MLP norm (:func:`mlp_norm_module`), on the
    model's device. A gain of 0 is fine: ``n`` is read from the norm's input."""
    module = mlp_norm_module(lm, layer)
    param = next(lm.model.parameters())
    gain, beta = probe(module, lm.d_model, param.device, param.dtype)
    return NormGain(gain, beta, centred(module, lm.d_model, param.device, param.dtype), eps(module))
