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

from anatomy_cli.declare.commands import COMMANDS

# Public name -> the module of this package that defines it: the commands' functions from their records
# (anatomy_cli/declare/commands.py), then what is no command.
_EXPORTS = {
    "_model": ("load", "ModelSpec", "PromptOptions", "LoadedModel"),
    "_results": ("Result",),
    "_hooks": ("hooks", "capture", "hook_names"),
    "_fit_lens": ("merge_lenses",),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
_WHERE.update({c.api[1]: c.api[0] for c in COMMANDS if c.api is not None})

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
