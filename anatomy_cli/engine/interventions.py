"""Interventions: forward runs of one prompt with activations replaced, zeroed or mean-ablated.

One patching core for ``ablate`` and ``patch`` (after TransformerLens's ``patching.py``):
a *site* is data (:data:`SITES`: which hook point, whether it is a head's slice), an
:class:`Edit` says what to do at one site of one layer, and :func:`run_edits` runs many
edited copies of the prompt ("rows"), each with its own edits, in a few batched forwards.

Batching. Rows are sorted by the first layer they edit, and a forward starts as ONE row,
the unedited prompt. At the input of block l, the rows whose first edit is in block l join
the batch as copies of that unedited row. So the blocks below a row's first edit run once
per forward for all rows (at batch 1), and a grid of L layers x P positions costs about
``L * P / 2`` row-blocks instead of ``L * P`` full forwards. ``batch_size`` bounds the edited
rows of one forward. The attention mask and rotary tables are built for batch 1 and
broadcast over the grown batch (every row is the same token sequence, no padding).

Hooks go through :func:`~anatomy_cli.engine.hooks.attach`, which removes them in ``finally``, also
when the forward raises.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch

from anatomy_cli.engine import expert_edits
from anatomy_cli.engine.expert_edits import ExpertEdit
from anatomy_cli.engine.forwarding import metric_logits
from anatomy_cli.engine.forwarding import pad_batch
from anatomy_cli.engine.forwarding import run_batch
from anatomy_cli.engine.hooks import HookFn
from anatomy_cli.engine.hooks import attach
from anatomy_cli.engine.hooks import attach_modules
from anatomy_cli.engine.hooks import capture
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import hook_name

SITES: dict[str, Site] = {s.value: s for s in (Site.resid_pre, Site.attn_out, Site.mlp_out, Site.resid_post,
                                               Site.head)}
"""The sites one can intervene at (:class:`anatomy_cli.models.sites.Site`: its ``hook`` inside ``blocks.{l}.``;
``head`` edits the columns ``h * d_head : (h + 1) * d_head`` of ``blocks.{l}.attn.hook_z``)."""

Mode = Literal["patch", "zero", "mean"]


@dataclass(frozen=True)
class Edit:
    """One intervention in one row.

    ``site`` is a key of :data:`SITES`; ``head`` is required for per-head sites.
    ``positions``: absolute token positions to edit (None: all). ``mode``:

    * ``patch``: write ``value``, float ``[len(positions) or pos, width]`` (width ``d_model``,
      or ``d_head`` for a head), e.g. another prompt's activation;
    * ``zero``: write zeros;
    * ``mean``: write the activation's mean over all the prompt's positions (in this row).
    """

    site: str
    layer: int
    head: int | None = None
    positions: tuple[int, ...] | None = None
    mode: Mode = "patch"
    value: torch.Tensor | None = None

    def hook_name(self) -> str:
        return hook_name(self.layer, self.site)

    def columns(self, d_head: int) -> slice:
        """The columns of the hook point this edit writes: its head's ``d_head`` columns at a per-head site,
        else all. Raises ValueError for a per-head edit without a head."""
        if not SITES[self.site].per_head:
            return slice(None)
        if self.head is None:
            raise ValueError(f"a {self.site} edit needs a head")
        return slice(self.head * d_head, (self.head + 1) * d_head)


def check_edit(lm: LoadedModel, edit: Edit, n_tokens: int) -> None:
    """Raise UsageError for an edit ``lm`` cannot do (unknown site, layer/head/position out of range)."""
    if edit.site not in SITES:
        raise UsageError(f"unknown site '{edit.site}'; use one of {', '.join(SITES)}")
    if not 0 <= edit.layer < lm.n_layers:
        raise UsageError(f"layer {edit.layer} is out of range: {lm.name} has layers 0..{lm.n_layers - 1}")
    if SITES[edit.site].per_head and (edit.head is None or not 0 <= edit.head < lm.n_heads):
        raise UsageError(f"head {edit.head} is out of range: {lm.name} has heads 0..{lm.n_heads - 1}")
    for p in edit.positions or ():
        if not 0 <= p < n_tokens:
            raise UsageError(f"position {p} is out of range for a prompt of {n_tokens} tokens")
    if edit.mode == "patch" and edit.value is None:
        raise ValueError("a patch edit needs a value")
    if edit.hook_name() not in lm.points:
        raise UsageError(f"{lm.name} has no hook point '{edit.hook_name()}'")


def run_edits(lm: LoadedModel, ids: Sequence[int], rows: Sequence[Sequence[Edit | ExpertEdit]], *,
              position: int = -1, batch_size: int = 32, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
              progress: Callable[[int, int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the prompt ``ids`` once per row of edits; read the logits at ``position``.

    ``rows[i]`` is the list of edits of row i (an empty list: the unedited prompt); an
    :class:`~anatomy_cli.engine.expert_edits.ExpertEdit` knocks out a routed expert of an MoE block.
    ``reduce`` maps logits ``[n, vocab]`` (model dtype) to what is kept per row, e.g. a
    metric ``[n]``; default: the logits themselves. ``progress(rows done, rows)`` after each batch.

    Returns ``(base, edited)``: ``reduce`` of the unedited run's logits ``[1, ...]`` and of
    every row ``[len(rows), ...]``, input order, on ``lm.device``. Raises UsageError for an
    edit out of range, AnatomyError for a model without an LM head.
    """
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read logits from")
    n_tokens = len(ids)
    if n_tokens == 0:
        raise UsageError("empty prompt")
    pos = position + n_tokens if position < 0 else position
    if not 0 <= pos < n_tokens:
        raise UsageError(f"position {position} is out of range for a prompt of {n_tokens} tokens")
    for row in rows:
        for edit in row:
            if isinstance(edit, ExpertEdit):
                expert_edits.check(lm, edit)
            else:
                check_edit(lm, edit, n_tokens)
    reduce = reduce or (lambda logits: logits)

    starts = [min((e.layer for e in row), default=lm.n_layers) for row in rows]
    order = sorted(range(len(rows)), key=lambda i: starts[i])
    base_out: torch.Tensor | None = None
    results: dict[int, torch.Tensor] = {}
    batch = pad_batch(lm, [ids])                              # one row, no padding
    lm.model.eval()
    for first in range(0, max(1, len(order)), max(1, batch_size)):
        chunk = order[first:first + max(1, batch_size)]
        with torch.inference_mode(), _hooks(lm, [rows[i] for i in chunk], [starts[i] for i in chunk], n_tokens):
            hidden = run_batch(lm, batch)[:, pos]             # [1 + len(chunk), d_model]
            # Soft-capped (Gemma 2) as the model's own head does, so metrics are the model's logits.
            reduced = metric_logits(lm, hidden, reduce)
        if base_out is None:
            base_out = reduced[:1].clone()
        for j, i in enumerate(chunk, start=1):
            # A row without edits never joined the batch (it sorts last): it is the unedited run.
            results[i] = reduced[j if starts[i] < lm.n_layers else 0].clone()
        if progress is not None:
            progress(first + len(chunk), len(rows))
    assert base_out is not None  # the loop runs at least once
    edited = torch.stack([results[i] for i in range(len(rows))]) if rows else base_out[:0]
    return base_out, edited


