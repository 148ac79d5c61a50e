"""The model a dictionary's metadata names (``model_name``, as fit-sae records it: models/resolve.py ``recorded``):
what ``features``, ``sae`` and ``circuit`` open when no model is given. The one place of that rule: the CLI, the
Python API and ``anatomy serve`` (which runs the CLI) all ask :func:`chosen` (``sae`` and ``features`` with the
dictionary they have read) or :func:`for_transcoders`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from anatomy_cli.errors import AnatomyError
from anatomy_cli.models.resolve import resolve
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.models.transcoders import describe
from anatomy_cli.tasks import notes


def named_model(name: str | None) -> str | None:
    """``name`` (a dictionary's ``model_name``) when it resolves to a model anatomy opens (a local folder or file, a
    packaged GGUF, a preset, a Hugging Face id in the cache or on the Hub), with a line saying so; else None
    (TransformerLens' names such as ``gpt2-small`` are no Hugging Face id)."""
    if not name:
        return None
    try:
        resolve(name, need="config")
    except AnatomyError:
        notes.info(f"the dictionary names the model {name!r}, which does not resolve here: the default model "
                   f"instead (give --model, or model= in Python)")
        return None
    notes.info(f"the model: {name} (as the dictionary's metadata names it; --model, or model= in Python, overrides)")
    return name


def chosen(spec: ModelSpec, given: bool, recorded: Callable[[], str | None]) -> ModelSpec:
    """The model to open: ``spec`` where its model was ``given``; else the model the dictionary records
    (``recorded``'s name, read only then, :func:`named_model`'s line said) with ``spec``'s loading options, where it
    resolves; else ``spec`` (the default model). ``given``: the API tells a model left out (``model=None``); the
    CLI cannot tell ``--model`` left out from ``--model`` naming the default model, and counts both as not given."""
    if given:
        return spec
    model = named_model(recorded())
    return spec if model is None else spec.replace(model=model)


def for_transcoders(spec: ModelSpec, given: bool, transcoders: str | Path) -> ModelSpec:
    """:func:`chosen` for the transcoder set at ``transcoders`` (circuit's ``--transcoders``)."""
    return chosen(spec, given, lambda: describe(transcoders).model_name)
