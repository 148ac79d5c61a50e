"""What the server keeps loaded: models and ``tokens --model`` tokenizers, each keyed by the files it came from.

A cached entry remembers the identity of every file it was built from
(:func:`anatomy_cli.models.identity.file_identity`: path, size,
mtime_ns and inode; a directory's files, a GGUF file, a Hub id's cached snapshot). Every request compares
that identity with the files as they are now and reloads when they differ, so a checkpoint re-saved in
place (``save_pretrained`` over a served directory, a new ``model.safetensors`` copied in, a tokenizer
re-saved alone) is what the next request sees. Weights are copied into the server's own memory at load
(:func:`own_memory`): a memory-mapped file rewritten under a running server would otherwise crash it
with a bus error.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.models.identity import FileId
from anatomy_cli.models.identity import file_identity
from anatomy_cli.models.identity import named_file as _named_file
from anatomy_cli.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.loader import Loader
    from anatomy_cli.engine.opening import OpenedModel
    from anatomy_cli.models.resolve import Source
    from anatomy_cli.serve.protocol import ModelRow


def changed_files(old: tuple[FileId, ...], new: tuple[FileId, ...]) -> list[str]:
    """Names of the files that differ between two identities (added, removed or rewritten)."""
    before, after = {f[0]: f for f in old}, {f[0]: f for f in new}
    return sorted(Path(p).name for p in set(before) | set(after) if before.get(p) != after.get(p))


def own_memory(model: torch.nn.Module) -> int:
    """Copy every CPU parameter and buffer of ``model`` into memory this process owns; how many were copied.

    safetensors (and a GGUF's unquantized tensors) are memory-mapped from the checkpoint: a file rewritten
    in place under the mapping ends the process with SIGBUS at the next touch. Tied weights stay tied
    (``parameters()`` yields a shared tensor once and the copy replaces its data in place). Each copy keeps
    its original's alignment, so results stay bit-identical to an in-process run on the mapped file.
    """
    import torch

    copied = 0
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            if tensor.device.type == "cpu":
                tensor.data = _copy_aligned_as(tensor.data)
                copied += 1
    return copied


def _copy_aligned_as(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in fresh memory at the same address modulo 64 bytes as ``t``.

    CPU matrix kernels pick their code path by the operands' alignment, and the last bits of a float32 result
    with it; a copy aligned as the mapped original computes exactly what an in-process run computes.
    """
    import torch

    if not t.is_contiguous() or t.numel() == 0:
        return t.clone()
    size = t.element_size()
    buf = torch.empty(t.numel() + 64 // size, dtype=t.dtype)
    shift = ((t.data_ptr() - buf.data_ptr()) % 64) // size
    out = buf[shift:shift + t.numel()].view(t.shape)
    out.copy_(t)
    return out


@dataclasses.dataclass
class Entry:
    """One cached model: the model, what it was built from, and how often it was reloaded."""

    lm: LoadedModel
    spec: ModelSpec
    files: tuple[FileId, ...]
    bytes: int
    reloads: int = 0
    last_reload: str | None = None


class ModelCache:
    """A :class:`~anatomy_cli.engine.loader.Loader` with a cache in front: opened models (config, tokenizer,
    ModelInfo) and loaded models by request key and file identity, least recently used loaded models evicted
    first beyond ``max_bytes``.

    ``loader`` does the real work (``engine.loader.DIRECT`` in the server); the server hands the cache to the
    commands it runs (``engine.loader.using_loader``). ``loading`` holds the specs being loaded right now
    (``serve --status`` lists them). ``log`` gets one line per reload.
    """

    def __init__(self, loader: Loader | None, max_bytes: int | None, log: Callable[[str], None] = print):
        self.loader = loader
        self.max_bytes = max_bytes
        self.log = log
        self.models: OrderedDict[tuple, Entry] = OrderedDict()
        self.opened: dict[tuple, tuple[tuple[FileId, ...], OpenedModel]] = {}
        self.loading: dict[tuple, ModelSpec] = {}
        self.lock = threading.Lock()

    @staticmethod
    def key(spec: ModelSpec) -> tuple:
        """The spec's JSON form with a local path made absolute (relative paths mean the client's directory)."""
        args = spec.to_dict()
        path = _named_file(spec.model) or Path(spec.model).expanduser()  # ollama:/lmstudio: by their file
        if path.exists():
            args["model"] = str(path.resolve())
        return tuple(sorted((k, str(v)) for k, v in args.items()))

    def open(self, spec: ModelSpec) -> OpenedModel:
        """The opened model (no weights), from the cache while the model's files are unchanged."""
        key, files = self.key(spec), file_identity(spec.model)
        with self.lock:
            cached = self.opened.get(key)
        if cached is not None and cached[0] == files:
            return dataclasses.replace(cached[1], spec=spec)  # named as this request names it
        assert self.loader is not None  # the server's worker sets it before running a request
        opened = self.loader.open(spec)
        with self.lock:
            self.opened[key] = (files, opened)
        return opened

    def load(self, spec: ModelSpec) -> LoadedModel:
        """Both phases (``serve --model`` preloads)."""
        return self.load_weights(self.open(spec))

    def load_weights(self, opened: OpenedModel) -> LoadedModel:
        """The loaded model for ``opened``, from the cache while its files are unchanged (else reloaded, said in
        the log)."""
        spec = opened.spec
        key, files = self.key(spec), file_identity(spec.model)
        with self.lock:
            entry = self.models.get(key)
            if entry is not None:
                self.models.move_to_end(key)
        reloads, why = 0, None
        if entry is not None and entry.files != files:
            changed = ", ".join(changed_files(entry.files, files)) or "its files"
            why = f"{changed} changed on disk at {time.strftime('%H:%M:%S')}"
            self.log(f"reloading {dict(key)['model']}: {why}")
            reloads = entry.reloads + 1
            with self.lock:
                self.models.pop(key, None)
            entry = None
        if entry is not None:
            # Named as this request names it (headings, titles), not as the first request did.
            return dataclasses.replace(entry.lm, name=spec.model)
        with self.lock:
            self.loading[key] = spec
        try:
            assert self.loader is not None  # the server's worker sets it before running a request
            lm = self.loader.load_weights(opened)
            if getattr(lm, "model", None) is not None:
                own_memory(lm.model)
        finally:
            with self.lock:
                self.loading.pop(key, None)
        with self.lock:
            self.models[key] = Entry(lm, spec, files, _model_bytes(lm), reloads, why)
            self._evict()
        return lm

    def _evict(self) -> None:
        def total() -> int:
            return sum(e.bytes for e in self.models.values())

        while self.max_bytes is not None and len(self.models) > 1 and total() > self.max_bytes:
            self.models.popitem(last=False)

    def summary(self) -> list[ModelRow]:
        """One row per model, most recently used first, then the ones loading: ``serve --status``'s table.

        ``spec`` is the ModelSpec's JSON form; ``device`` where the model actually runs (``cpu``, not ``auto``).
        """
        with self.lock:
            rows: list[ModelRow] = [{"model": dict(k)["model"], "state": "ready", "dtype": e.spec.dtype,
                     "device": str(getattr(e.lm, "device", e.spec.device)), "init": e.spec.init, "bytes": e.bytes,
                     "reloads": e.reloads, "last_reload": e.last_reload, "spec": e.spec.to_dict()}
                    for k, e in reversed(self.models.items())]
            rows += [{"model": dict(k)["model"], "state": "loading", "dtype": s.dtype, "device": s.device,
                      "init": s.init, "bytes": None, "reloads": 0, "last_reload": None, "spec": s.to_dict()}
                     for k, s in self.loading.items()]
        return rows


class TokenizerCache:
    """``tokens --model`` tokenizers by source and file identity, the ``max_items`` most recently used kept:
    building one from a GGUF file's vocabulary takes seconds."""

    def __init__(self, load: Callable[..., PreTrainedTokenizerBase], max_items: int = 8):
        self._load = load
        self.max_items = max_items
        self.items: OrderedDict[tuple, PreTrainedTokenizerBase] = OrderedDict()

    def load(self, source: Source, **options: object) -> PreTrainedTokenizerBase:
        path = Path(source.ref)
        local = source.kind in ("dir", "gguf") and path.exists()
        key = (source.kind, str(path.resolve()) if local else source.ref,
               file_identity(str(path)) if local else (), tuple(sorted((k, str(v)) for k, v in options.items())))
        if key in self.items:
            self.items.move_to_end(key)
            return self.items[key]
        tok = self._load(source, **options)
        self.items[key] = tok
        while len(self.items) > self.max_items:
            self.items.popitem(last=False)
        return tok


def _model_bytes(lm: LoadedModel) -> int:
    model = getattr(lm, "model", None)
    if model is None:
        return 0
    tensors = list(model.parameters()) + list(model.buffers())
    return sum(t.numel() * t.element_size() for t in tensors if t.device.type != "meta")


def clear_stray_hooks(cache: ModelCache) -> int:
    """Remove anatomy hooks a request left behind (there should be none); how many were removed.

    Only anatomy's own: transformers installs output-capturing hooks once per model and relies on them.
    """
    removed = 0
    for entry in list(cache.models.values()):
        for module in entry.lm.model.modules():
            for hooks in (module._forward_hooks, module._forward_pre_hooks):
                for key, fn in list(hooks.items()):
                    if getattr(getattr(fn, "func", fn), "__module__", "").startswith("anatomy_cli"):
                        del hooks[key]
                        removed += 1
    return removed