@dataclass(frozen=True)
class PatchRun:
    """What :func:`patch_grid` returns (tensors on ``lm.device``, ``reduce``'s dtype).

    ``clean``/``corrupt``: ``reduce`` of each unedited run's logits at the last position
    (computed in one batch), ``[...]``; ``grid``: ``[len(layers), len(columns), ...]``, cell (i, j) the corrupt run
    with layer ``layers[i]``'s site at column ``columns[j]`` (a position, or a head at all
    positions) taken from the clean run.
    """

    site: str
    layers: tuple[int, ...]
    columns: tuple[int, ...]
    clean: torch.Tensor
    corrupt: torch.Tensor
    grid: torch.Tensor


def patch_grid(lm: LoadedModel, clean_ids: Sequence[int], corrupt_ids: Sequence[int], site: str, *,
               reduce: Callable[[torch.Tensor], torch.Tensor], layers: Sequence[int] | None = None,
               source_ids: Sequence[int] | None = None, batch_size: int = 32,
               progress: Callable[[int, int], None] | None = None) -> PatchRun:
    """Activation patching: run ``corrupt_ids`` with one site of one layer (at one position, or one
    head at every position) replaced by its activation in the run of ``clean_ids``.

    ``site``: a key of :data:`SITES`; ``layers``: default all. The patched values come from
    ``source_ids`` when given (default ``clean_ids``; the corrupt prompt itself gives an
    unchanged grid). ``reduce`` maps logits ``[n, vocab]`` to a metric ``[n]``. The clean run
    is one forward; the grid ``ceil(cells / batch_size)`` batched forwards (see the module
    docstring); ``progress(runs done, runs)`` after each. Raises UsageError when the prompts' token
    counts differ, or for an unknown site.
    """
    if site not in SITES:
        raise UsageError(f"unknown site '{site}'; use one of {', '.join(SITES)}")
    source_ids = list(clean_ids if source_ids is None else source_ids)
    if not (len(clean_ids) == len(corrupt_ids) == len(source_ids)):
        raise UsageError(f"the prompts have different token counts: {len(clean_ids)} and {len(corrupt_ids)}")
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read logits from")
    layers = tuple(range(lm.n_layers)) if layers is None else tuple(layers)
    names = [hook_name(layer, site) for layer in layers]
    # The clean, corrupt and source runs: one forward of equally long prompts (no padding). Both
    # metrics come from the same batch, so identical prompts give identical metrics.
    batch = pad_batch(lm, [clean_ids, corrupt_ids, source_ids])
    with torch.inference_mode(), capture(lm, names) as source:
        clean, corrupt = metric_logits(lm, run_batch(lm, batch)[:2, -1], reduce)
    n = len(corrupt_ids)
    columns = tuple(range(lm.n_heads)) if SITES[site].per_head else tuple(range(n))
    rows = []
    for layer, name in zip(layers, names):
        act = source[name][2]                                 # [pos, width]
        for c in columns:
            if SITES[site].per_head:
                value = act[:, c * lm.d_head:(c + 1) * lm.d_head]
                rows.append([Edit(site, layer, head=c, value=value)])
            else:
                rows.append([Edit(site, layer, positions=(c,), value=act[c:c + 1])])
    _, edited = run_edits(lm, corrupt_ids, rows, position=-1, batch_size=batch_size, reduce=reduce,
                          progress=progress)
    grid = edited.reshape(len(layers), len(columns), *edited.shape[1:])
    return PatchRun(site=site, layers=layers, columns=columns, clean=clean, corrupt=corrupt, grid=grid)


