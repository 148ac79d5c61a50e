"""A norm's per-channel gain and bias, and TransformerLens' ``ln2.hook_normalized`` read from the MLP's input.

TransformerLens' norms hook their normalised vector before the gain: ``blocks.L.ln2.hook_normalized`` is
``n = x / RMS(x)`` (LayerNorm: ``(x - mean) / σ``) and the MLP reads ``y = g · n + β``. anatomy reads ``y`` (the
MLP's input) and divides the gain out, ``n = (y - β) / g`` (models/sae/names.py ``before_gain`` names the hooks):
``anatomy sae`` applies :meth:`NormGain.normalized` to the vector, ``circuit`` folds the same ``(g, β)`` into a
transcoder's encoder (engine/transcoder.py ``read_norm_output``). :func:`probe` reads ``(g, β)`` off any norm
(Llama's ``weight``, Gemma's ``1 + weight``, LayerNorm's ``weight`` and ``bias``); the frozen replacement
model (engine/replacement.py) probes its norms the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import UsageError
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


@dataclass(frozen=True)
class NormGain:
    """A norm's ``gain [d]`` and ``beta [d]`` (float32): its output is ``gain * n + beta``, ``n`` its normalised
    vector (TransformerLens' ``hook_normalized``)."""

    gain: torch.Tensor
    beta: torch.Tensor

    def normalized(self, y: torch.Tensor) -> torch.Tensor:
        """``n = (y - beta) / gain`` of the norm's output ``y [..., d]``, in ``y``'s dtype."""
        return ((y.float() - self.beta.to(y.device)) / self.gain.to(y.device)).to(y.dtype)

    def output(self, n: torch.Tensor) -> torch.Tensor:
        """The norm's output ``gain * n + beta`` of a normalised vector ``n [..., d]``, in ``n``'s dtype."""
        return (n.float() * self.gain.to(n.device) + self.beta.to(n.device)).to(n.dtype)


def mlp_norm_gain(lm: LoadedModel, layer: int) -> NormGain:
    """The gain and bias of the norm whose output block ``layer``'s MLP reads (models/sae/names.py ``mlp_norm``),
    on ``lm.device``. UsageError where the MLP reads no norm's output, or where a gain is 0 (the MLP's input
    loses ``n`` there)."""
    block = lm.model.base_model.get_submodule(lm.adapter.blocks)[layer]
    param = next(lm.model.parameters())
    gain, beta = probe(block.get_submodule(mlp_norm(lm.adapter, lm.name)), lm.d_model, param.device, param.dtype)
    zero = (gain == 0).nonzero().flatten().tolist()
    if zero:
        shown = ", ".join(str(c) for c in zero[:8]) + (", ..." if len(zero) > 8 else "")
        raise UsageError(f"ln2.hook_normalized is block {layer}'s MLP norm's vector before its gain, and that gain "
                         f"is 0 in {len(zero)} channel(s) ({shown}): the MLP's input does not give it there")
    return NormGain(gain, beta)
