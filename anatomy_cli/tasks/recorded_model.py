"""The model a dictionary's metadata names (``model_name``, as fit-sae records it: models/resolve.py ``recorded``):
what ``features``, ``sae`` and ``circuit`` open when ``--model`` is left out."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.errors import AnatomyError
from anatomy_cli.models.resolve import resolve
from anatomy_cli.models.transcoders import describe
from anatomy_cli.tasks import notes


def named_model(name: str | None) -> str | None:
    """``name`` (a dictionary's ``model_name``) when it resolves to a model anatomy opens (a local folder or file, a
    packaged GGUF, a preset, a Hugging Face id in the cache or on the Hub), with a line saying so; else None
    (TransformerLens' names such as ``gpt2-small`` are no Hugging Face id). For a ``--model`` left out (the CLI
    cannot tell it from ``--model`` naming the default model): another, it wins."""
    if not name:
        return None
    try:
        resolve(name, need="config")
    except AnatomyError:
        notes.info(f"the dictionary names the model {name!r}, which does not resolve here: the default model "
                   f"instead (give --model)")
        return None
    notes.info(f"the model: {name} (as the dictionary's metadata names it; --model overrides)")
    return name


def dictionary_model(sae: str | Path, hook: str | None) -> str | None:
    """:func:`named_model` of the dictionary at ``sae`` (``hook``: one block of a circuit-tracer set)."""
    from anatomy_cli.models.ct_block import read_dictionary

    return named_model(read_dictionary(Path(sae), hook=hook, values=False).model_name)


def transcoders_model(transcoders: str | Path) -> str | None:
    """:func:`named_model` of the transcoder set at ``transcoders`` (circuit's ``--transcoders``)."""
    return named_model(describe(transcoders).model_name)
