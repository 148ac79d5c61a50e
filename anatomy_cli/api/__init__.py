"""The Python API: what the commands compute, as functions and result objects, for notebooks.

``import anatomy_cli as anatomy``, then ``lm = anatomy.load("gpt2")`` and ``anatomy.trace(lm, "Thank you
very")``. Every function takes a LoadedModel (or a ModelSpec, or a name) and prompts, with the command's options
as keywords (``prompts=PromptOptions(...)`` for ``--bos``/``--allow-special``/``--truncate``), runs the same code
the command runs and returns a :class:`Result`: the command's own frozen result object, with ``to_dict()`` (the
command's ``--format json``), ``to_pandas()``, ``plot()`` and a small HTML table. A list of prompts returns a
list. :func:`hooks` and :func:`capture` read or edit activations at anatomy's hook points (TransformerLens
names). docs/python.md lists the shapes and units.

The public names are :data:`__all__`; tests/data/api_signatures.json records their signatures and
tests/test_api_stability.py fails when one changes without that file. Everything outside this package is
private. The top layer (it calls the commands' own run functions); no torch at import time: each name is
imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module of this package that defines it.
_EXPORTS = {
    "_model": ("load", "ModelSpec", "PromptOptions", "LoadedModel"),
    "_results": ("Result",),
    "_hooks": ("hooks", "capture", "hook_names"),
    "_prompts": ("trace", "next_token", "lens", "heads", "attn", "route"),
    "_edits": ("dla", "ablate", "patch", "attribute", "drift"),
    "_sae": ("sae",),
    "_generation": ("generate", "steer"),
    "_corpus": ("corpus_stats",),
    "_diff": ("diff",),
    "_verify": ("verify",),
    "_fit_lens": ("fit_lens", "merge_lenses"),
    "_lens_eval": ("lens_eval",),
    "_fit_sae": ("fit_sae",),
    "_circuit": ("circuit",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