def ablation_rows(lm: LoadedModel, *, components: Sequence[str], mode: Mode,
                  layers: Sequence[int] | None = None) -> list[tuple[int, str, int | None, list[Edit]]]:
    """One row per (layer, component) knocking that component out at every position.

    ``components``: ``attn`` (site attn_out), ``mlp`` (mlp_out), ``head`` (every head of the
    layer separately, site head). ``mode``: ``zero`` or ``mean``. Returns
    ``[(layer, component, head or None, [edit])]`` in layer order, ready for :func:`run_edits`.
    """
    if mode not in ("zero", "mean"):
        raise UsageError(f"unknown ablation mode '{mode}'; use zero or mean")
    layers = tuple(range(lm.n_layers)) if layers is None else tuple(layers)
    out: list[tuple[int, str, int | None, list[Edit]]] = []
    for layer in layers:
        for component in components:
            if component == "head":
                out += [(layer, "head", h, [Edit("head", layer, head=h, mode=mode)]) for h in range(lm.n_heads)]
            else:
                site = {"attn": "attn_out", "mlp": "mlp_out"}[component]
                out.append((layer, component, None, [Edit(site, layer, mode=mode)]))
    return out


@contextmanager
def _hooks(lm: LoadedModel, rows: Sequence[Sequence[Edit | ExpertEdit]], starts: Sequence[int],
           n_tokens: int) -> Iterator[None]:
    """Hooks for one forward: grow the batch at each row's first layer, then apply the edits.

    ``rows`` are sorted by ``starts``; row j of the chunk is batch row ``j + 1`` (row 0 is the
    unedited prompt). Grow hooks come first: PyTorch runs a module's pre-hooks in registration
    order, so a resid_pre edit of block l sees the grown batch.
    """
    joining: dict[int, int] = defaultdict(int)
    for s in starts:
        if s < lm.n_layers:
            joining[s] += 1
    by_point: dict[str, list[tuple[int, Edit]]] = defaultdict(list)
    experts: list[tuple[int, ExpertEdit]] = []
    for j, row in enumerate(rows, start=1):
        for edit in row:
            if isinstance(edit, ExpertEdit):
                experts.append((j, edit))
            else:
                by_point[edit.hook_name()].append((j, edit))
    hooks: list[tuple[str, HookFn]] = [(sites.name(layer, sites.Point.resid_pre), _grow(n_new))
                                       for layer, n_new in sorted(joining.items())]
    hooks += [(name, partial(_apply, lm, edits=edits)) for name, edits in by_point.items()]
    with attach(lm, hooks), attach_modules(expert_edits.hooks(lm, experts, n_tokens), raw=True):
        yield


def _grow(n_new: int) -> HookFn:
    def grow(h: torch.Tensor) -> torch.Tensor:
        # Row 0 is the unedited prompt: new rows start as copies of it at this block's input.
        return torch.cat([h, h[:1].expand(n_new, *h.shape[1:])])
    return grow


def _apply(lm: LoadedModel, t: torch.Tensor, edits: list[tuple[int, Edit]]) -> torch.Tensor:
    """``t [batch, pos, width]`` with each (batch row, edit) applied; a new tensor."""
    t = t.clone()
    for row, edit in edits:
        cols = edit.columns(lm.d_head)
        where = list(edit.positions) if edit.positions is not None else slice(None)
        if edit.mode == "patch":
            if edit.value is None:
                raise ValueError("a patch edit needs a value")
            t[row, where, cols] = edit.value.to(t.device, t.dtype)
        elif edit.mode == "zero":
            t[row, where, cols] = 0
        elif edit.mode == "mean":
            t[row, where, cols] = t[row, :, cols].mean(dim=0, keepdim=True)
        else:
            raise ValueError(f"unknown mode {edit.mode!r}")
    return t
