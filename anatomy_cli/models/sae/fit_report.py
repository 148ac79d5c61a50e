"""The fit report `fit-sae` writes beside each dictionary it fits (:data:`FIT_REPORT` in the dictionary's folder: the
block's record as fit-sae's JSON gives it, its held-out health under ``health``), and what a reader takes from it:
the held-out FVE, which `features` judges by the rule `fit-sae` and `circuit` apply
(:func:`anatomy_cli.analyses.sae.too_weak`). Standard library only."""

from __future__ import annotations

import json
from pathlib import Path

FIT_REPORT = "anatomy-fit.json"


def write(folder: str | Path, record: dict[str, object]) -> Path:
    """``record`` as ``folder``/:data:`FIT_REPORT` (JSON)."""
    path = Path(folder) / FIT_REPORT
    path.write_text(json.dumps(record, indent=1), encoding="utf-8")
    return path


def held_out_fve(dictionary: str | Path) -> tuple[float, int, Path] | None:
    """``(the held-out FVE, the positions it was measured on, the report's path)`` of the fit report beside
    ``dictionary`` (its folder, or the folder holding its file): the positions are its health's per-position L0s;
    None where there is none, or it gives no FVE or no L0s. ValueError (naming the file) where one is there but
    cannot be read (not UTF-8 JSON, or no file)."""
    where = Path(dictionary)
    path = (where if where.is_dir() else where.parent) / FIT_REPORT
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        reason = "not JSON" if isinstance(e, ValueError) else type(e).__name__
        raise ValueError(f"{path} cannot be read ({reason})") from e
    try:
        fve, l0 = report["health"]["fve"], report["health"]["l0"]
    except (KeyError, TypeError):
        return None
    return (float(fve), len(l0), path) if isinstance(fve, (int, float)) and isinstance(l0, list) else None
