"""Fitting a TopK sparse autoencoder (or transcoder) on activations that anatomy's own hooks collect, written in
EleutherAI sparsify's on-disk format (``cfg.json`` + ``sae.safetensors`` per hook point).

The recipe is sparsify's (``SparseCoder`` and its ``Trainer``, eai-sparsify 1.3): ``encoder`` a Linear
``d_in -> d_sae`` with zero bias, ``W_dec [d_sae, d_out]`` the encoder's weight cloned (an SAE) or zeros (a
transcoder), an SAE's rows kept at unit norm; at the first step ``b_dec`` the target's mean (an SAE subtracts it
from its input, a transcoder does not and its encoder bias starts at ``−mean(x) W_encᵀ``); ``pre =
relu(encoder(x − b_dec))``, the k largest kept, ``y = top_acts @ W_dec[top_idx] + b_dec``; the loss
is the fraction of variance unexplained ``Σ(y − target)² / Σ(target − mean)²``; Adam at ``2e-4 /
sqrt(d_sae / 2**14)`` (four times it for a transcoder, below); after every step of an SAE the decoder
gradient parallel to its rows is removed and the rows are set to unit norm again. Left out: sparsify's AuxK loss
on dead latents (the dead fraction is reported instead). Two changes (issue 62): a transcoder (TopK or
JumpReLU) trains on its input and target divided by their RMS, folded back into the written weights
(:func:`unit_scales`), at four times the learning rate (:func:`default_lr`): on SmolLM2's activations the TopK
fit then explains more held-out variance than sparsify 1.3's own default trainer (SignSGD, schedule-free) at the
same tokens, where plain Adam on the raw activations explained less.

The step's speed (:class:`TopKCoder`, and the cross-layer coder of engine/clt_fit.py): the k latents are chosen
by one dense matmul, and the backward writes the gradients of the chosen encoder and decoder rows alone, each as
one sparse × dense product, instead of a second dense matmul (:func:`sparse_topk`, one autograd Function with the
decoder's ``embedding_bag``); Adam runs fused (:func:`adam`); the steps run within
:func:`anatomy_cli.engine.heap.kept_pages` (no fresh pages each step); the fired latents come from the step's own
forward. The values and gradients are the dense TopK's (tested).

With eai-sparsify installed (the ``train`` extra), its own ``SparseCoder`` is the model trained (its forward,
its decoder-norm steps and ``save_to_disk``); without it, :class:`TopKCoder`, the same maths in a few lines.
Why not sparsify's Trainer: it loads the model itself through transformers (no GGUF) and computes activations as
it trains; here the activations come from anatomy's hooks, so any model anatomy opens works. The files are what
``SparseCoder.save_to_disk`` writes and ``SparseCoder.load_from_disk`` reads.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import torch

from anatomy_cli.declare import shared
from anatomy_cli.engine import jumprelu as ste  # the straight-through JumpReLU (a parameter is named jumprelu)
from anatomy_cli.engine.checkpoint import atomic_write
from anatomy_cli.engine.estimate import now
from anatomy_cli.engine.forwarding import forward
from anatomy_cli.engine.heap import kept_pages
from anatomy_cli.engine.sae import _hooks
from anatomy_cli.engine.sparse_topk import sparse_topk
from anatomy_cli.models.written import as_user_file

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


SKIPPED = 1
"""A window's first positions that never become training or held-out rows (and that the held-out splice leaves
as the model computes them): the first position's activations are SmolLM2's massive first-token activation (the
attention sink), 98% of block 11's MLP-output variance at 31,936 tokens, so a fit that kept them, and its unit
scales (:func:`unit_scales`), chased those rows (issue 62). The field's convention: SAELens leaves out special
tokens, circuit-tracer zeroes the transcoders at position 0 (``zero_bos``; anatomy's circuit too), Anthropic's
CLTs skip BOS."""


def rows(windows: Sequence[Sequence[int]]) -> int:
    """How many rows :func:`collect` gives for ``windows``: each window's tokens less its first
    (:data:`SKIPPED`)."""
    return sum(max(len(w) - SKIPPED, 0) for w in windows)


def epoch_batches(rows: int, batch: int) -> list[tuple[int, int]]:
    """Each epoch's batches as ``(start, stop)`` into its shuffled order of ``rows`` rows: ``batch`` rows each, the
    remainder last, but a remainder under :data:`shared.MIN_ROWS` (and under ``batch``) joins the batch before it
    (``batch + remainder`` rows). Why folded and not dropped (PyTorch's ``drop_last``): its rows still train every
    epoch (a dropped tail leaves up to 7 rows out of each epoch, and of the last epoch's fired count), and the step
    is no different from its neighbours but for a few more rows; a tail of 1 row, as a batch of its own, had an
    FVU of its error over 1e-30 (a loss of 1e30, whose gradient corrupted Adam's moments for the steps after). A
    remainder of 0 or of at least 8 rows: the batches as before."""
    starts = list(range(0, rows, batch))
    if len(starts) > 1 and rows - starts[-1] < min(shared.MIN_ROWS, batch):
        starts.pop()
    return list(zip(starts, [*starts[1:], rows]))


class _Collected(Exception):
    """Ends a forward of :func:`collect` once every point is read."""


def collect(lm: LoadedModel, windows: Sequence[Sequence[int]], points: Sequence[str], *, batch: int = 8,
            progress: Callable[[int, int], None] | None = None) -> list[torch.Tensor]:
    """The activations at each of ``points`` (hook points, or ``blocks.N.mlp.hook_in``) over every position of
    ``windows`` but each window's first (:data:`SKIPPED`), all in one pass: one float32 CPU tensor
    ``[rows, width]`` per point (:func:`rows`), rows in window order. Each
    point's tensor is made whole at its first batch and each batch's rows are copied into their place, so the
    peak is the activations themselves: the pieces kept and then joined, as before issue 62, doubled it (the
    freed pieces stay in the heap; at 31,936 tokens of SmolLM2's 60 hook points a peak RSS of 9.9 GB for 4.1
    GiB of activations). Each forward stops once every point has been read (the later blocks and the LM head
    do not run: a fit of SmolLM2's blocks 3 and 15 costs half the forwards' time)."""
    total = rows(windows)
    out: list[torch.Tensor | None] = [None] * len(points)
    filled = [0] * len(points)
    n_batch = [0]  # the windows in the forward now
    read: set[int] = set()  # the points read in the forward now

    def keep(i: int) -> Callable[[torch.Tensor], None]:
        def fn(t: torch.Tensor) -> None:
            flat = t.detach().reshape(n_batch[0], -1, t.shape[-1])[:, SKIPPED:].reshape(-1, t.shape[-1])
            if out[i] is None:
                out[i] = torch.empty(total, flat.shape[-1], dtype=torch.float32)
            out[i][filled[i]:filled[i] + flat.shape[0]].copy_(flat)  # type: ignore[index]
            filled[i] += flat.shape[0]
            read.add(i)
            if len(read) == len(points):
                raise _Collected
        return fn

    lm.model.eval()
    groups: list[list[Sequence[int]]] = []
    for w in windows:  # consecutive windows of one length share a batch (no padding)
        if groups and len(groups[-1]) < batch and len(groups[-1][0]) == len(w):
            groups[-1].append(w)
        else:
            groups.append([w])
    done = 0
    with torch.inference_mode(), _hooks(lm, [(p, keep(i)) for i, p in enumerate(points)]):
        for group in groups:
            n_batch[0] = len(group)
            read.clear()
            try:
                forward(lm, torch.tensor([list(w) for w in group], dtype=torch.long, device=lm.device))
            except _Collected:
                pass
            done += len(group)
            if progress is not None:
                progress(done, len(windows))
    missed = [p for p, n in zip(points, filled) if n != total]
    if missed:
        raise RuntimeError(f"collect: {missed} did not see every row once ({filled} of {total})")
    return [t for t in out if t is not None]


class TopKCoder(torch.nn.Module):
    """sparsify's ``SparseCoder`` with ``activation="topk"`` (see the module docstring). ``transcode``: the
    input is another site than the target (no ``b_dec`` subtracted; ``W_dec`` starts at zero)."""

    def __init__(self, d_in: int, d_sae: int, k: int, *, transcode: bool = False):
        super().__init__()
        self.k, self.transcode = k, transcode
        self.encoder = torch.nn.Linear(d_in, d_sae)
        self.encoder.bias.data.zero_()
        self.W_dec = torch.nn.Parameter(torch.zeros(d_sae, d_in) if transcode else self.encoder.weight.data.clone())
        self.b_dec = torch.nn.Parameter(torch.zeros(d_in))
        self.set_decoder_norm_to_unit_norm()

    def encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(top_acts, top_indices)``, each ``[rows, k]``."""
        pre = torch.relu(self.encoder(x if self.transcode else x - self.b_dec))
        return pre.topk(self.k, dim=-1, sorted=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction ``[rows, d_out]`` (the encoder's gradient through the k chosen rows only:
        :func:`sparse_topk`)."""
        return self.reconstruct(x)[0]

    def reconstruct(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the reconstruction ``[rows, d_out]``, ``top_acts``, ``top_indices`` ``[rows, k]``)."""
        decoded, acts, idx = sparse_topk(x if self.transcode else x - self.b_dec, self.encoder.weight,
                                         self.encoder.bias, self.W_dec, self.k)
        return decoded + self.b_dec, acts, idx

    @torch.no_grad()
    def set_decoder_norm_to_unit_norm(self) -> None:
        eps = torch.finfo(self.W_dec.dtype).eps
        self.W_dec.data /= self.W_dec.data.norm(dim=1, keepdim=True) + eps

    @torch.no_grad()
    def remove_gradient_parallel_to_decoder_directions(self) -> None:
        if self.W_dec.grad is not None:
            parallel = (self.W_dec.grad * self.W_dec.data).sum(-1, keepdim=True)
            self.W_dec.grad -= parallel * self.W_dec.data


class JumpReLUCoder(TopKCoder):
    """:class:`TopKCoder` with a JumpReLU in place of the TopK (engine/jumprelu.py): every latent with
    ``pre > θ`` is kept, ``θ = exp(log_threshold)`` trained with the straight-through estimator (started at the
    first step where each latent fires on ``target_l0 / d_sae`` of the first rows, and learning at its own pace),
    and the loss adds ``l0_coeff · (L0 / target_l0 − 1)²`` to the FVU. The same initialisation and decoder rule
    otherwise."""

    def __init__(self, d_in: int, d_sae: int, *, transcode: bool = False, bandwidth: float = 0.05,
                 l0_coeff: float = 1.0, target_l0: float = 32):
        super().__init__(d_in, d_sae, 1, transcode=transcode)
        self.target_l0 = target_l0  # the mean L0 the thresholds start at and the sparsity term holds
        self.bandwidth, self.l0_coeff = bandwidth, l0_coeff  # bandwidth: of the median threshold, once placed
        self.log_threshold = ste.log_threshold(d_sae)
        self.width: torch.Tensor  # the kernel's width: ``bandwidth`` until placed, then ``bandwidth · median θ``
        self.register_buffer("width", torch.tensor(float(bandwidth)))

    def encoder_input(self, x: torch.Tensor) -> torch.Tensor:
        """What the encoder reads: ``x`` (a transcoder) or ``x − b_dec`` (an SAE)."""
        return x if self.transcode else x - self.b_dec

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        """The pre-activations ``[rows, d_sae]`` (no ReLU: the threshold is above 0)."""
        out: torch.Tensor = self.encoder(self.encoder_input(x))
        return out

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return ste.jumprelu(self.pre(x), self.log_threshold.exp(), float(self.width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x) @ self.W_dec + self.b_dec

    def objective(self, x: torch.Tensor, target: torch.Tensor,
                  fired: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the loss, its FVU part): ``FVU + l0_coeff · (mean L0 / target_l0 − 1)²``; ``fired [d_sae]``: set
        where a latent is active on some row."""
        pre, theta, width = self.pre(x), self.log_threshold.exp(), float(self.width)
        feats = ste.jumprelu(pre, theta, width)
        if fired is not None:
            fired |= (feats.detach() != 0).any(0)
        part = fvu(feats @ self.W_dec + self.b_dec, target)
        return part + self.l0_coeff * ste.l0_penalty(ste.l0(pre, theta, width), self.target_l0), part

    @torch.no_grad()
    def place(self, x: torch.Tensor, opt: torch.optim.Optimizer) -> None:
        """The first step's thresholds from the rows ``x``, the kernel's width, and their pace in ``opt``
        (engine/jumprelu.py)."""
        self.log_threshold.data = ste.initial_log_threshold(self.pre(x), self.target_l0)
        self.width.fill_(ste.kernel_width(self.bandwidth, self.log_threshold))
        ste.pace(opt, self.encoder_input(x), self.log_threshold, self.bandwidth)


def make_coder(d_in: int, d_sae: int, k: int, *, transcode: bool, use_sparsify: bool | None = None,
               jumprelu: dict[str, float] | None = None) -> Any:
    """sparsify's own ``SparseCoder`` where eai-sparsify is installed (``pip install -e '.[train]'``) and
    ``use_sparsify`` is not False, else :class:`TopKCoder`; ``use_sparsify=True`` without it raises ImportError.
    ``jumprelu`` (its ``bandwidth`` and ``l0_coeff``): a :class:`JumpReLUCoder` instead, its target L0 ``k``."""
    if jumprelu is not None:
        return JumpReLUCoder(d_in, d_sae, transcode=transcode, target_l0=k, **jumprelu)
    if use_sparsify is not False:
        try:
            from sparsify import SparseCoder
            from sparsify import SparseCoderConfig
        except ImportError:
            if use_sparsify:
                raise
        else:
            return SparseCoder(d_in, SparseCoderConfig(num_latents=d_sae, k=k, transcode=transcode))
    return TopKCoder(d_in, d_sae, k, transcode=transcode)


def _transcodes(coder: Any) -> bool:
    return bool(coder.transcode if isinstance(coder, TopKCoder) else coder.cfg.transcode)


def objective(coder: Any, x: torch.Tensor, target: torch.Tensor,
              fired: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(the loss minimised, its FVU): the FVU alone for TopK; a JumpReLU coder's adds its L0 penalty.
    ``fired [d_sae]`` (bool): set where a latent is active on some row of ``x`` in this forward (the step's own
    choices, as sparsify's Trainer counts them: no second encoder pass)."""
    if isinstance(coder, JumpReLUCoder):
        return coder.objective(x, target, fired)
    if isinstance(coder, TopKCoder):
        y, acts, idx = coder.reconstruct(x)
    else:
        out = coder(x, target)
        y, acts, idx = out.sae_out, out.latent_acts, out.latent_indices
    if fired is not None:
        fired[idx[acts.detach() > 0]] = True
    part = fvu(y, target)
    return part, part


def fvu(y: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The fraction of variance unexplained, sparsify's loss (the numerator as one ``mse_loss``: one kernel each
    way, where ``(y − target).pow(2).sum()`` is three forward and three backward)."""
    residual = torch.nn.functional.mse_loss(y, target, reduction="sum")
    return residual / (target - target.mean(0)).pow(2).sum().clamp_min(1e-30)


def adam(params: Iterable[torch.nn.Parameter] | list[dict[str, Any]], lr: float) -> torch.optim.Adam:
    """Adam with its fused kernel (one pass over each parameter per step; torch has it on CPU and CUDA)."""
    return torch.optim.Adam(params, lr=lr, fused=True)


def optimiser(coder: Any, lr: float) -> torch.optim.Adam:
    """:func:`adam` over ``coder``'s parameters at ``lr``; a JumpReLU coder's ``log_threshold`` alone in a last
    group, whose learning rate :func:`anatomy_cli.engine.jumprelu.pace` sets once the thresholds are placed."""
    theta = getattr(coder, "log_threshold", None)
    if theta is None:
        return adam(coder.parameters(), lr)
    return adam([{"params": [p for p in coder.parameters() if p is not theta]}, {"params": [theta]}], lr)


def default_lr(d_sae: int, *, scaled: bool = False, cross_layer: bool = False) -> float:
    """sparsify's default learning rate for ``d_sae`` latents (Adam's, ``2e-4 / sqrt(d_sae / 2**14)``); ``scaled``
    (a per-layer transcoder, trained at unit scale: :func:`unit_scales`) four times it: on SmolLM2's blocks 3 and 15
    (1,024 latents, k 16) the held-out FVE went 0.30/0.31 → 0.35/0.36 on 7,936 tokens and 0.41/0.45 → 0.43/0.47 on
    32,000 (docs/commands/sae.md). ``cross_layer`` (a CLT, ``engine/clt_fit.py``, unit scale too) sparsify's rate
    itself: at four times it a 30-block TopK CLT on SmolLM2 (31,936 tokens, k 25, 492 steps) diverged (summed FVU
    1.010 → 1.303), at this rate it trains (1.010 → 0.226, held-out FVE mean 0.627; docs/commands/sae.md)."""
    return 2e-4 / math.sqrt(d_sae / 2**14) * (4 if scaled and not cross_layer else 1)


def unit_scales(coder: Any, x: torch.Tensor, target: torch.Tensor) -> tuple[float, float]:
    """The numbers a transcoder's input and target are divided by while it trains (the typical row's root mean square
    per coordinate, :func:`typical_rms`, so both train at unit scale; TopK or JumpReLU), ``(1, 1)`` for an SAE. Why: a
    transcoder's decoder starts at zero and Adam moves each weight by about the learning rate per step, so how far it
    gets depends on the activations' units; SmolLM2's MLP inputs have an RMS of 0.10-0.15 and its outputs 0.8-1.5, and
    at sparsify's learning rate 124 steps left block 15's held-out FVE at 0.23 where scaled it reaches 0.31 (0.37
    against 0.45 on 32,000 tokens; docs/commands/sae.md). :func:`fold_scales` puts the units back."""
    if not _transcodes(coder):
        return 1.0, 1.0
    return float(typical_rms(x)), float(typical_rms(target))


def typical_rms(t: torch.Tensor) -> torch.Tensor:
    """The median (torch's: the lower middle one of an even count) over the rows of ``t`` (``[rows, d]``) of each
    row's root mean square (at least 1e-12): the unit a transcoder trains in (:func:`unit_scales`,
    ``engine/clt_fit.py``'s per block). The median, not the RMS of every entry: a few massive rows (SmolLM2's
    attention sink, which also forms after a window's first position: at block 11 twenty rows of 31,500 with MLP
    outputs of norm up to 29,000 against a median of 30, 99.6% of the variance) set the whole RMS, shrank every other
    target 18-fold at unit scale, and at 4x the rate 67% of the features died (held-out FVE 0.23; at this unit 0.44,
    7% dead, sparsify 0.39; docs/commands/sae.md)."""
    typical: torch.Tensor = t.norm(dim=-1).median() / t.shape[-1] ** 0.5
    return typical.clamp_min(1e-12)


@torch.no_grad()
def fold_scales(coder: Any, sx: float, sy: float) -> None:
    """A coder trained on ``x / sx`` and ``target / sy`` made one for ``x`` and ``target``: the encoder's weight over
    ``sx``, the decoder and ``b_dec`` times ``sy``. Then ``(W / sx) x + b = W (x / sx) + b``: the pre-activations on
    the raw input are the trained ones, so the same TopK, and a JumpReLU's thresholds (and its kernel's width)
    stay as trained, ``b_enc`` too; the reconstruction is the trained one times ``sy``."""
    if (sx, sy) != (1.0, 1.0):
        coder.encoder.weight.data /= sx
        coder.W_dec.data *= sy
        coder.b_dec.data *= sy


def train(x: torch.Tensor, target: torch.Tensor, coder: Any, *, epochs: int, batch: int, lr: float,
          seed: int = 0, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Adam on :func:`objective` (the FVU; a JumpReLU coder's adds its L0 penalty) over shuffled batches of the
    rows of ``x`` (``[rows, d_in]``) and ``target``, ``epochs`` times (each epoch's batches: :func:`epoch_batches`,
    a remainder under :data:`shared.MIN_ROWS` rows folded into the batch before); a transcoder on both scaled to unit
    RMS (:func:`unit_scales`; a JumpReLU's thresholds placed from the scaled rows), folded back into its weights at
    the end. Returns ``{"steps", "fvu" (per step), "fired" (a bool per latent: fired at least once in the last
    epoch)}``."""
    g = torch.Generator().manual_seed(seed)
    opt = optimiser(coder, lr)
    transcode = _transcodes(coder)
    sx, sy = unit_scales(coder, x, target)
    with torch.no_grad():  # sparsify's Trainer at its first step: pre-activations centred, b_dec the target's mean
        # (a JumpReLU's thresholds placed from the rows, and their pace: engine/jumprelu.py)
        if transcode:
            coder.encoder.bias.data = -(x.mean(0) / sx) @ coder.encoder.weight.data.T
        coder.b_dec.data = target.mean(0) / sy
        if isinstance(coder, JumpReLUCoder):
            coder.place(x[:ste.INIT_ROWS] / sx, opt)
    bounds = epoch_batches(len(x), batch)
    steps = epochs * len(bounds)
    curve: list[float] = []
    fired = torch.zeros(coder.W_dec.shape[0], dtype=torch.bool)
    with kept_pages():  # the step's freed memory serves the next step (no fresh pages: engine/heap.py)
        for epoch in range(epochs):
            if epoch == epochs - 1:
                fired.zero_()
            order = torch.randperm(len(x), generator=g)
            for start, stop in bounds:
                idx = order[start:stop]
                xb, yb = x.index_select(0, idx), target.index_select(0, idx)  # index_select: 1/3 of x[idx]'s time
                if sx != 1.0 or sy != 1.0:
                    xb, yb = xb.div_(sx), yb.div_(sy)
                loss, part = objective(coder, xb, yb, fired)
                loss.backward()  # type: ignore[no-untyped-call]
                if not transcode:  # as sparsify: a transcoder's decoder rows are free
                    coder.remove_gradient_parallel_to_decoder_directions()
                opt.step()
                opt.zero_grad()
                if not transcode:
                    coder.set_decoder_norm_to_unit_norm()
                curve.append(float(part.detach()))
                if progress is not None:
                    progress(len(curve), steps)
    fold_scales(coder, sx, sy)
    return {"steps": len(curve), "fvu": curve, "fired": fired}


def probe_step_seconds(d_in: int, d_sae: int, k: int, *, batch: int, transcode: bool, steps: int = 4,
                       jumprelu: dict[str, float] | None = None) -> float:
    """The seconds one training step of :func:`train` takes here now: a coder of this size (made as the fit
    makes it) trained ``steps`` steps on random rows; the median of the steps after the first (which allocates
    Adam's state). The caller's global RNG is left alone."""

    stamps: list[float] = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        coder = make_coder(d_in, d_sae, k, transcode=transcode, jumprelu=jumprelu)
        x = torch.randn(steps * batch, d_in)
        start = now()
        train(x, x, coder, epochs=1, batch=batch, lr=default_lr(d_sae), progress=lambda i, n: stamps.append(now()))
    gaps = [b - a for a, b in zip([start, *stamps], stamps)]
    return statistics.median(gaps[1:] or gaps)


def save_sparsify(coder: Any, folder: Path, *, model_name: str = "", context_size: int | None = None,
                  hook_name: str = "", skipped_positions: int = 0) -> None:
    """``folder/cfg.json`` and ``folder/sae.safetensors`` as sparsify's ``save_to_disk`` writes them (sparsify's
    own coder: its ``save_to_disk``), the config with ``model_name``, ``context_size`` (the windows' length it
    trained on), ``hook_name`` (sparsify's hook point, which sparsify keeps in the folder's name only, lost when
    the folder is renamed) and ``skipped_positions`` (each window's first positions the rows left out:
    :data:`SKIPPED`; ``sae`` measures its health without them) added where given (keys sparsify's
    ``load_from_disk`` drops: ``from_dict(..., drop_extra_fields=True)``; anatomy's reader takes them)."""
    extra = {**({"model_name": model_name} if model_name else {}),
             **({"context_size": int(context_size)} if context_size else {}),
             **({"hook_name": hook_name} if hook_name else {}),
             **({"skipped_positions": int(skipped_positions)} if skipped_positions else {})}
    if isinstance(coder, JumpReLUCoder):
        raise TypeError("a JumpReLU coder is written by save_saelens")
    if not isinstance(coder, TopKCoder):
        coder.save_to_disk(folder)
        as_user_file(folder / "sae.safetensors")
        if extra:
            cfg = json.loads((folder / "cfg.json").read_text(encoding="utf-8"))
            (folder / "cfg.json").write_text(json.dumps({**cfg, **extra}), encoding="utf-8")
        return
    folder.mkdir(parents=True, exist_ok=True)
    d_sae, d_in = coder.encoder.weight.shape
    cfg = {"activation": "topk", "expansion_factor": max(1, d_sae // d_in), "normalize_decoder": True,
           "num_latents": int(d_sae), "k": coder.k, "multi_topk": False, "skip_connection": False,
           "transcode": coder.transcode, "d_in": int(d_in), **extra}
    tensors = {"encoder.weight": coder.encoder.weight, "encoder.bias": coder.encoder.bias, "W_dec": coder.W_dec,
               "b_dec": coder.b_dec}
    _write_weights(tensors, folder / "sae.safetensors")
    (folder / "cfg.json").write_text(json.dumps(cfg), encoding="utf-8")


def save_saelens(coder: JumpReLUCoder, folder: Path, *, hook: str, hook_out: str, model_name: str,
                 context_size: int | None = None, skipped_positions: int = 0) -> None:
    """A JumpReLU coder in SAELens' format: ``folder/cfg.json`` (``architecture: jumprelu``, ``hook_name``, a
    transcoder's ``hook_name_out``, ``apply_b_dec_to_input`` for an SAE, ``context_size`` the windows' length it
    trained on where given, ``skipped_positions`` as :func:`save_sparsify`'s) and ``folder/sae_weights.safetensors``
    (``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec``, ``b_dec``, ``threshold``)."""
    folder.mkdir(parents=True, exist_ok=True)
    d_sae, d_in = coder.encoder.weight.shape
    cfg: dict[str, object] = {"architecture": "jumprelu", "d_in": int(d_in), "d_sae": int(d_sae), "dtype": "float32",
                           "device": "cpu", "apply_b_dec_to_input": not coder.transcode,
                           "normalize_activations": "none", "hook_name": hook, "model_name": model_name}
    if context_size:
        cfg["context_size"] = int(context_size)
    if skipped_positions:
        cfg["skipped_positions"] = int(skipped_positions)
    if coder.transcode:
        cfg.update(hook_name_out=hook_out, d_out=int(coder.W_dec.shape[1]))
    tensors = {"W_enc": coder.encoder.weight.T, "b_enc": coder.encoder.bias, "W_dec": coder.W_dec,
               "b_dec": coder.b_dec, "threshold": coder.log_threshold.exp()}
    _write_weights(tensors, folder / "sae_weights.safetensors")
    (folder / "cfg.json").write_text(json.dumps(cfg), encoding="utf-8")


def _write_weights(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``tensors`` as float32 safetensors at ``path``, written beside it and renamed."""
    from safetensors.torch import save_file


    def write(tmp: Path) -> None:
        save_file({k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
        as_user_file(tmp)

    atomic_write(path, write)
