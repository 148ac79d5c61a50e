"""The files `fit-lens` writes and resumes from: every one written atomically (a temporary file beside it, then a
rename), and a checkpoint resumed only when the settings it was written with are this run's; what every fit's
summary reports beside its figures (:class:`FitCosts`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.errors import UsageError

DTYPES = {"fp16": "float16", "fp32": "float32"}  # --dtype: the stored matrices' precision (torch names)
# A Jacobian lens file's key beside jlens' own: the digest of each fitted prompt's token ids, so that fit-lens merge
# can refuse fits that share a prompt
HASHES = "prompt_hashes"


@dataclass(frozen=True, kw_only=True)
class FitCosts:
    """A fit's summary beside its figures (``fit-lens jacobian``, ``fit-lens tuned``): the ``estimate`` printed
    before the fit, the ``timings`` measured, the held-out ``check`` (None: not run). Keywords, after the
    summary's own fields."""

    estimate: dict[str, object] | None = None
    timings: dict[str, object] | None = None
    check: dict[str, object] | None = None

    def costs(self) -> dict[str, object]:
        """The JSON form's last keys."""
        return {"estimate": self.estimate, "timings": self.timings, "held_out_check": self.check}


def atomic_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then a rename: never a half-written file."""
    import os

    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def resume(path: Path, settings: dict[str, Any], command: str = "fit-lens") -> dict[str, Any]:
    """The checkpoint at ``path`` (tensors on the CPU), when its ``"settings"`` are ``settings``; UsageError
    (one line, naming the settings that differ) otherwise."""
    import torch


    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"--checkpoint {path} is not a {command} checkpoint ({type(exc).__name__})") from None
    theirs = state.get("settings") if isinstance(state, dict) else None
    if theirs != settings:
        what = ", ".join(k for k in settings if not isinstance(theirs, dict) or theirs.get(k) != settings[k])
        raise UsageError(f"--checkpoint {path} was written with other settings ({what or 'not anatomy’s'}); "
                         "delete it or give another --checkpoint to start over")
    return state


def digest(value: object) -> str:
    """A sha256 of ``repr(value)``: the token ids a checkpoint was fitted on, in a few bytes."""
    import hashlib

    return hashlib.sha256(repr(value).encode()).hexdigest()
