"""``corpus --save-activations SITE[,SITE] --out DIR``: the activations the run's forwards stream, saved for
training sparse autoencoders.

Layout (next to the run's manifest and shards, see :mod:`anatomy_cli.corpus.store`)::

    DIR/activations/index.parquet                                one row per (shard, site)
    DIR/activations/<site>/shard-00000.safetensors               one shard's rows at one site

Each safetensors file holds, for every position of every window of its shard, in window order:
``activations`` ``[rows, width]`` (float32, or float16 with ``--activation-dtype fp16``), ``token_ids``
(int64: the token at that position), ``document`` and ``offset`` (int64: which document of the source, in
order, and which of its tokens; -1 for a BOS the window starts with), ``window`` and ``position`` (int64: the
window's global index and the position in it). The index's columns: ``shard``, ``site``, ``file``, ``rows``,
``first_window``, ``first_document``, ``first_token`` (the document and its token offset of the shard's first
row that is not a BOS), ``sha256``; its schema metadata ``anatomy.activations`` holds the sites, the dtype,
``ctx``, ``bos`` and ``width`` per site.

The values are those the run's first forward of each batch of windows sees (with ``--heads``, the second,
eager-attention forward is not what is saved). Resume: a listed file whose SHA-256 or row count is not the
index's, or that is missing, has its shard computed again; files are written under temporary names and
renamed, and the index lists a file only once it is in place, so a killed run resumed writes the same files.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from safetensors import safe_open

from anatomy_cli import engine
from anatomy_cli.corpus.store import _atomic
from anatomy_cli.corpus.windows import Shard
from anatomy_cli.corpus.windows import shards
from anatomy_cli.corpus.windows import token_stream
from anatomy_cli.corpus.windows import windows
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.identity import file_sha256
from anatomy_cli.models.sites import WRITE_SITES
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import parse_point
from anatomy_cli.models.sites import spelled
from anatomy_cli.models.written import as_user_file

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from anatomy_cli.corpus.settings import Settings
    from anatomy_cli.corpus.sources import Source
    from anatomy_cli.engine.model import LoadedModel
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.text.tokenization import Tokenizer

SITES = (*WRITE_SITES, Site.head)
"""The hook points ``--save-activations`` takes (:func:`anatomy_cli.models.sites.parse_point`)."""
DTYPES = {"fp32": "float32", "fp16": "float16"}
COLUMNS = ("shard", "site", "file", "rows", "first_window", "first_document", "first_token", "sha256")
_ID_BITS = 32  # a token id packed with its (document, offset) into one int for the window planner


def parse_sites(text: str) -> tuple[str, ...]:
    """``SITE[,SITE]`` as given to ``--save-activations``, without repeats. Raises UsageError for a name that
    is not a hook point anatomy saves (no model needed)."""
    sites = tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if not sites:
        raise UsageError("--save-activations needs at least one hook point, e.g. blocks.6.hook_resid_post")
    for site in sites:
        if parse_point(site, SITES) is None:
            raise UsageError(f"--save-activations: '{site}' is not a hook point; use {spelled(SITES)}")
    return sites


def check_sites(sites: tuple[str, ...], info: ModelInfo, name: str) -> None:
    """Raise UsageError for a site past the model's layers (from its config, before any weight loads)."""
    for site in sites:
        point = parse_point(site, SITES)
        if point is not None and point[0] >= info.n_layers:
            raise UsageError(f"--save-activations: {name} has {info.n_layers} layers (blocks.0 to blocks."
                             f"{info.n_layers - 1}), not {site}")


