"""`anatomy verify`: prove the engine's numbers on this model, dtype and device, in one command."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.commands._common import read_prompts_file
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import PlotOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import AnatomyError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import emit
from anatomy_cli.output.render import resolve_format
from anatomy_cli.tasks import verify as task
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


def _read_prompts(path: str | None) -> list[str] | None:
    return None if path is None else read_prompts_file(path)


@command("verify", task.VerifyOptions)
@model_options()
@prompt_options()
def verify_command(
    prompts_file: Annotated[Optional[str], typer.Option(
        "--prompts", metavar="FILE|-", help="Prompts to check on, one per line ('-': stdin); default four "
        "built-in ones.")] = None,
    opts: task.VerifyOptions = task.VerifyOptions(),
    detail: Annotated[bool, typer.Option(
        "--detail", help="Every check's row in the table (the default on a terminal is one line per section; "
        "tsv, csv and json always carry every row).")] = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Check anatomy's numbers on this model: each row a check, its error, its tolerance, pass or fail.

    Sections: 1 parity with transformers' own forward (every residual point per layer against
    output_hidden_states, the final norm, the logits, attention patterns against output_attentions);
    2 identities exact up to rounding (the residual decomposition, the lens at the last layer, DLA rows,
    self-patching, batched against one by one, attribution patching on a linear metric); 3 precision
    (the fp32 control for --dtype bf16/fp16); 4 devices (CPU against CUDA/MPS when present); 5 known
    answers of trained models (induction and previous-token heads, IOI, capitals); 6 a .gguf file against
    llama.cpp when llama-cpp-python is installed (with --against llama.cpp: required). On a terminal one line
    per section (--detail: every row). Exit 0 when every check passes, 1 when any fails (named on stderr) or
    when --against llama.cpp cannot run, 2 on a usage error.

    Examples:

    \b
        anatomy verify --model model.Q4_1.gguf
        anatomy verify --model model.Q4_1.gguf --quick
        anatomy verify --model model.Q4_1.gguf --detail
        anatomy verify --model model.Q4_1.gguf --plot verify.html
        anatomy verify --model ./my-checkpoint --dtype bf16 --format json
        anatomy verify --init random --against transformers
        printf 'Thank you very\\nThe capital of France is\\n' | anatomy verify --prompts - --quick
    """
    view = when_run("output.views.verify")

    given = _read_prompts(prompts_file)
    opts = dataclasses.replace(opts, prompt=tuple(given) if given else None)
    opened, encoded = open_texts(opts.texts, spec, prompts)
    plan = task.check(opened, encoded, opts, untrained=spec.init == "random")
    lm = load_weights(opened)

    def reload(dtype: str, device: str) -> LoadedModel:
        return load_weights(open_model(dataclasses.replace(spec, dtype=dtype, device=device, device_map=None,
                                                           max_memory=None, offload_folder=None)))

    result = task.run(lm, encoded, reload, plan)
    summary = not detail and resolve_format(fmt) is Format.table
    emit(view.report(lm, result, encoded, plan, summary=summary), fmt)
    if plot:
        plots = when_run("output.plots")

        args, kwargs = view.figure(lm, result, encoded)
        plots.draw("verify", plot, None, *args, **kwargs)
    failed = task.failure(result)
    if failed:
        raise AnatomyError(failed)
