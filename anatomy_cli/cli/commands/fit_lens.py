"""`anatomy fit-lens jacobian --prompts FILE --out lens.pt`: fit a Jacobian lens (jlens' estimator and format);
`anatomy fit-lens tuned --corpus PATH --tokens N --out DIR`: a tuned lens (tuned-lens' recipe and format)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_model
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.commands._common import read_prompts_file
from anatomy_cli.cli.options import MODEL_OPTIONS
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text.options import PromptOptions


@app.command("fit-lens")
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
    source_layers: Annotated[Optional[str], typer.Option(
        "--source-layers", metavar="N,...", show_default=False,
        help="The blocks to fit (0,4-8); default every block below the target.")] = None,
    target_layer: Annotated[Optional[int], typer.Option(
        "--target-layer", metavar="N", show_default=False,
        help="The block J maps onto (default the last; negative counts from the end).")] = None,
    dim_batch: Annotated[int, typer.Option(
        "--dim-batch", min=1, help="Output dimensions per backward pass (copies of the prompt per forward).")] = 8,
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", min=2, help="Tokens kept per prompt.")] = 128,
    skip_first: Annotated[int, typer.Option(
        "--skip-first", min=0, help="Leading positions left out of the average (attention sinks).")] = 16,
    lens_dtype: Annotated[str, typer.Option("--dtype", metavar="fp16|fp32",
                                       help="The stored matrices' precision (fp16: as jlens saves).")] = "fp16",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace FILE if it exists.")] = False,
    shard: Annotated[Optional[str], typer.Option(
        "--shard", metavar="i/N", show_default=False,
        help="Fit prompts i, i+N, i+2N, ... only (0-based); merge the N files with fit-lens merge.")] = None,
    checkpoint: Annotated[Optional[Path], typer.Option(
        "--checkpoint", metavar="FILE", show_default=False,
        help="Save the fit's state here (jacobian: the running sums; tuned: translators, optimizer, schedule, "
             "step); resume from it when it exists (same settings only).")] = None,
    checkpoint_every: Annotated[int, typer.Option(
        "--checkpoint-every", min=1, metavar="N",
        help="Write --checkpoint every N prompts (tuned: steps) and after the last.")] = 1,
    ray: Annotated[bool, typer.Option(
        "--ray", help="jacobian: fit the prompts on Ray workers: at --ray-address, else RAY_ADDRESS, else a local "
        "Ray started for the run. Needs Ray (in a clone: pip install -e '.[ray]').")] = False,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", metavar="ADDRESS", show_default=False,
        help="The Ray cluster for --ray (ray://host:10001, auto).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Ray workers (actors), one model each.")] = 2,
    gpus_per_worker: Annotated[float, typer.Option("--gpus-per-worker", min=0.0, help="GPUs per Ray worker.")] = 0.0,
    corpus: Annotated[Optional[str], typer.Option(
        "--corpus", metavar="PATH|-", show_default=False,
        help="tuned: the text to train on (a file, a directory of .txt/.md, .jsonl/.csv/.parquet, '-').")] = None,
    column: Annotated[str, typer.Option("--column", help="tuned: a table corpus's text column.")] = "text",
    tokens: Annotated[Optional[int], typer.Option(
        "--tokens", metavar="N", show_default=False, help="tuned: the token budget (the corpus's first N).")] = None,
    ctx: Annotated[Optional[int], typer.Option(
        "--ctx", metavar="N", show_default=False,
        help="tuned: tokens per window (default min(2048, the model's context)).")] = None,
    steps: Annotated[int, typer.Option("--steps", help="tuned: optimizer steps (tuned-lens' num_steps).")] = 250,
    seed: Annotated[int, typer.Option("--seed", help="tuned: the seed of the windows' shuffle.")] = 42,
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
    from anatomy_cli.output.render import emit
    from anatomy_cli.output.views import fit_lens as view
    from anatomy_cli.tasks import fit_lens as task

    if kind == "merge":
        if prompts_file is not None:
            raise UsageError("fit-lens merge reads lens files, not prompts: drop --prompts")
        emit(view.merge_report(task.merge(list(files or []), out, dtype=lens_dtype, overwrite=overwrite)), fmt)
        return
    if files:
        raise UsageError(f"fit-lens {kind} takes no FILES (they are for fit-lens merge): give --prompts FILE")
    if kind == "tuned" and prompts_file is not None:
        raise UsageError("fit-lens tuned reads --corpus PATH, not prompts: drop --prompts")
    tuned = task.TunedFitOptions(corpus=corpus, column=column, tokens=tokens, ctx=ctx, steps=steps, seed=seed)
    opts = task.FitLensOptions(kind=kind, prompt=() if prompts_file is None else tuple(read_prompts_file(prompts_file)),
                               out=out, source_layers=source_layers, target_layer=target_layer, dim_batch=dim_batch,
                               max_seq_len=max_seq_len, skip_first=skip_first, dtype=lens_dtype, overwrite=overwrite,
                               checkpoint=checkpoint, checkpoint_every=checkpoint_every, shard=shard, ray=ray,
                               ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker,
                               tuned=tuned)  # fails before anything opens
    if kind == "tuned":
        opened = open_model(spec)
        plan = task.check(opened, opts)
        lm = load_weights(opened)
        emit(view.report(lm, task.run(lm, [], opts, plan)), fmt)
        return
    opened, encoded = open_texts(list(opts.prompt), spec, prompts)
    plan = task.check(opened, opts)
    model = opened if ray else load_weights(opened)  # on Ray the workers load the weights
    emit(view.report(model, task.run(model, encoded, opts, plan)), fmt)
