"""`fit-lens merge A.pt B.pt --out C.pt`: Jacobian lens fits of one model and one set of blocks as one file (the
``n_prompts``-weighted mean, :func:`anatomy_cli.engine.jacobian_fit.merge_states`). No model is loaded."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.tasks._fit_files import DTYPES
from anatomy_cli.tasks._fit_files import atomic_save


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
    mean, equal to one fit on all their prompts. Raises UsageError for fewer than two files, a file that is not a
    lens, fits of different shapes, an existing ``out`` without ``overwrite``."""

    import torch

    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.errors import UsageError

    if len(files) < 2:
        raise UsageError("fit-lens merge takes two or more lens files: fit-lens merge A.pt B.pt --out C.pt")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: use fp16 (jlens' files) or fp32")
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise UsageError(f"--out {out} exists: give --overwrite to replace it")
    states = []
    for f in files:
        try:
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except FileNotFoundError:
            raise UsageError(f"fit-lens merge: {f} does not exist") from None
        except Exception as exc:
            raise UsageError(f"fit-lens merge: {f} is not a Jacobian lens file ({type(exc).__name__})") from None
        if not isinstance(state, dict) or not {"J", "n_prompts", "d_model"} <= set(state):
            raise UsageError(f"fit-lens merge: {f} is not a Jacobian lens file (it needs \"J\", \"n_prompts\", "
                             "\"d_model\")")
        states.append(state)
    try:
        merged = jacobian_fit.merge_states(states, getattr(torch, DTYPES[dtype]))
    except ValueError as exc:
        raise UsageError(f"fit-lens merge: {exc}") from None
    atomic_save(merged, out)
    return MergedLens(str(out), tuple(map(str, files)), tuple(int(s["n_prompts"]) for s in states),
                      tuple(sorted(int(b) for b in states[0]["J"])), int(states[0]["d_model"]), dtype)
