"""`anatomy convert FILE.gguf --to DIR`: a GGUF file's dequantized weights, config and tokenizer as a directory."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated

import typer

from anatomy_cli.cli.app import info
from anatomy_cli.cli.app import status
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import model_options
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import convert as task

if TYPE_CHECKING:
    from anatomy_cli.engine import LoadedModel


@command("convert", task.ConvertOptions)
@model_options(fields=("dtype",))
def convert_command(
    model: Annotated[str, typer.Argument(
        metavar="FILE.gguf", show_default=False,
        help="A .gguf file, or a model name that resolves to one (smollm2, gemma3-270m).")],
    opts: task.ConvertOptions,
    spec: ModelSpec = ModelSpec(),
) -> None:
    """Write a GGUF file's weights, dequantized, as a directory that --model loads.

    The directory holds model.safetensors (the weights as anatomy loads
    them, in --dtype; tied weights stored once), config.json and the
    tokenizer's files: what save_pretrained writes, which transformers
    refuses for a GGUF-loaded model. Its logits equal the GGUF file's.

    Examples:

    \b
        anatomy convert SmolLM2-135M-Instruct.Q4_1.gguf --to ./smollm2-fp32
        anatomy convert smollm2 --to ./source
        anatomy convert model.gguf --to ./model-bf16 --dtype bf16
    """
    to = opts.to
    _check_target(to, opts.overwrite)
    opened = open_model(spec.replace(model=model, device="cpu"))
    if opened.source is None or opened.source.kind != "gguf":
        raise UsageError(f"{model} is not a GGUF file: convert reads .gguf files "
                         "(a directory or Hub model loads with --model as it is)")
    lm = load_weights(opened)
    with status(f"writing {to}"):
        write_directory(lm, to)
    info(f"wrote {to}: {lm.name} ({lm.dequantized_from or 'GGUF'}) dequantized to {spec.dtype}")
    typer.echo(str(to))


def _check_target(to: Path, overwrite: bool) -> None:
    if to.exists() and not to.is_dir():
        raise UsageError(f"--to {to} is a file, not a directory")
    if to.is_dir() and any(to.iterdir()) and not overwrite:
        raise UsageError(f"--to {to} is not empty: choose a new directory, or add --overwrite")


def write_directory(lm: LoadedModel, out: Path) -> None:
    """``lm``'s weights (model.safetensors, shared tensors once), config.json without the GGUF
    quantization entry, generation_config.json where there is one, and the tokenizer's files."""
    from safetensors.torch import save_model

    out.mkdir(parents=True, exist_ok=True)
    model = lm.model
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain tensors now
    config.architectures = [type(model).__name__]
    config.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None and model.can_generate():
        model.generation_config.save_pretrained(out)
    save_model(model, str(out / "model.safetensors"), metadata={"format": "pt"})
    # The GGUF loader hands transformers' tokenizer (the light HFTokenizer protocol declares no saving).
    save_tokenizer = getattr(lm.tokenizer.hf, "save_pretrained", None)
    if save_tokenizer is None:
        raise CheckpointError(f"{lm.name}'s tokenizer cannot be saved: wrote the weights and config only")
    save_tokenizer(out)
