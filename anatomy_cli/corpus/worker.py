"""The unit of work: a :class:`Worker` measures one shard of windows into a :class:`Partial`; :class:`Settings`."""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from anatomy_cli import engine
from anatomy_cli.corpus.activations import recording
from anatomy_cli.corpus.expert_sums import ExpertSums
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.settings import Settings as Settings  # re-exported: corpus.worker.Settings
from anatomy_cli.corpus.windows import Shard
from anatomy_cli.corpus.windows import batches
from anatomy_cli.errors import UsageError
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import refusal
from anatomy_cli.models.lens_choice import parse
from anatomy_cli.models.spec import ModelSpec

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from anatomy_cli.corpus.expert_sums import ExpertSums
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens


class Worker:
    """Loads the model once (or takes a loaded one); ``worker(shard)`` measures one shard into a :class:`Partial`.

    The callable-class pattern of Ray Data's ``map_batches``: a Ray actor wraps exactly this class.
    ``crash_once = (marker_path, shard_index)`` is fault injection for tests: the first worker process to
    reach that shard creates the marker and exits at once (as a killed worker would).
    """

    def __init__(self, spec: dict[str, Any], settings: dict[str, Any], *, lm: LoadedModel | None = None,
                 crash_once: tuple[str, int] | None = None):
        self.settings = Settings(**settings)
        self.lm = lm if lm is not None else engine.load(ModelSpec.from_dict(spec))
        self.lenses = open_lenses(self.lm, self.settings.lens)
        covered = self.lm.tokenizer.text_bytes()
        self.token_bytes = np.zeros(max(len(covered), self.lm.vocab_size), np.int64)  # past the tokenizer: 0
        self.token_bytes[:len(covered)] = covered
        self.crash_once = crash_once
        self.saved: dict[str, list[torch.Tensor]] = {}  # with save_activations: the last shard's, per site and batch

    def __call__(self, shard: Shard, on_window: Callable[[int, int], None] | None = None) -> Partial:
        """``on_window(windows, tokens)``: called after each batch of windows is measured (progress)."""
        import torch

        from anatomy_cli.corpus.measure import measure

        crash_if_marked(self.crash_once, shard.index)
        lm, s = self.lm, self.settings
        part = Partial(lm.n_layers, lm.n_heads, lm.d_model, tuple(kind for kind, fitted in self.lenses if fitted),
                       experts=_expert_sums(lm) if s.experts else None)
        group = list(shard.windows)
        self.saved = {site: [] for site in s.save_activations}
        for start, end in batches(shard, s.batch_size):
            ids = torch.tensor(group[start:end], dtype=torch.long)
            with recording(lm, s.save_activations, self.saved, (ids.shape[0], ids.shape[1])):
                measure(lm, ids, part, first_window=shard.first_window + start, lenses=self.lenses,
                        lens_every=s.lens_every, heads=s.heads, token_bytes=self.token_bytes)
            if on_window is not None:
                on_window(end - start, int(ids.numel()))
        return part

    def run(self, shard: Shard) -> Partial:
        """``self(shard)``, under a name a Ray actor handle exposes."""
        return self(shard)


def open_lenses(lm: LoadedModel, lenses: tuple[str, ...]) -> list[tuple[str, FittedLens | None]]:
    """``(kind, FittedLens or None)`` per lens text (``logit``: None), each fitted lens checked against ``lm`` and
    its tensors moved to ``lm``'s device once, in float32 (a worker reads them for every batch)."""
    import torch

    from anatomy_cli.engine.fitted_lens import open_lens

    out: list[tuple[str, FittedLens | None]] = []
    for text in lenses:
        choice = parse(text)
        fitted = open_lens(choice, d_model=lm.d_model, n_layers=lm.n_layers)
        if fitted is not None:
            weights = {row: (a.to(lm.device, torch.float32), None if b is None else b.to(lm.device, torch.float32))
                       for row, (a, b) in fitted.weights.items()}
            fitted = dataclasses.replace(fitted, weights=weights)
        out.append((choice.kind, fitted))
    return out


def _expert_sums(lm: LoadedModel) -> ExpertSums:
    """Empty :class:`~anatomy_cli.corpus.expert_sums.ExpertSums` for ``lm``'s MoE blocks."""

    moe = lm.info.moe
    if moe is None:  # the task refused a dense model before anything loaded; a direct caller gets the same

        raise UsageError(refusal(lm.info, Need.moe, "corpus --experts"))
    return ExpertSums.empty(moe.sparse_blocks, moe.n_experts, moe.top_k)


def crash_if_marked(crash_once: tuple[str, int] | None, index: int) -> None:
    """Fault injection for tests: with ``crash_once = (marker_path, shard_index)``, the first process to reach
    that shard creates the marker and exits at once (as a killed worker would); later ones go on."""
    if crash_once and index == crash_once[1]:
        try:
            fd = os.open(crash_once[0], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os._exit(1)
