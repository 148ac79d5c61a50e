"""Fitting a cross-layer transcoder (CLT) on activations that anatomy's own hooks collect, written in circuit-tracer
0.5.0's ``cross_layer_transcoder`` layout (what its ``load_clt`` and ``anatomy circuit --transcoders`` read).

The model: for every block l of L, an encoder reading block l's MLP input ``x_l`` (``W_enc_l [F, d]``, ``b_enc_l``),
``pre_l = relu(x_l W_enc_lᵀ + b_enc_l)``, the k largest kept per row (TopK, k per block); decoders from block l to
every block m ≥ l (``W_dec_l [F, L − l, d]``, slice ``m − l``), and ``b_dec_m``: block m's reconstruction of its MLP
output is ``y_m = Σ_{l ≤ m} a_l W_dec_l[:, m − l] + b_dec_m``. The loss is the sum over blocks of each block's
fraction of variance unexplained (sparsify's loss, :func:`anatomy_cli.engine.sae_fit.fvu`), so blocks of any scale
weigh alike. The initialisation and the optimiser are the per-layer transcoders' (engine/sae_fit.py, sparsify's
recipe): encoder rows as ``torch.nn.Linear``'s, decoders zero, ``b_dec_m`` the target's mean and
``b_enc_l = −mean(x_l) W_enc_lᵀ`` at the first step, Adam (the task's rate: ``sae_fit.default_lr``), decoders free (no
unit norm: a transcoder's). Dead features: as the per-layer fit, those that never fired in the last epoch are counted.

A CLT (TopK or JumpReLU) trains at unit scale, as the per-layer transcoders do (``sae_fit.unit_scales``), per
block: encoder l reads ``x_l / s_x[l]`` and the reconstructions of block m are fitted to ``y_m / s_y[m]`` (``s`` the
typical RMS of the block's training rows, :func:`unit_scales`); :func:`fold_scales` puts the units back at the end
(``W_enc_l / s_x[l]``, ``W_dec_l[:, m − l] · s_y[m]``, ``b_dec_m · s_y[m]``; ``b_enc`` and so the pre-activations,
the TopK, the thresholds chosen after and a JumpReLU CLT's trained thresholds, unchanged).

Written with per-feature **thresholds** (circuit-tracer 0.5.0 loads ReLU and JumpReLU CLTs only, no TopK): feature
f of block l gets ``threshold_l[f]`` such that the JumpReLU ``pre · (pre > θ)`` fires on exactly as many training
rows as the TopK did (:func:`thresholds`: θ halfway between the n-th and (n+1)-th largest pre-activation of the
feature over the training rows, n its TopK firing count; ≥ 0). The JumpReLU keeps each feature's TopK firing rate,
so the mean L0 per block is k on the training rows, but not TopK's exactly-k per token: a token may have more or
fewer active features, and a feature fires wherever its pre-activation clears its own threshold whatever the
other features do. The fit reports both readings on the held-out window.

``jumprelu`` (``--activation jumprelu``): every block's features are JumpReLUs ``pre · (pre > θ_l)`` with
thresholds trained by the straight-through estimator (engine/jumprelu.py, ``log θ`` at its own pace), the loss
adds ``l0_coeff`` times the sum over blocks of ``(L0_l / k − 1)²`` (each block's mean L0 held near k), a
feature idle for ``jumprelu.REPLACE_EVERY`` steps has its threshold placed again from the batch
(:meth:`CrossLayerCoder.replace_idle`), and the thresholds written are the trained ones.

The spliced CE/KL (:func:`spliced_logits`): every block's MLP output replaced by the written CLT's reconstruction
at once, the features read from the spliced forward's own MLP inputs (closed loop, as the replacement model runs).

Resume: :func:`train` hands a checkpoint (coder, Adam's state, the curve, the fired flags, the scales) to its caller
every ``every`` steps and after the last, and goes on from one; since each epoch's shuffle is drawn from
``seed + epoch`` alone, a resumed fit is the uninterrupted one, bit for bit (the task writes and checks the file).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import torch

from anatomy_cli.engine import jumprelu as ste  # the straight-through JumpReLU (a parameter is named jumprelu)
from anatomy_cli.engine.checkpoint import atomic_write
from anatomy_cli.engine.estimate import now
from anatomy_cli.engine.forwarding import forward
from anatomy_cli.engine.forwarding import head_logits
from anatomy_cli.engine.heap import kept_pages
from anatomy_cli.engine.sae import _hooks
from anatomy_cli.engine.sae_fit import adam
from anatomy_cli.engine.sae_fit import epoch_batches
from anatomy_cli.engine.sae_fit import fvu
from anatomy_cli.engine.sae_fit import optimiser
from anatomy_cli.engine.sae_fit import typical_rms
from anatomy_cli.engine.sparse_topk import sparse_decode
from anatomy_cli.engine.sparse_topk import sparse_topk
from anatomy_cli.models.sites import CT_MLP_OUT
from anatomy_cli.models.sites import Point
from anatomy_cli.models.written import as_user_file

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel

INPUT_HOOK, OUTPUT_HOOK = Point.mlp_in.value, CT_MLP_OUT  # circuit-tracer's names of the MLP's input and output


class CrossLayerCoder(torch.nn.Module):
    """A TopK cross-layer transcoder over ``n_layers`` blocks of width ``d``, ``d_sae`` features per block (see
    the module docstring). ``W_enc[l] [F, d]``, ``b_enc [L, F]``, ``W_dec[l] [F, L − l, d]``, ``b_dec [L, d]``."""

    def __init__(self, n_layers: int, d: int, d_sae: int, k: int, *, jumprelu: dict[str, float] | None = None):
        super().__init__()
        self.n_layers, self.d, self.d_sae, self.k = n_layers, d, d_sae, k
        self.jumprelu = jumprelu  # its bandwidth and l0_coeff: a JumpReLU CLT (engine/jumprelu.py), else TopK
        self.W_enc = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.nn.Linear(d, d_sae).weight.data) for _ in range(n_layers)])
        self.b_enc = torch.nn.Parameter(torch.zeros(n_layers, d_sae))
        self.W_dec = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.zeros(d_sae, n_layers - l, d)) for l in range(n_layers)])
        self.b_dec = torch.nn.Parameter(torch.zeros(n_layers, d))
        if jumprelu is not None:
            self.log_threshold = ste.log_threshold(n_layers, d_sae)
            self.width: torch.Tensor  # per block the kernel's width (``bandwidth · median θ_l`` once placed)
            self.register_buffer("width", torch.full((n_layers,), float(jumprelu["bandwidth"])))
            self.idle: torch.Tensor  # per block and feature the steps since it last fired (:meth:`replace_idle`)
            self.register_buffer("idle", torch.zeros(n_layers, d_sae, dtype=torch.long))

    @torch.no_grad()
    def replace_idle(self, xs: torch.Tensor, fired: torch.Tensor, opt: torch.optim.Optimizer) -> int:
        """A JumpReLU CLT after a step on the rows ``xs [L, rows, d]`` (``fired [L, F]``: the features active in
        it): count each feature's idle steps, and place again the thresholds of those idle for
        ``jumprelu.REPLACE_EVERY`` steps from these rows' pre-activations (:func:`anatomy_cli.engine.jumprelu.
        replace_idle`). Returns how many were placed."""
        self.idle.add_(1).masked_fill_(fired, 0)
        momentum = opt.state.get(self.log_threshold, {}).get("exp_avg")
        placed = 0
        for layer in torch.nonzero(self.idle.amax(1) >= ste.REPLACE_EVERY)[:, 0].tolist():
            z = torch.nn.functional.linear(xs[layer], self.W_enc[layer], self.b_enc[layer])
            placed += ste.replace_idle(self.log_threshold.data[layer], z, self.idle[layer], self.k,
                                       None if momentum is None else momentum[layer])
        return placed

    def pre(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Block ``layer``'s pre-activations, ReLU applied: ``[rows, F]``."""
        return torch.relu(torch.nn.functional.linear(x, self.W_enc[layer], self.b_enc[layer]))

    def thresholded(self, layer: int, x: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Block ``layer``'s features at thresholds ``theta [F]``: ``pre · (pre > θ)`` (no ReLU first; θ > 0), the
        JumpReLU circuit-tracer reads: ``[rows, F]``."""
        z = torch.nn.functional.linear(x, self.W_enc[layer], self.b_enc[layer])
        return z * (z > theta)

    def forward(self, xs: torch.Tensor) -> torch.Tensor:
        """``xs [L, rows, d]`` (every block's MLP input) -> the reconstructions of every block's MLP output."""
        return self.reconstruct(xs)[0]

    def reconstruct(self, xs: torch.Tensor, fired: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(the reconstructions ``[L, rows, d]``, the sparsity term: the sum over blocks of ``(L0_l / k − 1)²``,
        ``L0_l`` block l's mean L0 with the straight-through gradient; 0 for TopK). ``fired [L, F]`` (bool): set
        where a feature is active on some row."""
        n, rows = self.n_layers, xs.shape[1]
        out = self.b_dec[:, None, :].expand(n, rows, self.d)
        penalty = torch.zeros(())
        for layer in range(n):
            flat = self.W_dec[layer].reshape(self.d_sae, -1)
            if self.jumprelu is None:
                dec, acts, idx = sparse_topk(xs[layer], self.W_enc[layer], self.b_enc[layer], flat, self.k)
                if fired is not None:
                    fired[layer, idx[acts.detach() > 0]] = True
            else:
                z = torch.nn.functional.linear(xs[layer], self.W_enc[layer], self.b_enc[layer])
                theta, width = self.log_threshold[layer].exp(), float(self.width[layer])
                acts, idx = ste.jumprelu_sparse(z, theta, width)
                dec = sparse_decode(acts, idx, flat)  # no dense [rows, F] x [F, (L − l)·d] product
                if fired is not None:
                    fired[layer, idx[acts.detach() != 0]] = True
                penalty = penalty + ste.l0_penalty(ste.l0(z, theta, width), self.k)
            out = out.index_add(0, torch.arange(layer, n), dec.view(rows, n - layer, self.d).transpose(0, 1))
        return out, penalty


def loss(coder: CrossLayerCoder, xs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The sum over blocks of each block's FVU (``xs``, ``targets``: ``[L, rows, d]``); a JumpReLU CLT's adds
    ``l0_coeff`` times the sum over blocks of ``(L0_l / k − 1)²`` (``L0_l`` block l's mean L0)."""
    return losses(coder, xs, targets)[0]


def losses(coder: CrossLayerCoder, xs: torch.Tensor, targets: torch.Tensor,
           fired: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(:func:`loss`, its FVU part); ``fired``: as :meth:`CrossLayerCoder.reconstruct`."""
    y, penalty = coder.reconstruct(xs, fired)
    part = sum((fvu(y[m], targets[m]) for m in range(coder.n_layers)), torch.zeros(()))
    coeff = 0.0 if coder.jumprelu is None else coder.jumprelu["l0_coeff"]
    return part + coeff * penalty, part


def unit_scales(coder: CrossLayerCoder, xs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s_x, s_y)``, each ``[L]``: per block the typical row's RMS (``sae_fit.typical_rms``) of its MLP inputs and
    of its outputs (``xs``, ``targets``: ``[L, rows, d]``), what a CLT's inputs and targets are divided by while it
    trains (the per-layer fit's reason: ``sae_fit.unit_scales``)."""
    return (torch.stack([typical_rms(xs[layer]) for layer in range(coder.n_layers)]),
            torch.stack([typical_rms(targets[m]) for m in range(coder.n_layers)]))


@torch.no_grad()
def fold_scales(coder: CrossLayerCoder, sx: torch.Tensor, sy: torch.Tensor) -> None:
    """A CLT trained on ``x_l / s_x[l]`` and ``y_m / s_y[m]`` made one for ``x`` and ``y``: ``W_enc_l / s_x[l]``
    (the same pre-activations), ``W_dec_l[:, m − l] · s_y[m]`` and ``b_dec_m · s_y[m]`` (block m's reconstruction
    times ``s_y[m]``; a JumpReLU CLT's thresholds, on the same pre-activations, unchanged). New tensors, not in
    place: a checkpoint taken before keeps the trained units."""
    for layer in range(coder.n_layers):
        coder.W_enc[layer].data = coder.W_enc[layer].data / sx[layer]
        coder.W_dec[layer].data = coder.W_dec[layer].data * sy[layer:, None]
    coder.b_dec.data = coder.b_dec.data * sy[:, None]


@torch.no_grad()
def init_from_data(coder: CrossLayerCoder, xs: torch.Tensor, targets: torch.Tensor,
                   sx: torch.Tensor, sy: torch.Tensor) -> None:
    """The first step's centring (sparsify's transcoder rule, per block, on ``x_l / s_x[l]`` and ``y_m / s_y[m]``):
    ``b_dec_m`` the target's mean, ``b_enc_l = −mean(x_l) W_enc_lᵀ``; a JumpReLU CLT's thresholds where each block
    fires ``k`` features per row on average over its first rows
    (:func:`anatomy_cli.engine.jumprelu.initial_log_threshold`), and its kernel's width ``bandwidth`` times their
    median."""
    for layer in range(coder.n_layers):
        coder.b_enc.data[layer] = -(xs[layer].mean(0) / sx[layer]) @ coder.W_enc[layer].data.T
        if coder.jumprelu is not None:
            z = torch.nn.functional.linear(xs[layer, :ste.INIT_ROWS] / sx[layer], coder.W_enc[layer],
                                           coder.b_enc[layer])
            coder.log_threshold.data[layer] = ste.initial_log_threshold(z, coder.k)
            coder.width[layer] = ste.kernel_width(coder.jumprelu["bandwidth"], coder.log_threshold[layer])
    coder.b_dec.data = targets.mean(1) / sy[:, None]


def step(coder: CrossLayerCoder, opt: torch.optim.Optimizer, xs: torch.Tensor, targets: torch.Tensor,
         fired: torch.Tensor | None = None) -> float:
    """One Adam step on one batch; its loss's FVU part (the whole loss for TopK). ``fired [L, F]``: set where a
    feature is active on some row of the batch (the step's own choices: no second encoder pass)."""
    value, part = losses(coder, xs, targets, fired)
    value.backward()  # type: ignore[no-untyped-call]
    opt.step()
    opt.zero_grad()
    return float(part.detach())


def settings_of(coder: CrossLayerCoder, *, rows: int, epochs: int, batch: int, lr: float, seed: int,
                data: str) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed (``data``: a digest of the token ids fitted on; ``units``: a
    CLT trains at unit scale since issue 62 (a JumpReLU CLT since its item 1's follow-up: ``raw`` before), in the
    typical row's RMS since block 11's massive rows (``rms``, every entry's, before), so an older checkpoint is
    refused; a JumpReLU CLT's ``pace_cap``: its thresholds' rate at most the bandwidth since the runaway's fix, 0.25
    before, kept in Adam's state, so a checkpoint of before is refused too; ``tail``: a remainder under 8 rows folded
    into the batch before, since misc71, where there is one, so a checkpoint of such a fit from before, whose epochs
    had one step more, is refused; any other, resumed as it was)."""
    jump = {} if coder.jumprelu is None else {"jumprelu": dict(coder.jumprelu), "replace_every": ste.REPLACE_EVERY,
                                              "pace_cap": "bandwidth"}
    tail = {"tail": "folded"} if len(epoch_batches(rows, batch)) < -(-rows // batch) else {}
    return {"kind": "clt", "units": "typical_rms", "n_layers": coder.n_layers,
            "d": coder.d, "d_sae": coder.d_sae, "k": coder.k,
            "rows": rows, "epochs": epochs, "batch": batch, "lr": lr, "seed": seed, "data": data, **jump,
            **tail}


def train(xs: torch.Tensor, targets: torch.Tensor, coder: CrossLayerCoder, *, epochs: int, batch: int, lr: float,
          seed: int = 0, state: dict[str, Any] | None = None, every: int = 1,
          keep: Callable[[dict[str, Any]], None] | None = None,
          progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Adam on the summed FVU over shuffled batches of the rows of ``xs`` / ``targets`` (``[L, rows, d]``),
    ``epochs`` times (each epoch's batches: ``sae_fit.epoch_batches``, a remainder under 8 rows folded into the
    batch before), at unit scale (:func:`unit_scales`, folded back at the end: :func:`fold_scales`); epoch e's
    order is ``randperm`` from ``seed + e``. ``state``: a checkpoint to go on from (what ``keep`` was given: the
    coder's and Adam's state dicts in the trained units, the curve, the fired flags, the scales); ``keep`` is
    called with the checkpoint every ``every`` steps and after the last. Returns ``{"steps", "fvu" (the summed loss per
    step), "fired" ([L, F] bool: fired in the last epoch)}``."""
    rows = xs.shape[1]
    opt = optimiser(coder, lr)
    bounds = epoch_batches(rows, batch)
    per_epoch = len(bounds)
    steps = epochs * per_epoch
    curve: list[float] = []
    fired = torch.zeros(coder.n_layers, coder.d_sae, dtype=torch.bool)
    if state is not None:
        coder.load_state_dict(state["coder"])
        opt.load_state_dict(state["opt"])
        curve, fired = list(state["curve"]), state["fired"].clone()
        sx, sy = state["scales"]
    else:
        sx, sy = unit_scales(coder, xs, targets)
        init_from_data(coder, xs, targets, sx, sy)
        if coder.jumprelu is not None:  # the thresholds' pace, one for every block (engine/jumprelu.py)
            ste.pace(opt, xs[:, :ste.INIT_ROWS] / sx[:, None, None], coder.log_threshold,
                     coder.jumprelu["bandwidth"])
    with kept_pages():  # the step's freed memory serves the next step (engine/heap.py)
        for done in range(len(curve), steps):
            epoch, i = divmod(done, per_epoch)
            if i == 0 and epoch == epochs - 1:
                fired.zero_()
            order = torch.randperm(rows, generator=torch.Generator().manual_seed(seed + epoch))
            idx = order[slice(*bounds[i])]
            xb, tb = xs[:, idx].div_(sx[:, None, None]), targets[:, idx].div_(sy[:, None, None])
            now = torch.zeros_like(fired)
            curve.append(step(coder, opt, xb, tb, now))
            fired |= now
            if coder.jumprelu is not None:
                coder.replace_idle(xb, now, opt)
            if keep is not None and (len(curve) % every == 0 or len(curve) == steps):
                keep({"coder": coder.state_dict(), "opt": opt.state_dict(), "curve": list(curve), "fired": fired,
                      "scales": (sx, sy)})
            if progress is not None:
                progress(len(curve), steps)
    fold_scales(coder, sx, sy)
    return {"steps": len(curve), "fvu": curve, "fired": fired}


@torch.no_grad()
def thresholds(coder: CrossLayerCoder, xs: torch.Tensor, *, chunk: int = 4096) -> torch.Tensor:
    """``[L, F]``: per block and feature the JumpReLU threshold that fires on the rows of ``xs`` exactly as often
    as the TopK does (the module docstring): halfway between the feature's n-th and (n+1)-th largest
    pre-activation, n its TopK count (n = 0: its largest, so it never fires on these rows), at least 0. A JumpReLU
    CLT's are its own, as trained. Each feature's pre-activations are kept as a contiguous row (``[F, rows]``) and
    only the largest ``max n + 1`` of each are ordered (``topk``): the sort of the whole ``[rows, F]`` along its
    rows, as before, took 1.8 of the 2.1 CPU s a block (SmolLM2's width, 1,024 features, 7,812 rows) and most of
    the 30-block fit's writing phase; the same values, so the same thresholds."""
    if coder.jumprelu is not None:
        return coder.log_threshold.detach().exp()
    out = torch.zeros(coder.n_layers, coder.d_sae)
    rows = xs.shape[1]
    per_feature = torch.empty(coder.d_sae, rows)
    for layer in range(coder.n_layers):
        count = torch.zeros(coder.d_sae, dtype=torch.long)
        for s in range(0, rows, chunk):
            pre = coder.pre(layer, xs[layer, s:s + chunk])
            acts, idx = pre.topk(coder.k, dim=-1, sorted=False)
            count += torch.bincount(idx[acts > 0], minlength=coder.d_sae)
            per_feature[:, s:s + chunk] = pre.T
        ordered = per_feature.topk(min(rows, int(count.max()) + 1), dim=-1).values  # [F, max n + 1], descending
        padded = torch.cat([ordered, ordered[:, -1:]], 1)  # n = rows: the last one twice
        above = padded.gather(1, (count - 1).clamp(min=0)[:, None])[:, 0]
        below = padded.gather(1, count[:, None])[:, 0]
        out[layer] = torch.where(count > 0, (above + below) / 2, ordered[:, 0]).clamp(min=0)
    return out


@torch.no_grad()
def held_out(coder: CrossLayerCoder, xs: torch.Tensor, targets: torch.Tensor,
             theta: torch.Tensor) -> list[dict[str, float]]:
    """Per block on held-out rows: the FVU of the reconstruction as trained (TopK) and as written (JumpReLU at
    ``theta``), and the written one's mean L0."""
    jump = jumprelu_forward(coder, xs, theta)
    topk = coder(xs)
    return [{"fvu_topk": float(fvu(topk[m], targets[m])), "fvu": float(fvu(jump[0][m], targets[m])),
             "l0_mean": float(jump[1][m])} for m in range(coder.n_layers)]


def jumprelu_forward(coder: CrossLayerCoder, xs: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """The written CLT's reconstructions (``pre · (pre > θ)`` per block, as circuit-tracer reads it) and each
    block's mean number of active features per row."""
    n, rows = coder.n_layers, xs.shape[1]
    out = coder.b_dec[:, None, :].expand(n, rows, coder.d).clone()
    l0 = []
    for layer in range(n):
        acts = coder.thresholded(layer, xs[layer], theta[layer])
        l0.append(float((acts != 0).sum(-1).float().mean()))
        out[layer:] += torch.einsum("rf,fjd->jrd", acts, coder.W_dec[layer])
    return out, l0


@torch.no_grad()
def spliced_logits(lm: LoadedModel, ids: Sequence[int], coder: CrossLayerCoder, theta: torch.Tensor,
                   points: Sequence[tuple[str, str]], *, skip: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the clean logits ``[n, vocab]`` of ``ids``, the logits with every block's MLP output replaced by the
    written CLT's reconstruction): ``points[l]`` the hook points of block l's MLP input and output (what the fit
    collected). The splice is closed-loop, as the replacement model runs: block l's features read block l's MLP
    input in the spliced forward itself (``pre · (pre > θ_l)``, the written thresholds), and block m's MLP
    output becomes ``Σ_{l ≤ m} a_l W_dec_l[:, m − l] + b_dec_m``. ``skip``: the first positions keep the model's
    own MLP outputs and are left out of both logits (fit-sae's held-out check: ``sae_fit.SKIPPED``)."""
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    acts: dict[int, torch.Tensor] = {}

    def read(layer: int) -> Callable[[torch.Tensor], None]:
        def fn(t: torch.Tensor) -> None:
            acts[layer] = coder.thresholded(layer, t[0].float().cpu(), theta[layer])
        return fn

    def write(m: int) -> Callable[[torch.Tensor], torch.Tensor]:
        def fn(t: torch.Tensor) -> torch.Tensor:
            y = coder.b_dec[m].clone()
            for layer in range(m + 1):
                y = y + acts[layer] @ coder.W_dec[layer][:, m - layer]
            y = y.to(device=t.device, dtype=t.dtype)[None]
            return torch.cat([t[:, :skip], y[:, skip:]], 1) if skip else y
        return fn

    def logits(pairs: list[Any]) -> torch.Tensor:
        with torch.inference_mode(), _hooks(lm, pairs):
            return head_logits(lm, forward(lm, input_ids)[0]).float()

    lm.model.eval()
    clean = logits([])
    pairs = [pair for layer, (p_in, p_out) in enumerate(points) for pair in ((p_in, read(layer)),
                                                                            (p_out, write(layer)))]
    return clean[skip:], logits(pairs)[skip:]


def probe_step_seconds(n_layers: int, d: int, d_sae: int, k: int, *, batch: int, steps: int = 3,
                       jumprelu: dict[str, float] | None = None) -> float:
    """The seconds one :func:`step` of a coder of this size takes here now (the median after the first, which
    allocates Adam's state), on random rows; the caller's RNG is left alone."""

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        coder = CrossLayerCoder(n_layers, d, d_sae, k, jumprelu=jumprelu)
        xs = torch.randn(n_layers, batch, d)
        if jumprelu is not None:  # thresholds where k fire per row, as the fit places them: the sparse decode's size
            init_from_data(coder, xs, xs, torch.ones(n_layers), torch.ones(n_layers))
        opt = adam(coder.parameters(), 1e-4)
        gaps = []
        for _ in range(steps):
            start = now()
            step(coder, opt, xs, xs)
            gaps.append(now() - start)
    return statistics.median(gaps[1:] or gaps)


def probe_thresholds_seconds(d: int, d_sae: int, k: int, rows: int) -> float:
    """The seconds :func:`thresholds` takes here now for one block over ``rows`` random rows (it grows with the
    blocks and the rows); a JumpReLU CLT's thresholds are its own (no work). The caller's RNG is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        coder = CrossLayerCoder(1, d, d_sae, k)
        xs = torch.randn(1, rows, d)
        start = now()
        thresholds(coder, xs)
    return now() - start


PROBE_BLOCKS = 2  # the coder :func:`probe_writing_seconds` writes and reads


def probe_writing_seconds(d: int, d_sae: int, k: int, rows: int, folder: Path) -> float:
    """The seconds a :data:`PROBE_BLOCKS`-block coder of this width takes here now to be written into ``folder``
    (:func:`save`) and read on ``rows`` held-out rows (:func:`held_out`, and once more :func:`jumprelu_forward`:
    the spliced forward's decoder sums are the same products); each grows with the coder's parameters
    (:func:`parameter_count`). The caller's RNG is left alone."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        coder = CrossLayerCoder(PROBE_BLOCKS, d, d_sae, k)
        xs = torch.randn(PROBE_BLOCKS, rows, d)
        theta = torch.zeros(PROBE_BLOCKS, d_sae)
        start = now()
        save(coder, theta, folder, scan="probe", model_name="probe")
        held_out(coder, xs, xs, theta)
        with torch.no_grad():
            jumprelu_forward(coder, xs, theta)
    return now() - start


def parameter_count(n_layers: int, d: int, d_sae: int) -> int:
    """Encoders, decoders (``F · d · L(L+1)/2``) and biases."""
    return n_layers * d_sae * d + d_sae * d * n_layers * (n_layers + 1) // 2 + n_layers * (d_sae + d)


def save(coder: CrossLayerCoder, theta: torch.Tensor, folder: Path, *, scan: str, model_name: str,
         context_size: int | None = None, skipped_positions: int = 0) -> None:
    """circuit-tracer's ``load_clt`` folder (``CrossLayerTranscoder.to_safetensors`` with a JumpReLU):
    ``W_enc_{l}.safetensors`` (``W_enc_l``, ``b_enc_l``, ``b_dec_l``, ``threshold_l``), ``W_dec_{l}.safetensors``
    (``W_dec_l [F, L − l, d]``) and ``config.yaml`` (``model_kind: cross_layer_transcoder``, the hooks, ``scan``,
    ``model_name``, and ``context_size``, the windows' length it trained on where given: SAELens' key, which
    circuit-tracer does not read and the per-layer fits' configs carry, and ``skipped_positions`` where given, each
    window's first positions the rows left out: ``sae_fit.SKIPPED``). Every file written beside itself and
    renamed."""
    import yaml  # type: ignore[import-untyped]  # transformers' dependency
    from safetensors.torch import save_file


    folder.mkdir(parents=True, exist_ok=True)

    def write(tensors: dict[str, torch.Tensor], name: str) -> None:
        def to(tmp: Path) -> None:
            save_file({k: v.detach().float().contiguous().cpu() for k, v in tensors.items()}, str(tmp))
            as_user_file(tmp)

        atomic_write(folder / name, to)

    for l in range(coder.n_layers):
        write({f"W_enc_{l}": coder.W_enc[l], f"b_enc_{l}": coder.b_enc[l], f"b_dec_{l}": coder.b_dec[l],
               f"threshold_{l}": theta[l]}, f"W_enc_{l}.safetensors")
        write({f"W_dec_{l}": coder.W_dec[l]}, f"W_dec_{l}.safetensors")
    config: dict[str, object] = {"model_name": model_name, "model_kind": "cross_layer_transcoder",
                                 "feature_input_hook": INPUT_HOOK, "feature_output_hook": OUTPUT_HOOK, "scan": scan}
    if context_size:
        config["context_size"] = int(context_size)
    if skipped_positions:
        config["skipped_positions"] = int(skipped_positions)
    (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    as_user_file(folder / "config.yaml")
