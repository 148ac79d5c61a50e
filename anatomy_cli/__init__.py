"""anatomy: inspect the anatomy of transformer language models from the shell, or from Python.

``import anatomy_cli as anatomy``: the names of :mod:`anatomy_cli.api` (``anatomy.load``, ``anatomy.trace``,
``anatomy.lens``, ``anatomy.hooks``, ...; see docs/python.md) are attributes of the package, imported on first
use (PEP 562), so importing the package imports no torch and the CLI's start-up pays nothing for them.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name.startswith("_"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    api = _api()
    if name not in api.__all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(api, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_api().__all__))


def _api() -> ModuleType:
    # By name: the package's own modules (cli.app reads __version__) must not depend on the top layer.
    return importlib.import_module("anatomy_cli.api")