def plan(source: Source, tokenizer: Tokenizer, settings: Settings, documents: dict[int, list[tuple[int, ...]]],
         ) -> Iterator[Shard]:
    """The shards :func:`anatomy_cli.corpus.runner.plan` makes, and into ``documents[shard index]`` each
    window's ``document << 32 | offset`` per position (-1 for BOS): every token id travels through the
    planner packed with where it came from, so the windows are cut exactly as the run's."""
    hf = tokenizer.hf
    bos = hf.bos_token_id if settings.bos and hf.bos_token_id is not None else None
    flags: list[bool] = []

    def pieces() -> Iterator[tuple[str, bool]]:
        for text, last in source.pieces():
            flags.append(last)
            yield text, last

    def packed() -> Iterator[list[int]]:
        doc = offset = 0
        for k, ids in enumerate(token_stream(pieces(), hf, allow_special=settings.allow_special,
                                             eos=hf.eos_token_id)):
            yield [((doc << _ID_BITS | offset + j) << _ID_BITS) | i for j, i in enumerate(ids)]
            offset += len(ids)
            if flags[k]:
                doc, offset = doc + 1, 0

    mark = None if bos is None else (-1 << _ID_BITS) | bos  # unpacks to (-1, bos)
    mask = (1 << _ID_BITS) - 1
    for shard in shards(windows(packed(), ctx=settings.ctx, bos=mark, max_tokens=settings.max_tokens),
                        settings.shard_windows):
        documents.clear()  # in-process, a shard is saved before the next is planned
        documents[shard.index] = [tuple(v >> _ID_BITS for v in w) for w in shard.windows]
        yield Shard(shard.index, shard.first_window, tuple(tuple(v & mask for v in w) for w in shard.windows))


@contextmanager
def recording(lm: LoadedModel, sites: tuple[str, ...], saved: dict[str, list[torch.Tensor]],
              shape: tuple[int, int]) -> Iterator[None]:
    """Hooks for one batch of windows ``shape = (batch, T)``: the first forward's activation at each site is
    appended to ``saved[site]`` as ``[batch * T, width]`` (a copy, on the CPU)."""
    if not sites:
        yield
        return
    first: dict[str, torch.Tensor] = {}

    def keep(site: str, t: torch.Tensor) -> None:
        if site not in first:
            first[site] = t.detach().reshape(shape[0] * shape[1], -1).to("cpu", copy=True)

    with engine.attach(lm, [(site, _bind(keep, site)) for site in sites]):
        yield
    for site in sites:
        saved[site].append(first[site])


def _bind(fn: Callable[[str, torch.Tensor], None], site: str) -> Callable[[torch.Tensor], None]:
    return lambda t: fn(site, t)


def _save(tensors: dict[str, torch.Tensor], meta: dict[str, str], path: str) -> None:
    from safetensors.torch import save_file

    save_file(tensors, path, metadata=meta)
    as_user_file(path)


