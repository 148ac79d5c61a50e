"""``features --delphi DIR``: the nonzero activations in delphi's latent-cache layout, so that delphi's own loaders
(``delphi.latents.LatentDataset``, its ``TensorBuffer``) read what anatomy wrote.

delphi's layout (``delphi/latents/cache.py``, ``LatentCache.save_splits`` and ``save_config``, EleutherAI/delphi at
3c2e139)::

    DIR/<hook>/<start>_<end>.safetensors   the features start..end (inclusive): ``locations [n, 3]`` (uint16, or
                                           uint32 past 65535) = (batch, position, feature - start), ``activations
                                           [n]`` (float16), ``tokens [batch, seq]`` (every window's tokens)
    DIR/<hook>/config.json                 delphi's CacheConfig fields and ``model_name``

Here a "batch" row is one of the run's windows (its global index); the last window, when shorter, is padded with
the tokenizer's pad id (else its EOS, else 0), and no activation is recorded at a padded position. The followed
features' range is cut into ``n_splits`` (5, delphi's default) equal ranges as delphi cuts its width
(``torch.linspace``). A nonzero activation is one with ``|a| > 1e-5`` in delphi; here one ``> 0`` (every
activation anatomy's dictionaries give is ``>= 0``; an activation in ``(0, 1e-5]`` is kept).

While the run goes, each shard's entries wait in ``DIR/.shards/shard-NNNNN.npz`` (written before the run's
manifest lists the shard, so a resumed run finds them); at the end the splits are written from them, one split at
a time (entries ordered by window, position, feature), and the folder is removed. A finished run run again (its
shards resumed from ``--out``) reads the entries of the shards it resumes back from DIR's splits. DIR is created
by the first shard saved, after the run's ``--out`` is opened, so DIR may lie inside ``--out`` (``--out feats
--delphi feats/latents``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from anatomy_cli.corpus.store import _atomic
from anatomy_cli.corpus.windows import Shard
from anatomy_cli.errors import AnatomyError

N_SPLITS = 5


def split_edges(lo: int, hi: int, n_splits: int = N_SPLITS) -> list[tuple[int, int]]:
    """``(start, end)`` inclusive of ``n_splits`` ranges over ``lo..hi`` (as delphi's ``_generate_split_indices``
    over ``0..width``), empty ones left out."""
    n = hi - lo + 1
    bounds = [lo + (n * i) // n_splits for i in range(n_splits + 1)]
    return [(a, b - 1) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


class DelphiWriter:
    """``DIR`` (``root``) for the module ``hook``; :meth:`save` a shard's entries, :meth:`finish` the splits."""

    def __init__(self, root: Path, hook: str, *, overwrite: bool = False):
        self.root, self.hook = Path(root), hook
        self.parts = self.root / ".shards"
        if overwrite and self.parts.exists():
            shutil.rmtree(self.parts)
        # nothing is created here: DIR may lie inside --out, whose emptiness the run's store checks first
        self.reusable = not overwrite and not self.parts.exists() and self.finished()  # before any shard is saved

    def _path(self, index: int) -> Path:
        return self.parts / f"shard-{index:05d}.npz"

    def check(self, index: int) -> str | None:
        """Why a finished shard's entries cannot be used (missing: neither its own file nor a finished cache's
        splits hold them), else None."""
        return None if self._path(index).is_file() or self.reusable else "its delphi entries are missing"

    def finished(self) -> bool:
        """DIR holds the cache a finished run wrote (config.json and splits): a rerun of that run (``--out``'s
        shards resumed, DIR holding no entries of a run under way: :attr:`reusable`) reads its entries back from
        the splits."""
        module = self.root / self.hook
        return (module / "config.json").is_file() and any(module.glob("*_*.safetensors"))

    def save(self, shard: Shard, nonzero: list[tuple[np.ndarray, np.ndarray]]) -> None:
        locations = np.concatenate([loc for loc, _ in nonzero]) if nonzero else np.zeros((0, 3), np.int64)
        acts = np.concatenate([a for _, a in nonzero]) if nonzero else np.zeros(0, np.float32)
        width = max(len(w) for w in shard.windows)
        tokens = np.full((len(shard.windows), width), -1, np.int64)
        for i, w in enumerate(shard.windows):
            tokens[i, :len(w)] = w

        def write(tmp: str) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, locations=locations, activations=acts, tokens=tokens,
                         first_window=np.int64(shard.first_window))

        self.parts.mkdir(parents=True, exist_ok=True)
        _atomic(self._path(shard.index), write)

    def finish(self, shards: int, features: np.ndarray, pad: int, config: dict[str, object]) -> list[Path]:
        """Write the splits and config.json from the ``shards`` shards' entries; the files written."""
        from safetensors.numpy import save_file

        module = self.root / self.hook
        edges = split_edges(int(features.min()), int(features.max()))
        files = [np.load(self._path(i)) for i in range(shards) if self._path(i).is_file()]
        if len(files) < shards:  # a rerun of a finished run: the entries of the shards it read back are the splits'
            files.append(self._kept(module, edges, [f["tokens"].shape[0] for f in files],
                                    [int(f["first_window"]) for f in files], config))
        ctx = max(f["tokens"].shape[1] for f in files)
        tokens = np.concatenate([np.pad(f["tokens"], ((0, 0), (0, ctx - f["tokens"].shape[1])), constant_values=-1)
                                 for f in files])
        tokens = tokens[np.argsort(np.concatenate([f["windows"] if isinstance(f, dict) else
                                                   f["first_window"] + np.arange(f["tokens"].shape[0])
                                                   for f in files]), kind="stable")]  # in window order
        tokens[tokens < 0] = pad
        module.mkdir(parents=True, exist_ok=True)
        written = []
        for start, end in edges:
            locs, acts = [], []
            for f in files:  # one split's entries at a time
                keep = (f["locations"][:, 2] >= start) & (f["locations"][:, 2] <= end)
                locs.append(f["locations"][keep])
                acts.append(f["activations"][keep])
            loc, act = np.concatenate(locs), np.concatenate(acts)
            order = np.lexsort((loc[:, 2], loc[:, 1], loc[:, 0]))  # by window, position, feature: as one pass
            loc, act = loc[order], act[order]  # records them, also where some came from an earlier run's splits
            loc[:, 2] -= start
            small = not len(loc) or (loc[:, 2].max() < 2 ** 16 and loc[:, 0].max() < 2 ** 16)
            data = {"locations": loc.astype(np.uint16 if small else np.uint32),
                    "activations": act.astype(np.float16), "tokens": tokens}
            path = module / f"{start}_{end}.safetensors"
            _atomic(path, lambda tmp, d=data: save_file(d, tmp))
            written.append(path)
        text = json.dumps(config, indent=4) + "\n"
        _atomic(module / "config.json", lambda tmp: Path(tmp).write_text(text))
        shutil.rmtree(self.parts, ignore_errors=True)
        return [*written, module / "config.json"]

    def _kept(self, module: Path, edges: list[tuple[int, int]], counts: list[int], firsts: list[int],
              config: dict[str, object]) -> dict[str, object]:
        """The entries and windows a finished cache's splits hold outside the windows of the shards whose own
        files are here (``firsts``, ``counts``: their first windows and window counts), as one shard file's
        arrays, with ``windows`` (each token row's window) in place of ``first_window``."""
        from safetensors.numpy import load_file

        try:
            held = json.loads((module / "config.json").read_text())
            same = all(held.get(k) == config[k] for k in ("n_tokens", "cache_ctx_len"))
        except (OSError, ValueError):
            same = False
        if not self.reusable or not same or not all((module / f"{a}_{b}.safetensors").is_file() for a, b in edges):
            raise AnatomyError(f"{self.parts}: the entries of some finished shards are missing, and {module} holds "
                               f"no cache of this run to read them from: run again with --overwrite")
        locs, acts, tokens = [], [], np.zeros((0, 0), np.int64)
        for start, end in edges:
            split = load_file(str(module / f"{start}_{end}.safetensors"))
            tokens = split["tokens"].astype(np.int64)
            here = np.zeros(len(tokens), bool)
            for first, n in zip(firsts, counts):
                here[first:first + n] = True
            loc = split["locations"].astype(np.int64)
            keep = ~here[loc[:, 0]]
            loc = loc[keep]
            loc[:, 2] += start  # the feature's id, as a shard's file holds it
            locs.append(loc)
            acts.append(split["activations"][keep].astype(np.float32))
        rows = np.flatnonzero(~here)
        return {"locations": np.concatenate(locs), "activations": np.concatenate(acts), "tokens": tokens[rows],
                "windows": rows}
