"""Options shared by several commands (Typer ``Annotated`` aliases).

Keep names and help texts here so every command spells them the same way.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.output.render import Format


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
        from anatomy_cli.models.resolve import check_path

        check_path(value)
    return value


ModelOpt = Annotated[
    str,
    typer.Option("--model", "-m", callback=_model_exists,
                 help="Preset name, .gguf file, local directory (save_pretrained), Hugging Face model id, "
                 "ollama:NAME[:TAG] or lmstudio:PUBLISHER/REPO (`anatomy models` lists them)."),
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
    from anatomy_cli.output.plots import check_path

    return check_path(value)


# Pictures (anatomy_cli.output.plots): the suffix and the directory are checked by plots.check_path.
PlotOpt = Annotated[
    Optional[Path],
    typer.Option("--plot", metavar="FILE", show_default=False, callback=_plot_path,
                 help="Also draw the result to FILE; its suffix picks the format: .png, .svg, .pdf or .html (an "
                 "interactive page with hover values that opens offline). Results "
                 "still go to stdout. With '-' (stdin) prompts: one file per prompt, FILE-1.png, FILE-2.png, "
                 "... See docs/plots.md."),
]

# --target/--foil (next, trace, lens, dla, ablate, patch); turned into token ids by anatomy_cli.text.targets.
TargetOpt = Annotated[Optional[str], typer.Option(
    "--target", "-t", metavar="TEXT", show_default=False,
    help="A token to follow: its probability and rank. TEXT must be exactly one token "
    "(mind the leading space: ' much').")]
TargetIdOpt = Annotated[Optional[int], typer.Option(
    "--target-id", metavar="N", min=0, show_default=False, help="The target given by its token id instead of text.")]
FoilOpt = Annotated[Optional[str], typer.Option(
    "--foil", metavar="TEXT", show_default=False,
    help="A second token: report logit(target) - logit(foil). One token, like --target.")]
FoilIdOpt = Annotated[Optional[int], typer.Option(
    "--foil-id", metavar="N", min=0, show_default=False, help="The foil given by its token id instead of text.")]
FirstTokenOpt = Annotated[bool, typer.Option(
    "--first-token", help="A --target TEXT of several tokens stands for its first token (said on stderr) "
    "instead of being an error.")]
FirstTokenFoilOpt = Annotated[bool, typer.Option(
    "--first-token", help="A --target or --foil TEXT of several tokens stands for its first token (said on "
    "stderr) instead of being an error.")]
