"""Gradients of a metric on the logits with respect to hook-point activations (attribution patching).

The rest of the engine runs under ``torch.inference_mode``. Gradients are taken only inside
:func:`grad_mode`: autograd on, every weight's ``requires_grad`` switched off for the run and
restored after (so no weight gradient is ever computed or stored), and the graph freed when
the run returns. A model kept loaded by ``anatomy serve`` is the same before and after.

How an activation's gradient is read: the hook at each point adds a zero tensor ``delta`` that
requires grad, ``a -> a + delta``, and ``dm/d delta`` is then the total derivative of the metric
with respect to ``a`` (every path downstream of the point, later hooked points included).

Attribution patching (AtP; Nanda 2023, Kramar et al. 2024) estimates each cell of an exact
patching grid from one backward: patching CORRUPT's activation ``a`` with CLEAN's ``a'`` changes
the metric by about ``(a' - a) . dm/da`` at the corrupt run, a first-order Taylor expansion.
CLEAN and CORRUPT share one forward as two batch rows (:func:`metric_gradients`' ``companion``).
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from functools import partial

import torch

from anatomy_cli.engine.forwarding import metric_logits
from anatomy_cli.engine.forwarding import pad_batch
from anatomy_cli.engine.forwarding import run_batch
from anatomy_cli.engine.hooks import attach
from anatomy_cli.engine.hooks import check_names
from anatomy_cli.engine.interventions import SITES
from anatomy_cli.engine.interventions import Edit
from anatomy_cli.engine.interventions import run_edits
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites

Metric = Callable[[torch.Tensor], torch.Tensor]  # logits [n, vocab] -> [n]


@contextmanager
def grad_mode(lm: LoadedModel) -> Iterator[None]:
    """Autograd on for the block (also inside an outer ``inference_mode``), with every weight of ``lm``
    set to ``requires_grad=False``; each weight's flag is restored on exit, also when the block raises."""
    params = list(lm.model.parameters())
    saved = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        with torch.inference_mode(False), torch.enable_grad():
            yield
    finally:
        for p, flag in zip(params, saved):
            p.requires_grad_(flag)


@dataclass(frozen=True)
class Gradients:
    """One run of a prompt: ``metric`` (float), and per hook name the activation ``acts[name]`` and
    ``grads[name] = dm/d acts[name]``, both ``[pos, width]`` (width ``d_model``, or ``n_heads * d_head``
    for ``attn.hook_z``), detached, float32 on ``lm.device``. With a ``companion`` prompt (see
    :func:`metric_gradients`): its metric ``companion_metric`` and activations ``companion_acts[name]``
    ``[pos, width]`` from the same forward, without gradients; otherwise None and empty."""

    metric: float
    acts: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]
    companion_metric: float | None = None
    companion_acts: dict[str, torch.Tensor] = field(default_factory=dict)


def metric_gradients(lm: LoadedModel, ids: Sequence[int], names: Sequence[str], metric: Metric, *,
                     position: int = -1, companion: Sequence[int] | None = None) -> Gradients:
    """One forward and one backward of the prompt ``ids``: the gradient of ``metric(logits at position)``
    with respect to the activation at each hook point in ``names``.

    ``metric`` maps logits ``[rows, vocab]`` to ``[rows]`` row by row (differentiably; e.g.
    ``analyses.patch.logit_metric``). ``companion``: another prompt of the same token count run in the same
    forward as a second batch row (no padding), whose activations and metric are returned too; batch rows
    are independent, so its gradient is zero and ``ids``' figures are those of a run alone, to float
    rounding. On a CPU a 2-row forward of a short prompt costs little more than a 1-row one (the weights
    are read once), which is why attribution patching runs CLEAN this way.
    Raises UsageError for an unknown name, an empty prompt, a position out of range or a companion of
    another length, AnatomyError for a model without an LM head.
    """
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read logits from")
    names = check_names(lm, names)
    n = len(ids)
    if n == 0:
        raise UsageError("empty prompt")
    if companion is not None and len(companion) != n:
        raise UsageError(f"the prompts have different token counts: {len(companion)} and {n}")
    pos = position + n if position < 0 else position
    if not 0 <= pos < n:
        raise UsageError(f"position {position} is out of range for a prompt of {n} tokens")
    batch = [list(ids)] if companion is None else [list(companion), list(ids)]
    row = len(batch) - 1                                               # the row whose gradient is taken
    deltas: dict[str, torch.Tensor] = {}
    acts: dict[str, torch.Tensor] = {}

    def tap(name: str, t: torch.Tensor) -> torch.Tensor:
        if name in deltas:  # a module run twice in one forward: its gradient would be ambiguous
            raise AnatomyError(f"hook point {name} ran twice in one forward; gradients need it once")
        delta = torch.zeros_like(t, requires_grad=True)
        deltas[name] = delta
        acts[name] = t.detach().reshape(len(batch), n, t.shape[-1]).to(lm.device, torch.float32)  # [rows, pos, d]
        return t + delta

    padded = pad_batch(lm, batch)                                      # equal lengths: no padding
    lm.model.eval()
    with grad_mode(lm), attach(lm, [(name, partial(tap, name)) for name in names]):
        hidden = run_batch(lm, padded)[:, pos]                         # [rows, d_model]
        m = metric_logits(lm, hidden, metric)
        wrt = [deltas[name] for name in names]
        grads = torch.autograd.grad(m[row], wrt, allow_unused=True)
        values = [float(v) for v in m.detach()]
        del hidden, m
    # A point with no path to the metric (allow_unused) has gradient 0.
    grad = {name: (torch.zeros_like(deltas[name]) if g is None else g).detach()
            .reshape(len(batch), n, -1)[row].to(lm.device, torch.float32) for name, g in zip(names, grads)}
    deltas.clear()
    if companion is None:
        return Gradients(metric=values[row], acts={k: v[row] for k, v in acts.items()}, grads=grad)
    return Gradients(metric=values[row], acts={k: v[row] for k, v in acts.items()}, grads=grad,
                     companion_metric=values[0], companion_acts={k: v[0] for k, v in acts.items()})