class ActivationStore:
    """``DIR/activations``: :meth:`check` a shard read back, :meth:`save` one computed."""

    def __init__(self, root: Path, settings: Settings, *, overwrite: bool = False):
        import pyarrow.parquet as pq

        self.root = Path(root) / "activations"
        self.settings = settings
        self.sites = tuple(settings.save_activations)
        self.documents: dict[int, list[tuple[int, ...]]] = {}
        self.rows: list[dict[str, Any]] = []
        self.widths: dict[str, int] = {}
        index = self.root / "index.parquet"
        if overwrite and self.root.exists():
            shutil.rmtree(self.root)
        elif index.exists():
            try:
                table = pq.read_table(index)
                self.rows = table.to_pylist()
                meta = json.loads(table.schema.metadata[b"anatomy.activations"])
                self.widths = {k: int(v) for k, v in meta.get("width", {}).items()}
            except Exception:  # a damaged index: every shard is computed again
                self.rows = []
        self.rows = [r for r in self.rows if r["site"] in self.sites]

    def plan(self, source: Source, tokenizer: Tokenizer, settings: Settings) -> Iterator[Shard]:
        return plan(source, tokenizer, settings, self.documents)

    def check(self, index: int) -> str | None:
        """Why shard ``index``'s files cannot be used (missing, damaged), dropping its rows; None if all are whole."""
        listed = {r["site"]: r for r in self.rows if r["shard"] == index}
        why = None
        for site in self.sites:
            row = listed.get(site)
            path = self.root / row["file"] if row else None
            if row is None or path is None or not path.is_file():
                why = f"activations at {site} missing"
            elif file_sha256(path) != row["sha256"]:
                why = f"activations at {site} damaged (its checksum is not the index's)"
            else:
                try:
                    with safe_open(str(path), "pt") as f:
                        rows = f.get_slice("activations").get_shape()[0]
                except Exception as exc:
                    why = f"activations at {site} damaged ({str(exc).splitlines()[0] if str(exc) else exc!r})"
                else:
                    if rows != row["rows"]:
                        why = f"activations at {site} damaged ({rows} rows, the index says {row['rows']})"
            if why:
                break
        if why:
            self.rows = [r for r in self.rows if r["shard"] != index]
            self._write_index()
        return why

    def save(self, shard: Shard, saved: dict[str, list[torch.Tensor]]) -> None:
        """Write shard ``shard``'s file at every site, then list them in the index."""
        import torch

        codes = torch.tensor([c for w in self.documents.pop(shard.index) for c in w], dtype=torch.long)
        marks = codes < 0
        extra = {
            "token_ids": torch.tensor([i for w in shard.windows for i in w], dtype=torch.long),
            "document": torch.where(marks, -1, codes >> _ID_BITS),
            "offset": torch.where(marks, -1, codes & ((1 << _ID_BITS) - 1)),
            "window": torch.tensor([shard.first_window + k for k, w in enumerate(shard.windows) for _ in w]),
            "position": torch.tensor([p for w in shard.windows for p in range(len(w))]),
        }
        real = (~marks).nonzero()
        first = int(real[0, 0]) if len(real) else 0
        dtype = getattr(torch, DTYPES[self.settings.activation_dtype])
        for site in self.sites:
            acts = torch.cat(saved[site]).to(dtype)
            if dtype == torch.float16 and not torch.isfinite(acts).all():
                raise AnatomyError(f"an activation at {site} is past float16's range (65504); "
                                   "use --activation-dtype fp32")
            self.widths[site] = int(acts.shape[1])
            name = f"{site}/shard-{shard.index:05d}.safetensors"
            (self.root / site).mkdir(parents=True, exist_ok=True)
            tensors = {"activations": acts.contiguous(), **extra}
            # One metadata key: safetensors writes its metadata map in no fixed order.
            meta = {"anatomy": json.dumps({"site": site, "shard": shard.index,
                                           "dtype": DTYPES[self.settings.activation_dtype]}, sort_keys=True)}
            _atomic(self.root / name, partial(_save, tensors, meta))
            self.rows = [r for r in self.rows if (r["shard"], r["site"]) != (shard.index, site)]
            self.rows.append({"shard": shard.index, "site": site, "file": name, "rows": int(acts.shape[0]),
                              "first_window": shard.first_window, "first_document": int(extra["document"][first]),
                              "first_token": int(extra["offset"][first]), "sha256": file_sha256(self.root / name)})
        self._write_index()

    def _write_index(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = sorted(self.rows, key=lambda r: (r["shard"], self.sites.index(r["site"])))
        schema = pa.schema([(c, pa.string() if c in ("site", "file", "sha256") else pa.int64()) for c in COLUMNS])
        s = self.settings
        meta = {"sites": list(self.sites), "dtype": DTYPES[s.activation_dtype], "ctx": s.ctx, "bos": s.bos,
                "width": {k: self.widths[k] for k in self.sites if k in self.widths}}
        table = pa.Table.from_pylist(rows, schema=schema.with_metadata(
            {"anatomy.activations": json.dumps(meta, sort_keys=True)}))
        self.root.mkdir(parents=True, exist_ok=True)
        _atomic(self.root / "index.parquet", lambda tmp: pq.write_table(table, tmp))
