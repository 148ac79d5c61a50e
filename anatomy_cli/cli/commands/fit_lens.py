"""`anatomy fit-lens jacobian --prompts FILE --out lens.pt`: fit a Jacobian lens (jlens' estimator and format);
`anatomy fit-lens tuned --corpus PATH --tokens N --out DIR`: a tuned lens (tuned-lens' recipe and format)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.commands._common import read_prompts_file
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import MODEL_OPTIONS
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import fit_lens as task
from anatomy_cli.text.options import PromptOptions


@command("fit-lens", task.FitLensOptions)
@model_options(fields=tuple(o[0] for o in MODEL_OPTIONS if o[0] != "dtype"))  # fitted in fp32; --dtype: the file's
@prompt_options()
def fit_lens_command(
    kind: Annotated[str, typer.Argument(metavar="KIND", show_default=False,
                                        help="The lens to fit: jacobian, tuned; or merge (FILES: fits to merge).")],
    out: Annotated[Path, typer.Option("--out", metavar="FILE|DIR", show_default=False,
                                      help="The lens to write: a .pt file (jacobian, merge) or a directory (tuned).")],
    files: Annotated[Optional[list[Path]], typer.Argument(
        metavar="FILES", show_default=False, help="merge: the Jacobian lens files to merge.")] = None,
    prompts_file: Annotated[Optional[str], typer.Option(
        "--prompts", metavar="FILE|-", show_default=False,
        help="The prompts to fit on, one per non-empty line ('-': stdin).")] = None,
    opts: task.FitLensOptions = task.FitLensOptions(),
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
) -> None:
    """Fit a Jacobian lens on prompts (jlens' format) or a tuned lens on a corpus (tuned-lens' format).

    jlens' estimator: per prompt one forward of the ids replicated --dim-batch times and
    ceil(d_model / dim-batch) backward passes, each a one-hot cotangent on one output dimension of the
    target block at every valid position; row d of J_N is the gradient at block N's output averaged over
    positions --skip-first .. n-2; J is the mean over the prompts. Prompts too short are skipped and counted.
    The expected cost is printed before the fit starts. --checkpoint FILE resumes an interrupted fit (in
    this process or with --ray); --shard i/N fits every N-th prompt; --ray fits the prompts on Ray workers
    (as corpus --ray runs: a killed worker's shard runs again). fit-lens merge A.pt B.pt --out C.pt: the
    n_prompts-weighted mean of fits of one model (no model is loaded).

    fit-lens tuned: tuned-lens' recipe: a zero-initialised translator per residual row below the last block,
    h + A h + b, trained on KL(final || lens) at every position of the corpus's first --tokens tokens (windows
    of --ctx), SGD with Nesterov momentum 0.9, lr 0.1 decayed linearly over --steps, weight decay 1e-3,
    gradient norm clipped to 1. --checkpoint FILE saves the training state every --checkpoint-every steps;
    run the same command again to resume it. Read the lens with lens --lens tuned:DIR.

    Examples:

    \b
        anatomy fit-lens jacobian --model smollm2 --prompts prompts.txt --out smollm2-jlens.pt
        anatomy fit-lens jacobian --model gpt2 --prompts prompts.txt --out gpt2.pt --source-layers 4-9 --dtype fp32
        anatomy fit-lens jacobian --model smollm2 --prompts prompts.txt --out lens.pt --ray --workers 4
        anatomy fit-lens merge part1.pt part2.pt --out lens.pt
        anatomy fit-lens tuned --model smollm2 --corpus docs/ --tokens 100000 --ctx 512 --out smollm2-tuned
    """
    view = when_run("output.views.fit_lens")

    if kind == "merge":
        if prompts_file is not None:
            raise UsageError("fit-lens merge reads lens files, not prompts: drop --prompts")
        emit(view.merge_report(task.merge(list(files or []), out, dtype=opts.dtype, overwrite=opts.overwrite)), fmt)
        return
    if files:
        raise UsageError(f"fit-lens {kind} takes no FILES (they are for fit-lens merge): give --prompts FILE")
    if kind == "tuned" and prompts_file is not None:
        raise UsageError("fit-lens tuned reads --corpus PATH, not prompts: drop --prompts")
    texts = () if prompts_file is None else tuple(read_prompts_file(prompts_file))
    opts = dataclasses.replace(opts, kind=kind, prompt=texts, out=out)  # fails before anything opens
    task.before_open(spec, opts)  # --ctx past a GGUF's context, a Jacobian fit's blocks: refused before the open
    if kind == "tuned":
        opened = open_model(spec)
        plan = task.check(opened, opts)
        lm = load_weights(opened)
        emit(view.report(lm, task.run(lm, [], opts, plan)), fmt)
        return
    opened, encoded = open_texts(list(opts.prompt), spec, prompts)
    plan = task.check(opened, opts, encoded)
    model = opened if opts.ray else load_weights(opened)  # on Ray the workers load the weights
    emit(view.report(model, task.run(model, encoded, opts, plan)), fmt)
