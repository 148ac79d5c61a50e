"""``--lens logit|tuned:DIR|jacobian:FILE``: which lens reads the residual stream (parsed without torch)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.errors import UsageError

KINDS = ("logit", "tuned", "jacobian")


@dataclass(frozen=True)
class LensChoice:
    """``logit`` (path None), ``tuned`` with a tuned-lens directory, or ``jacobian`` with a Jacobian lens file."""

    kind: str = "logit"
    path: Path | None = None

    @property
    def text(self) -> str:
        return self.kind if self.path is None else f"{self.kind}:{self.path}"


def parse(text: str | None) -> LensChoice:
    """``logit``, ``tuned:DIR``, ``jacobian:FILE`` (None: logit). Raises UsageError for anything else."""
    if text is None or text == "logit":
        return LensChoice()
    kind, sep, path = text.partition(":")
    if kind not in ("tuned", "jacobian") or not sep or not path:
        raise UsageError(f"--lens {text!r}: use logit, tuned:DIR (a tuned-lens directory) or jacobian:FILE "
                         "(a Jacobian lens .pt file)")
    where = Path(path).expanduser()
    if kind == "jacobian" and not where.is_file() or kind == "tuned" and not where.is_dir():
        # before anything opens: a path that is not there needs no model to be refused
        what = "a Jacobian lens is a file" if kind == "jacobian" else "a tuned lens is a directory"
        raise UsageError(f"--lens: {path} does not exist" if not where.exists() else f"--lens {text}: {what}")
    return LensChoice(kind, where)
