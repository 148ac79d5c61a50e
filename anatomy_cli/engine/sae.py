"""A sparse autoencoder (or transcoder) on a loaded model: encode, decode, and the reconstruction spliced in.

:class:`Dictionary` holds an :class:`~anatomy_cli.models.sae.read.SAEFile`'s tensors in its dtype and computes
what the library that wrote it computes (SAELens' ``encode``/``decode``, sparsify's, Gemma Scope's JumpReLU):

* input: ``x`` normalized (``constant_norm_rescale``: scaled to norm ``sqrt(d_in)``; ``layer_norm``: centred
  and divided by its standard deviation), minus ``b_dec`` when ``apply_b_dec_to_input``;
* pre-activation ``h = x W_enc + b_enc``; features: standard ``relu(h)``, JumpReLU ``relu(h) * (h >
  threshold)``, TopK the ``k`` largest ``h`` (ties: torch.topk's choice), through a ReLU, the rest 0;
* reconstruction ``f W_dec + b_dec`` (plus ``x W_skip^T`` with a skip connection, on the raw ``x``), the
  normalization undone (not for a transcoder, as SAELens); TopK's ``rescale_acts_by_decoder_norm``: ``h``
  times ``‖W_dec[i]‖`` before the top k, ``f`` divided by it before decoding.

:func:`splice_run` runs one prompt three times: unmodified, with the reconstruction in place of the
activation at the SAE's output site, and with the reconstruction plus the error term ``x - x_hat`` (which
gives the unmodified logits back, up to float rounding). At a hook of TransformerLens' ``ln2.hook_normalized``
the SAE reads (and an SAE there writes) the pre-MLP norm's vector before its gain, ``x / RMS(x)`` of the norm's
input ``x`` (a gain of 0 included; :func:`site_norms`, engine/norm_gain.py), and writes back ``g · n + β``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from anatomy_cli.engine.forwarding import forward
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.hooks import HookFn
from anatomy_cli.engine.hooks import attach_modules
from anatomy_cli.engine.lens import unembed
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.model import Side
from anatomy_cli.engine.norm_gain import NormGain
from anatomy_cli.engine.norm_gain import mlp_norm_gain
from anatomy_cli.engine.norm_gain import mlp_norm_module
from anatomy_cli.engine.norm_gain import probe
from anatomy_cli.engine.replacement import mlp_module
from anatomy_cli.engine.steering import SteeringVector
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.sae import names
from anatomy_cli.models.sae.read import SAEFile
from anatomy_cli.models.sites import WRITE_SITES
from anatomy_cli.models.sites import parse_point

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16}


class Dictionary:
    """An SAE's tensors on ``device``, in the dtype its config names (float32 unless it says otherwise)."""

    def __init__(self, sae: SAEFile, device: torch.device | str = "cpu"):
        self.file = sae
        self.dtype = _DTYPES.get(sae.dtype.replace("torch.", ""), torch.float32)

        def t(a: object) -> torch.Tensor:
            return torch.as_tensor(a).to(device=device, dtype=self.dtype)

        def maybe(a: object) -> torch.Tensor | None:
            return None if a is None else t(a)

        self.W_enc, self.b_enc, self.W_dec, self.b_dec = t(sae.W_enc), t(sae.b_enc), t(sae.W_dec), t(sae.b_dec)
        self.threshold, self.W_skip = maybe(sae.threshold), maybe(sae.W_skip)

    def _norm_in(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        how = self.file.normalize_activations
        if how == "constant_norm_rescale":
            scale = math.sqrt(x.shape[-1]) / x.norm(dim=-1, keepdim=True)
            return x * scale, scale, None
        if how == "layer_norm":
            mu = x.mean(dim=-1, keepdim=True)
            std = (x - mu).std(dim=-1, keepdim=True)
            return (x - mu) / (std + 1e-5), std, mu
        return x, None, None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Feature activations ``[..., d_sae]`` of ``x [..., d_in]``."""
        x, _, _ = self._norm_in(x.to(self.dtype))
        if self.file.subtract_b_dec:
            x = x - self.b_dec
        h = x @ self.W_enc + self.b_enc
        if self.file.rescale_by_decoder_norm:
            h = h * self.W_dec.norm(dim=-1)
        arch = self.file.architecture
        if arch == "standard":
            return torch.relu(h)
        if arch == "jumprelu":
            assert self.threshold is not None  # the loader refuses a JumpReLU file without one
            return torch.relu(h) * (h > self.threshold)
        assert self.file.k is not None
        top = h.topk(self.file.k, dim=-1)
        return torch.zeros_like(h).scatter(-1, top.indices, torch.relu(top.values))

    def decode(self, f: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction ``[..., d_out]`` from features ``f`` of input ``x [..., d_in]`` (the
        normalization statistics and a transcoder's skip read ``x``)."""
        x = x.to(self.dtype)
        if self.file.rescale_by_decoder_norm:
            f = f / self.W_dec.norm(dim=-1)
        out = f @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            out = out + x @ self.W_skip.T
        if self.file.transcoder:  # SAELens' transcoders leave the output unnormalized
            return out
        _, scale, mu = self._norm_in(x)
        how = self.file.normalize_activations
        if how == "constant_norm_rescale":
            assert scale is not None
            out = out / scale
        elif how == "layer_norm":
            assert scale is not None and mu is not None
            out = out * scale + mu
        return out


@dataclass(frozen=True)
class SpliceRun:
    """One prompt's run with an SAE, float32 on ``lm.device``: ``x [pos, d_in]`` the SAE's input,
    ``target [pos, d_out]`` what it reconstructs (``x`` unless a transcoder), ``features [pos, d_sae]``,
    ``recon [pos, d_out]`` (at ``ln2.hook_normalized``: the vectors before the norm's gain, :func:`site_norms`;
    the splice writes ``recon`` back through the gain); ``logits``/``logits_spliced``/``logits_with_error``
    ``[pos, vocab]``: the unmodified run, the reconstruction in place of ``target``, and the reconstruction plus
    ``target - recon``."""

    x: torch.Tensor
    target: torch.Tensor
    features: torch.Tensor
    recon: torch.Tensor
    logits: torch.Tensor
    logits_spliced: torch.Tensor
    logits_with_error: torch.Tensor


def _module_point(lm: LoadedModel, point: str) -> tuple[torch.nn.Module, Side]:
    """``(module, side)`` of a hook point; the MLP's input (``blocks.N.mlp.hook_in``, the input of the block's
    feed-forward module: engine/hooks.py ``mlp_of``, circuit's transcoder input too) is one wherever the family's
    MLP input can be read, else refused (engine/replacement.py ``mlp_module`` says why)."""
    if point not in lm.points and sites.is_point(point, sites.Point.mlp_in):
        return mlp_module(lm, names.layer_of(point)), "input"  # raises: OPT's MLP sees [batch * pos, d]
    module, side = lm.points[point]
    return module, "input" if side == "input" else "output"


Where = tuple[torch.nn.Module, Side]


@contextmanager
def _hooks(lm: LoadedModel, pairs: list[tuple[str | Where, HookFn]]) -> Iterator[None]:
    """Hooks at hook points (or at ``(module, side)``), removed on exit."""
    with attach_modules((*(_module_point(lm, p) if isinstance(p, str) else p), fn) for p, fn in pairs):
        yield


def site_norms(lm: LoadedModel, sae: SAEFile) -> tuple[NormGain | None, NormGain | None]:
    """The pre-MLP norm whose normalised vector the SAE reads and writes (a hook of ``ln2.hook_normalized``,
    models/sae/names.py ``before_gain``: ``n`` computed from the norm's input, engine/norm_gain.py, as ``circuit``'s
    replacement model reads it; written back as the MLP's input ``g · n + β``); None for every other hook."""
    def norm(hook: str, point: str) -> NormGain | None:
        return mlp_norm_gain(lm, names.layer_of(point)) if names.before_gain(hook) else None

    return norm(sae.hook_name, sae.site), norm(sae.hook_name_out, sae.site_out)


def _reading(lm: LoadedModel, point: str, norm: NormGain | None) -> str | Where:
    """Where the SAE's vector at ``point`` is read: the point, or (``norm``) the pre-MLP norm's input."""
    return point if norm is None else (mlp_norm_module(lm, names.layer_of(point)), "input")


def readings(lm: LoadedModel, sae: SAEFile, norms: tuple[NormGain | None, NormGain | None] | None = None
             ) -> tuple[str | Where, str | Where]:
    """Where a splice of ``sae`` reads its input and its target in the unmodified forward (:func:`_reading` of its
    two sites; ``norms``: :func:`site_norms`, found here when not given): what a :class:`CleanRun` shared by
    several splices of one prompt must read."""
    norm_in, norm_out = site_norms(lm, sae) if norms is None else norms
    return _reading(lm, sae.site, norm_in), _reading(lm, sae.site_out, norm_out)


@dataclass(frozen=True)
class CleanRun:
    """One prompt's unmodified forward, for the splices of several dictionaries into it (fit-sae's held-out check
    of every block: one clean forward, not one per block): ``ids``, the logits ``[pos, vocab]`` (float32) and
    the vectors read at each of its readings (a hook point, or a module's side: :func:`_reading`),
    ``[pos, width]``."""

    ids: tuple[int, ...]
    logits: torch.Tensor
    seen: dict[str | Where, torch.Tensor]


def _logits_with(lm: LoadedModel, ids: Sequence[int], pairs: list[tuple[str | Where, HookFn]]) -> torch.Tensor:
    """The float32 logits ``[pos, vocab]`` of one forward of ``ids`` with the hooks ``pairs``."""
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    with torch.inference_mode(), _hooks(lm, pairs):
        hidden = forward(lm, input_ids)
        return head_logits(lm, hidden[0]).float()


def clean_run(lm: LoadedModel, ids: Sequence[int], readings: Iterable[str | Where]) -> CleanRun:
    """One unmodified forward of ``ids`` reading every one of ``readings`` (hook points, or ``(module, side)``)."""
    seen: dict[str | Where, torch.Tensor] = {}

    def keep(reading: str | Where) -> HookFn:
        def fn(t: torch.Tensor) -> None:
            seen[reading] = t.detach()[0].clone()
        return fn

    lm.model.eval()
    logits = _logits_with(lm, ids, [(r, keep(r)) for r in dict.fromkeys(readings)])
    return CleanRun(tuple(ids), logits, seen)


def splice_run(lm: LoadedModel, ids: list[int], sae: Dictionary, *, skip: int = 0,
               clean: CleanRun | None = None) -> SpliceRun:
    """Three forwards of one prompt (``ids``) with ``sae`` at its sites; see :class:`SpliceRun`. ``skip``: the
    first positions keep the model's own activation in both splices and are left out of every returned tensor
    (fit-sae's held-out check: ``engine.sae_fit.SKIPPED``). ``clean``: the unmodified forward already run
    (:func:`clean_run` of these ``ids``, reading at least the SAE's two sites: then two forwards here, the same
    figures); where it lacks one, the forward is run here."""
    f = sae.file
    lm.model.eval()
    norm_in, norm_out = site_norms(lm, f)
    reads = readings(lm, f, (norm_in, norm_out))
    if clean is None or clean.ids != tuple(ids) or any(r not in clean.seen for r in reads):
        clean = clean_run(lm, ids, reads)
    logits, seen_in, seen_out = clean.logits, clean.seen[reads[0]], clean.seen[reads[1]]
    x = (seen_in if norm_in is None else norm_in.of(seen_in)).to(sae.dtype)
    target = seen_out if norm_out is None else norm_out.of(seen_out)
    with torch.inference_mode():
        features = sae.encode(x)
        recon = sae.decode(features, x)
    written = recon if norm_out is None else norm_out.output(recon)  # what the model reads at site_out

    def replace(with_error: bool) -> HookFn:
        def fn(t: torch.Tensor) -> torch.Tensor:
            new = written.to(t.dtype)[None]
            new = torch.cat([t[:, :skip], new[:, skip:]], 1) if skip else new
            return new + (t - new) if with_error else new
        return fn

    spliced = _logits_with(lm, ids, [(f.site_out, replace(False))])
    with_error = _logits_with(lm, ids, [(f.site_out, replace(True))])
    return SpliceRun(*(v[skip:].float() for v in (x, target, features, recon, logits, spliced, with_error)))


def decoder_lens(lm: LoadedModel, sae: Dictionary, feature_ids: list[int]) -> torch.Tensor:
    """The logit lens of decoder rows: ``W_dec[i]`` through the final norm and the LM head, without soft-capping,
    ``[len(feature_ids), vocab]`` (a direction's token ranking: the norm's scale is one number per row)."""
    rows = sae.W_dec[torch.tensor(feature_ids, dtype=torch.long, device=sae.W_dec.device)]
    return unembed(lm, rows.to(lm.device), softcap=False).float()


def feature_vector(sae: SAEFile, feature: int) -> SteeringVector:
    """The steering vector of one feature: its decoder row ``W_dec[feature]`` (float32, in the SAE's output
    units) at the site the SAE writes to (``site_out``: a transcoder's output), for ``generate
    --steer-feature``. Raises UsageError for an id out of range or a site steering has no hook for
    (attn.hook_z, an MLP's input)."""
    if not 0 <= feature < sae.d_sae:
        raise UsageError(f"--steer-feature {feature} is out of range: the SAE has {sae.d_sae} features")
    point = parse_point(sae.site_out, WRITE_SITES)
    if point is None:
        raise UsageError(f"--steer-feature: the SAE writes to {sae.site_out} ({sae.hook_name_out}); steering "
                         f"adds to blocks.N.hook_{{{','.join(s.value for s in WRITE_SITES)}}}")
    row = torch.as_tensor(sae.W_dec[feature]).to(torch.float32).clone()
    meta = {"source": "sae", "sae": str(sae.path), "feature": feature, "model": {}}
    return SteeringVector({point[0]: row}, site=point[1].value, meta=meta)


class _Read(Exception):
    """Ends a forward where the dictionary's input has been read: the blocks after it do not run."""


def window_features(lm: LoadedModel, ids: torch.Tensor, sae: Dictionary) -> torch.Tensor:
    """The features ``[batch, T, d_sae]`` (float32, on ``lm.device``) of windows ``ids [batch, T]``: a forward
    that stops where the SAE's input is read at its site (before the pre-MLP norm's gain where :func:`site_norms`
    says so: the blocks after the dictionary's, the final norm and the LM head never run), encoded as
    :func:`splice_run` encodes one prompt."""
    seen: dict[str, torch.Tensor] = {}

    def keep(t: torch.Tensor) -> None:
        seen["in"] = t.detach()
        raise _Read

    lm.model.eval()
    norm_in, _ = site_norms(lm, sae.file)
    with torch.inference_mode(), _hooks(lm, [(_reading(lm, sae.file.site, norm_in), keep)]):
        try:
            forward(lm, ids.to(lm.device))
        except _Read:
            pass
        x = seen["in"] if norm_in is None else norm_in.of(seen["in"])
        return sae.encode(x.reshape(ids.shape[0], ids.shape[1], -1).to(sae.dtype)).float()


def logit_effects(lm: LoadedModel, rows: torch.Tensor) -> torch.Tensor:
    """Decoder directions ``rows [k, d_model]`` read as Neuronpedia reads them, ``[k, vocab]`` float32:
    ``W_U (g ⊙ d)``, the final norm's gain ``g`` folded in and its normalization (the scale, LayerNorm's centring)
    and bias left out (TransformerLens' ``fold_ln``), the LM head's bias left out, and each row's mean over the
    vocabulary subtracted (``center_unembed``). A model without a final norm: ``g = 1``."""
    rows = rows.to(lm.device, torch.float32)
    point = lm.points.get(sites.name(None, sites.Whole.ln_final))
    if point is not None:
        gain, _ = probe(point[0], rows.shape[-1], lm.device, lm.dtype)
        rows = rows * gain
    with torch.inference_mode():
        both = unembed(lm, torch.cat([rows, torch.zeros_like(rows[:1])]).to(lm.dtype), softcap=False,
                       normed=True).float()
    effects = both[:-1] - both[-1:]  # the head's bias (a constant per token) left out
    return effects - effects.mean(dim=-1, keepdim=True)


__all__ = ["CleanRun", "Dictionary", "SpliceRun", "clean_run", "decoder_lens", "feature_vector", "logit_effects",
           "readings", "site_norms", "splice_run", "window_features"]
