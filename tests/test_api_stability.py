"""The public API's names and signatures are recorded in tests/data/api_signatures.json: a name that disappears
or a signature that changes fails here until that file is updated on purpose
(``python tests/test_api_stability.py`` rewrites it; say why in the commit)."""

from __future__ import annotations

import inspect
import json
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parent / "data" / "api_signatures.json"


def signatures() -> dict[str, str]:
    from anatomy_cli import api

    out = {}
    for name in api.__all__:
        obj = getattr(api, name)
        if name in ("ModelSpec", "PromptOptions", "LoadedModel", "Result"):
            obj = obj.__init__ if name != "LoadedModel" else obj
            out[name] = "class" if name == "LoadedModel" else str(inspect.signature(obj))
        else:
            out[name] = str(inspect.signature(obj))
    return out


def test_public_names_and_signatures_match_the_record():
    recorded = json.loads(RECORD.read_text(encoding="utf-8"))
    now = signatures()
    gone = sorted(set(recorded) - set(now))
    assert not gone, f"public names removed: {gone} (update {RECORD.name} on purpose)"
    changed = {n: (recorded[n], now[n]) for n in recorded if recorded[n] != now[n]}
    assert not changed, f"signatures changed (update {RECORD.name} on purpose): {changed}"
    added = sorted(set(now) - set(recorded))
    assert not added, f"new public names not recorded in {RECORD.name}: {added}"


def test_top_level_package_exposes_every_public_name():
    import anatomy_cli
    from anatomy_cli import api

    assert all(getattr(anatomy_cli, name) is getattr(api, name) for name in api.__all__)


if __name__ == "__main__":
    sys.path.insert(0, str(RECORD.parents[2]))
    RECORD.write_text(json.dumps(signatures(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
