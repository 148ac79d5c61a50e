"""Options shared by several commands (Typer ``Annotated`` aliases), and the two option groups.

Keep names and help texts here so every command spells them the same way. The model options (``--model``,
``--device``, ``--dtype``, ``--init``, ``--trust-remote-code``, ``--device-map``, ``--max-memory``,
``--offload-folder``) are declared once, in :data:`MODEL_OPTIONS`; :func:`model_options` puts them into a
command's signature in place of its ``spec`` parameter and hands the command one validated
:class:`~anatomy_cli.models.spec.ModelSpec`. :func:`prompt_options` does the same for ``--bos``,
``--allow-special`` and ``--truncate`` and a :class:`~anatomy_cli.text.options.PromptOptions`.
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import Optional
from typing import TypeVar
from typing import cast

import typer

from anatomy_cli.declare import shared
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.models.defaults import default_model as user_default
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format
from anatomy_cli.text.options import PromptOptions


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class DType(str, Enum):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Init(str, Enum):
    pretrained = "pretrained"
    random = "random"


FormatOpt = Annotated[
    Optional[Format],
    typer.Option("--format", "-f", help="Output format. Default: table on a terminal, tsv when piped.",
                 case_sensitive=False, show_default=False),
]
def _model_exists(value: str | None) -> str | None:
    # A model path that does not exist fails while the options are parsed, before torch is imported.
    if value:

        check_path(value)
    return value


def default_model() -> str:
    """``--model``'s default, resolved when a command runs: ``ANATOMY_MODEL``, else the stored
    ``anatomy models --default``, else gpt2 (:mod:`anatomy_cli.models.defaults`). The one place it is read."""
    return user_default()


ModelOpt = Annotated[
    str,
    typer.Option("--model", "-m", callback=_model_exists,
                 help="Preset name, .gguf file, local directory (save_pretrained), Hugging Face model id, "
                 "ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO or a packaged file's name such as smollm2 "
                 "(`anatomy models` lists them). Default: $ANATOMY_MODEL, else the one set by "
                 "`anatomy models --default NAME`, else gpt2."),
]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Device to run on.", case_sensitive=False)]
DTypeOpt = Annotated[DType, typer.Option("--dtype", help="Weight and activation dtype.", case_sensitive=False)]
InitOpt = Annotated[
    Init,
    typer.Option("--init", help="'random': build the model from its config with random weights "
                 "(fixed seed; output labelled untrained). Needs no download.", case_sensitive=False),
]
TrustRemoteCodeOpt = Annotated[
    bool,
    typer.Option("--trust-remote-code", help="Allow a checkpoint's own Python code to run (off by default)."),
]


class DeviceMap(str, Enum):
    auto = "auto"
    balanced = "balanced"
    sequential = "sequential"


# Big models (accelerate's big-model inference); parsed and checked in anatomy_cli.models.bigmodel.
DeviceMapOpt = Annotated[
    Optional[DeviceMap],
    typer.Option("--device-map", case_sensitive=False, show_default=False,
                 help="Spread the model over GPUs, CPU and disk with accelerate: 'auto'/'balanced' even out "
                 "the GPUs, 'sequential' fills them in order. Replaces --device. Default: one device. "
                 "See docs/big-models.md."),
]
MaxMemoryOpt = Annotated[
    Optional[str],
    typer.Option("--max-memory", metavar="DEVICE=SIZE,...", show_default=False,
                 help="Weight budget per device for --device-map, e.g. 0=20GiB,cpu=60GiB (GPU index, cpu, mps, "
                 "disk). What fits no budget is offloaded to disk."),
]
OffloadFolderOpt = Annotated[
    Optional[Path],
    typer.Option("--offload-folder", metavar="DIR", file_okay=False, show_default=False,
                 help="Where disk-offloaded weights are re-saved when they cannot be read in place from the "
                 "checkpoint's safetensors files (.bin checkpoints, MoE experts)."),
]

def _plot_path(value: Path | None) -> Path | None:
    # Checked while the options are parsed: a bad suffix or directory fails before any model loads.
    return when_run("output.plots").check_path(value)


# Pictures (anatomy_cli.output.plots): the suffix and the directory are checked by plots.check_path.
PlotOpt = Annotated[
    Optional[Path],
    typer.Option("--plot", metavar="FILE", show_default=False, callback=_plot_path,
                 help="Also draw the result to FILE; its suffix picks the format: .png, .svg, .pdf or .html (an "
                 "interactive page with hover values that opens offline). Results "
                 "still go to stdout. With '-' (stdin) prompts: one file per prompt, FILE-1.png, FILE-2.png, "
                 "... See docs/plots.md."),
]


def html_plot(command: str, help: str, *, in_out: bool = False) -> Any:
    """The ``--plot FILE.html`` option of a command that draws one kind of picture, an interactive page (circuit,
    features): ``Annotated[Optional[Path], html_plot(...)]``. Any other suffix is refused, naming ``command``
    (then the shared checks of the directory). ``in_out``: FILE may lie in the command's ``--out DIR``, which the
    command creates: a folder that does not exist yet is left to the command (``plots.check_path(..., made=)``)."""

    def check(value: Path | None) -> Path | None:
        plots = when_run("output.plots")

        if value is not None and not plots.is_html(value):
            got = f"not '{value.suffix}'" if value.suffix else "no suffix"
            raise UsageError(f"--plot {str(value)!r}: {command} draws an interactive page: give a .html file ({got})")
        return plots.check_path(value, made=value.parent if in_out and value is not None else None)

    return typer.Option("--plot", metavar="FILE.html", show_default=False, callback=check, help=help)


# --lens (lens, trace, generate): parsed by anatomy_cli.models.lens_choice.
LENS_METAVAR = shared.LENS_METAVAR

# --target/--foil (next, trace, lens, dla, ablate, patch); turned into token ids by anatomy_cli.text.targets.
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", "-t", metavar="TEXT", show_default=False,
    help="A token to follow: its probability and rank. TEXT must be exactly one token "
    "(mind the leading space: ' much').")]
TargetIdOpt = Annotated[Optional[int], typer.Option(
    "--target-id", metavar="N", min=0, show_default=False, help="The target given by its token id instead of text.")]
FirstTokenOpt = Annotated[bool, typer.Option(
    "--first-token", help="A --target TEXT of several tokens stands for its first token (said on stderr) "
    "instead of being an error.")]


class Truncate(str, Enum):
    left = "left"


TruncateOpt = Annotated[Optional[Truncate], typer.Option(
    "--truncate", case_sensitive=False, show_default=False,
    help="'left': keep the last tokens of a prompt longer than the model's context (said on stderr). "
    "Default: such a prompt is an error.")]
BosOpt = Annotated[Optional[bool], typer.Option(
    "--bos/--no-bos", show_default=False,
    help="Prepend the tokenizer's BOS token, or not. Default: as the model's own tokenizer does "
    "(add_bos_token; GGUF: tokenizer.ggml.add_bos_token): Gemma, Llama and Mistral yes, GPT-2 and SmolLM2 no. "
    "A prompt that already starts with it keeps one.")]
AllowSpecialOpt = Annotated[bool, typer.Option(
    "--allow-special", help="Read special-token text in prompts, such as <|endoftext|>, as that special token. "
    "Default: it is plain text, split like any other text.")]
ChatOpt = Annotated[bool, typer.Option(
    "--chat", help="Wrap each prompt in the model's chat template as one user turn and the assistant's opening "
    "(apply_chat_template, add_generation_prompt): for instruct models. An error when the model has none.")]

# (parameter, annotation, default): the one declaration of each group, in --help order.
MODEL_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("model", ModelOpt, default_model),
    ("device", DeviceOpt, Device.auto),
    ("dtype", DTypeOpt, DType.fp32),
    ("init", InitOpt, Init.pretrained),
    ("trust_remote_code", TrustRemoteCodeOpt, False),
    ("device_map", DeviceMapOpt, None),
    ("max_memory", MaxMemoryOpt, None),
    ("offload_folder", OffloadFolderOpt, None),
)
PROMPT_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("bos", BosOpt, None),
    ("allow_special", AllowSpecialOpt, False),
    ("truncate", TruncateOpt, None),
    ("chat", ChatOpt, False),
)

OUTPUT_OPTIONS: tuple[tuple[str, object, object], ...] = (
    ("plot", PlotOpt, None),
    ("fmt", FormatOpt, None),
)


@dataclass(frozen=True)
class Output:
    """Where a command's result goes: ``fmt`` (``--format``; None: table on a terminal, tsv piped) and ``plot``
    (``--plot FILE``; None: no picture)."""

    plot: Path | None = None
    fmt: Format | None = None


F = TypeVar("F", bound=Callable[..., object])


def model_options(*, fields: tuple[str, ...] | None = None, param: str = "spec") -> Callable[[F], F]:
    """Replace the command's ``param`` parameter by the model options and pass it a ``ModelSpec``.

    ``fields``: the options to offer (default: all of :data:`MODEL_OPTIONS`); those left out keep the
    ModelSpec's defaults (``diff`` names its two models as arguments: ``fields=("device", "dtype",
    "trust_remote_code")`` and ``spec.replace(model=...)``).
    """

    chosen = [o for o in MODEL_OPTIONS if fields is None or o[0] in fields]
    return _group(param, chosen, ModelSpec)


def prompt_options(*, truncate: bool = True, param: str = "prompts") -> Callable[[F], F]:
    """Replace the command's ``param`` parameter by ``--bos/--no-bos``, ``--allow-special``, (unless
    ``truncate=False``) ``--truncate`` and ``--chat``, and pass it a ``PromptOptions``."""

    chosen = [o for o in PROMPT_OPTIONS if truncate or o[0] != "truncate"]
    return _group(param, chosen, PromptOptions)


def output_options(*, plot: bool = True, param: str = "out") -> Callable[[F], F]:
    """Replace the command's ``param`` parameter by ``--plot FILE`` (unless ``plot=False``) and ``--format``, and
    pass it an :class:`Output`."""
    chosen = [o for o in OUTPUT_OPTIONS if plot or o[0] != "plot"]
    return _group(param, chosen, Output)


def _group(param: str, options: list[tuple[str, object, object]], build: Callable[..., object]) -> Callable[[F], F]:
    names = [name for name, _, _ in options]

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        hints = typing.get_type_hints(fn, include_extras=True)
        if param not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no parameter '{param}' for its options")
        params: list[inspect.Parameter] = []
        for p in sig.parameters.values():
            if p.name == param:
                params += [inspect.Parameter(n, p.kind, default=d, annotation=a)
                           for n, a, d in options]
            else:
                params.append(p.replace(annotation=hints.get(p.name, p.annotation)))

        @functools.wraps(fn)
        def wrapper(*args: object, **kwargs: object) -> object:
            kwargs[param] = build(**{n: kwargs.pop(n) for n in names if n in kwargs})
            return fn(*args, **kwargs)

        # A function takes any attribute; typeshed declares no __signature__ (which inspect.signature reads).
        wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = {p.name: p.annotation for p in params}
        if "return" in hints:
            wrapper.__annotations__["return"] = hints["return"]
        return cast(F, wrapper)

    return decorate