@dataclass(frozen=True)
class AttributionPatchRun:
    """What :func:`attribution_patch_grid` returns (like ``interventions.PatchRun``).

    ``clean``/``corrupt``: the metric of each unedited run (floats); ``estimate``: float64
    ``[len(layers), len(columns)]``, the estimated change of the corrupt run's metric when the cell is
    patched, ``(a_clean - a_corrupt) . dm/da`` (summed over the cell's positions and width);
    ``sources[name]``: CLEAN's activation ``[pos, width]`` at each layer's hook point (for exact reruns).
    """

    site: str
    layers: tuple[int, ...]
    columns: tuple[int, ...]
    clean: float
    corrupt: float
    estimate: torch.Tensor
    sources: dict[str, torch.Tensor]


def attribution_patch_grid(lm: LoadedModel, clean_ids: Sequence[int], corrupt_ids: Sequence[int], site: str, *,
                           reduce: Metric, layers: Sequence[int] | None = None) -> AttributionPatchRun:
    """Attribution patching: every cell of :func:`~anatomy_cli.engine.interventions.patch_grid` estimated
    from one forward of CLEAN and CORRUPT together (two batch rows) and one backward of CORRUPT's metric,
    whatever the grid size.

    Same sites and cells as the exact grid: a position per column (layer x position), or for ``head`` a
    head at every position (layer x head). Raises UsageError for an unknown site or prompts of different
    token counts.
    """
    if site not in SITES:
        raise UsageError(f"unknown site '{site}'; use one of {', '.join(SITES)}")
    if len(clean_ids) != len(corrupt_ids):
        raise UsageError(f"the prompts have different token counts: {len(clean_ids)} and {len(corrupt_ids)}")
    layers = tuple(range(lm.n_layers)) if layers is None else tuple(layers)
    names = sites.names(layers, SITES[site])
    # CLEAN rides along as the companion row of CORRUPT's forward: one forward and one backward in all.
    run = metric_gradients(lm, corrupt_ids, names, reduce, companion=clean_ids)
    sources, clean = run.companion_acts, run.companion_metric
    assert clean is not None  # run with a companion
    per_head = SITES[site].per_head
    columns = tuple(range(lm.n_heads)) if per_head else tuple(range(len(corrupt_ids)))
    rows = []
    for name in names:
        contrib = ((sources[name] - run.acts[name]) * run.grads[name]).to(torch.float64)   # [pos, width]
        if per_head:
            rows.append(contrib.sum(0).reshape(lm.n_heads, lm.d_head).sum(-1))            # [n_heads]
        else:
            rows.append(contrib.sum(-1))                                                   # [pos]
    return AttributionPatchRun(site=site, layers=layers, columns=columns, clean=clean, corrupt=run.metric,
                               estimate=torch.stack(rows).cpu(), sources=sources)


def exact_patch_cells(lm: LoadedModel, corrupt_ids: Sequence[int], run: AttributionPatchRun,
                      cells: Sequence[tuple[int, int]], *, reduce: Metric, batch_size: int = 32) -> torch.Tensor:
    """The exact patched metric of each ``(layer, column)`` cell of ``run`` (CORRUPT with CLEAN's activation
    there), by :func:`~anatomy_cli.engine.interventions.run_edits`: float64 ``[len(cells)]``."""
    rows = []
    for layer, c in cells:
        act = run.sources[sites.name(layer, SITES[run.site])]
        if SITES[run.site].per_head:
            rows.append([Edit(run.site, layer, head=c, value=act[:, c * lm.d_head:(c + 1) * lm.d_head])])
        else:
            rows.append([Edit(run.site, layer, positions=(c,), value=act[c:c + 1])])
    _, edited = run_edits(lm, corrupt_ids, rows, position=-1, batch_size=batch_size, reduce=reduce)
    return edited.detach().to("cpu", torch.float64).reshape(len(cells))


def attribution_ablation(lm: LoadedModel, ids: Sequence[int], rows: Sequence[Sequence[Edit]], *, reduce: Metric,
                         position: int = -1) -> tuple[float, torch.Tensor]:
    """The linearised effect of each row of ablation edits (``zero`` or ``mean``, e.g. from
    ``interventions.ablation_rows``): ``sum (a_ablated - a) . dm/da`` at the intact run, from one forward
    and one backward. Returns ``(intact metric, float64 [len(rows)] estimated change)``."""
    names = list(dict.fromkeys(edit.hook_name() for row in rows for edit in row))
    run = metric_gradients(lm, ids, names, reduce, position=position)
    out = []
    for row in rows:
        total = 0.0
        for edit in row:
            if edit.mode not in ("zero", "mean"):
                raise ValueError(f"attribution ablation takes zero or mean edits, not {edit.mode!r}")
            a, g = run.acts[edit.hook_name()], run.grads[edit.hook_name()]
            cols = edit.columns(lm.d_head)
            where = list(edit.positions) if edit.positions is not None else slice(None)
            a, g = a[:, cols], g[:, cols]
            ablated = torch.zeros_like(a) if edit.mode == "zero" else a.mean(0, keepdim=True).expand_as(a)
            total += float(((ablated - a)[where] * g[where]).to(torch.float64).sum())
        out.append(total)
    return run.metric, torch.tensor(out, dtype=torch.float64)
