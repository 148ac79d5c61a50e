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
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from anatomy_cli.engine.hooks import _check_names, _first_tensor, capture
from anatomy_cli.engine.interventions import SITES, Edit, _replace_first, _with_hidden, run_edits
from anatomy_cli.engine.lens import _rowwise
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError, UsageError

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
    for ``attn.hook_z``), detached, float32 on ``lm.device``."""

    metric: float
    acts: dict[str, torch.Tensor]
    grads: dict[str, torch.Tensor]


def metric_gradients(lm: LoadedModel, ids: Sequence[int], names: Sequence[str], metric: Metric, *,
                     position: int = -1) -> Gradients:
    """One forward and one backward of the prompt ``ids``: the gradient of ``metric(logits at position)``
    with respect to the activation at each hook point in ``names``.

    ``metric`` maps logits ``[1, vocab]`` to ``[1]`` (differentiably; e.g. ``analyses.patch.logit_metric``).
    Raises UsageError for an unknown name, an empty prompt or a position out of range, AnatomyError for a
    model without an LM head.
    """
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read logits from")
    names = _check_names(lm, names)
    n = len(ids)
    if n == 0:
        raise UsageError("empty prompt")
    pos = position + n if position < 0 else position
    if not 0 <= pos < n:
        raise UsageError(f"position {position} is out of range for a prompt of {n} tokens")
    deltas: dict[str, torch.Tensor] = {}
    acts: dict[str, torch.Tensor] = {}

    def tap(name: str, t: torch.Tensor) -> torch.Tensor:
        if name in deltas:  # a module run twice in one forward: its gradient would be ambiguous
            raise AnatomyError(f"hook point {name} ran twice in one forward; gradients need it once")
        delta = torch.zeros_like(t, requires_grad=True)
        deltas[name] = delta
        acts[name] = t.detach().reshape(n, t.shape[-1]).to(lm.device, torch.float32)  # flat taps: [pos, d]
        return t + delta

    handles = []
    input_ids = torch.tensor([list(ids)], dtype=torch.long, device=lm.device)
    lm.model.eval()
    try:
        with grad_mode(lm):
            for name in names:
                module, side = lm.points[name]
                if side == "input":
                    def pre_hook(_mod, args, kwargs, name=name):
                        return _with_hidden(args, kwargs, lambda t: tap(name, t))
                    handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
                else:
                    def hook(_mod, _args, output, name=name):
                        return _replace_first(output, tap(name, _first_tensor(output)))
                    handles.append(module.register_forward_hook(hook))
            kwargs = {"use_cache": False} if lm.is_causal else {}
            out = lm.model.base_model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
                                      position_ids=torch.arange(n, device=lm.device)[None], **kwargs)
            hidden = _first_tensor(out)[:, pos]                        # [1, d_model]
            m = metric(lm.cap_logits(_rowwise(lm.points["logits"][0], hidden)).to(lm.device))
            wrt = [deltas[name] for name in names]
            grads = torch.autograd.grad(m.sum(), wrt, allow_unused=True)
            value = float(m.detach()[0])
            del out, hidden, m
    finally:
        for handle in handles:
            handle.remove()
    # A point with no path to the metric (allow_unused) has gradient 0.
    grad = {name: (torch.zeros_like(deltas[name]) if g is None else g).detach().reshape(n, -1)
            .to(lm.device, torch.float32) for name, g in zip(names, grads)}
    deltas.clear()
    return Gradients(metric=value, acts=acts, grads=grad)


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
    from one forward of CLEAN and one forward and backward of CORRUPT, whatever the grid size.

    Same sites and cells as the exact grid: a position per column (layer x position), or for ``head`` a
    head at every position (layer x head). Raises UsageError for an unknown site or prompts of different
    token counts.
    """
    if site not in SITES:
        raise UsageError(f"unknown site '{site}'; use one of {', '.join(SITES)}")
    if len(clean_ids) != len(corrupt_ids):
        raise UsageError(f"the prompts have different token counts: {len(clean_ids)} and {len(corrupt_ids)}")
    layers = tuple(range(lm.n_layers)) if layers is None else tuple(layers)
    names = [f"blocks.{layer}.{SITES[site].hook}" for layer in layers]
    n = len(clean_ids)
    clean_in = torch.tensor([list(clean_ids)], dtype=torch.long, device=lm.device)
    with torch.inference_mode(), capture(lm, names) as store:
        kwargs = {"use_cache": False} if lm.is_causal else {}
        out = lm.model.base_model(input_ids=clean_in, attention_mask=torch.ones_like(clean_in),
                                  position_ids=torch.arange(n, device=lm.device)[None], **kwargs)
        clean = float(reduce(lm.cap_logits(_rowwise(lm.points["logits"][0], _first_tensor(out)[:, -1]))
                             .to(lm.device))[0])
    sources = {name: store[name][0].reshape(n, -1).to(torch.float32).clone() for name in names}
    del store, out
    run = metric_gradients(lm, corrupt_ids, names, reduce)
    per_head = SITES[site].per_head
    columns = tuple(range(lm.n_heads)) if per_head else tuple(range(n))
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
    hook = SITES[run.site].hook
    rows = []
    for layer, c in cells:
        act = run.sources[f"blocks.{layer}.{hook}"]
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
            cols = slice(None)
            if SITES[edit.site].per_head:
                cols = slice(edit.head * lm.d_head, (edit.head + 1) * lm.d_head)
            where = list(edit.positions) if edit.positions is not None else slice(None)
            a, g = a[:, cols], g[:, cols]
            ablated = torch.zeros_like(a) if edit.mode == "zero" else a.mean(0, keepdim=True).expand_as(a)
            total += float(((ablated - a)[where] * g[where]).to(torch.float64).sum())
        out.append(total)
    return run.metric, torch.tensor(out, dtype=torch.float64)
