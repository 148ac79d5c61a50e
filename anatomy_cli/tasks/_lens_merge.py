"""`fit-lens merge A.pt B.pt --out C.pt`: Jacobian lens fits of one model and one set of blocks as one file (the
``n_prompts``-weighted mean, :func:`anatomy_cli.engine.jacobian_fit.merge_states`). No model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.engine.checkpoint import atomic_save
from anatomy_cli.errors import UsageError
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._checks import out_path
from anatomy_cli.tasks._fit_files import DTYPES
from anatomy_cli.tasks._fit_files import HASHES
from anatomy_cli.units import counted


@dataclass(frozen=True)
class MergedLens:
    """``fit-lens merge``: the fits read (``inputs``, their ``counts`` of prompts) and the merged file ``out``."""

    out: str
    inputs: tuple[str, ...]
    counts: tuple[int, ...]
    source_layers: tuple[int, ...]
    d_model: int
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "n_prompts": sum(self.counts), "source_layers": list(self.source_layers),
                "d_model": self.d_model, "dtype": self.dtype,
                "inputs": [{"file": f, "n_prompts": n} for f, n in zip(self.inputs, self.counts)]}


def merge(files: list[Path], out: Path, *, dtype: str = "fp16", overwrite: bool = False) -> MergedLens:
    """Jacobian lens files (jlens' format) of one model and one set of blocks as one: the ``n_prompts``-weighted
    mean, equal to one fit on all their prompts. Raises UsageError for fewer than two files, a file given twice, a
    file that is not a lens, fits that share a prompt (:func:`refuse_overlaps`), fits of different shapes, an
    existing ``out`` without ``overwrite``. The merged file records the prompts' hashes when every input does."""
    import torch

    from anatomy_cli.engine import jacobian_fit

    if len(files) < 2:
        raise UsageError("fit-lens merge takes two or more lens files: fit-lens merge A.pt B.pt --out C.pt")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: use fp16 (jlens' files) or fp32")
    out = out_path("--out", out)
    if out.exists() and not overwrite:
        raise UsageError(f"--out {out} exists: give --overwrite to replace it")
    seen: dict[Path, Path] = {}
    for f in files:
        where = Path(f).expanduser().resolve()
        first = seen.setdefault(where, f)
        if first is not f:
            twice = f"{f} is given twice" if str(first) == str(f) else f"{first} and {f} are the same file ({where})"
            raise UsageError(f"fit-lens merge: {twice}: give each fit once")
    states = [_read(f) for f in files]
    refuse_overlaps(files, states)
    try:
        merged = jacobian_fit.merge_states(states, getattr(torch, DTYPES[dtype]))
    except ValueError as exc:
        raise UsageError(f"fit-lens merge: {exc}") from None
    if all(HASHES in s for s in states):
        merged[HASHES] = [h for s in states for h in s[HASHES]]
    atomic_save(merged, out)
    return MergedLens(str(out), tuple(map(str, files)), tuple(int(s["n_prompts"]) for s in states),
                      tuple(sorted(int(b) for b in states[0]["J"])), int(states[0]["d_model"]), dtype)


def _read(f: Path) -> dict[str, Any]:
    """The lens file ``f`` (tensors memory-mapped); UsageError for a missing file or one that is not a lens."""
    import torch


    try:
        state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise UsageError(f"fit-lens merge: {f} does not exist") from None
    except Exception:
        raise UsageError(f"fit-lens merge: {f} is not a Jacobian lens file (torch.load cannot read it)") from None
    if not isinstance(state, dict) or not {"J", "n_prompts", "d_model"} <= set(state):
        raise UsageError(f"fit-lens merge: {f} is not a Jacobian lens file (it needs \"J\", \"n_prompts\", "
                         "\"d_model\")")
    return state


def refuse_overlaps(files: list[Path], states: list[dict[str, Any]]) -> None:
    """UsageError naming both files when two fits share a prompt (their ``prompt_hashes``: a sha256 of each fitted
    prompt's tokens, which fit-lens writes) or, where either file records none (written before them), when they
    hold the same fit (the same ``n_prompts`` and equal ``J``). A file without hashes is said once on stderr."""
    import torch


    for f, s in zip(files, states):
        if HASHES not in s:
            notes.warn(f"fit-lens merge: {f} records no prompt hashes (written before anatomy recorded them): "
                       "a prompt it shares with another file is not caught, only the same fit given twice")
    for j, (g, b) in enumerate(zip(files, states)):
        for f, a in zip(files[:j], states[:j]):
            if HASHES in a and HASHES in b:
                shared = len(set(a[HASHES]) & set(b[HASHES]))
                if shared:
                    raise UsageError(f"fit-lens merge: {f} and {g} share {counted(shared, 'prompt')} "
                                     "(their prompt hashes): merged, each would count twice")
            elif int(a["n_prompts"]) == int(b["n_prompts"]) and sorted(a["J"]) == sorted(b["J"]) and all(
                    torch.equal(a["J"][k], b["J"][k]) for k in a["J"]):
                raise UsageError(f"fit-lens merge: {f} and {g} hold the same fit: give each fit once")
