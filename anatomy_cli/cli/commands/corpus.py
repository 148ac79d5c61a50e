"""`anatomy corpus SOURCE`: per-layer (and per-head) statistics over a whole corpus, resumable, on Ray if asked."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.options import AllowSpecialOpt
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import PlotOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit


@app.command("corpus")
@model_options()
def corpus_command(
    source: Annotated[str, typer.Argument(
        metavar="SOURCE", show_default=False,
        help="A text file, a directory of .txt/.md files, '-' (stdin), a .jsonl/.csv/.parquet file (--column), "
             "or a datasets save_to_disk directory.")],
    ctx: Annotated[Optional[int], typer.Option(
        "--ctx", min=2, show_default=False, help="Tokens per window. Default: min(512, the model's context).")] = None,
    max_tokens: Annotated[Optional[int], typer.Option(
        "--max-tokens", min=2, show_default=False, help="Stop after this many tokens (default: all).")] = None,
    column: Annotated[str, typer.Option("--column", help="The text column of a .jsonl/.csv/.parquet/datasets source.")]
    = "text",
    bos: Annotated[Optional[bool], typer.Option(
        "--bos/--no-bos", show_default=False,
        help="Start each window with the BOS token. Default: when the tokenizer itself adds one (LLaMA, Gemma).")]
    = None,
    heads: Annotated[bool, typer.Option(
        "--heads", help="Also per head: attention entropy, sink (first-token) mass, previous-token mass (a second "
        "forward, with eager attention).")] = False,
    lens: Annotated[Optional[list[str]], typer.Option(
        "--lens", metavar="logit|tuned:DIR|jacobian:FILE", show_default=False,
        help="A lens to measure (repeatable, one of each kind): logit (the default), tuned:DIR (a tuned-lens "
             "directory) or jacobian:FILE (a Jacobian lens .pt file). Per layer: KL to the final distribution, "
             "CE, entropy, in nats per token and bits per byte.")] = None,
    experts: Annotated[bool, typer.Option(
        "--experts", help="Also per MoE block and expert (Mixtral, Qwen2/3-MoE, OLMoE): the share of token slots "
        "routed to it, its mean weight, the load imbalance and how often pairs of experts are chosen together.")]
    = False,
    lens_every: Annotated[int, typer.Option(
        "--lens-every", min=1, metavar="N",
        help="Measure the lenses at every N-th position only (each costs (L+1)·d·vocab per position).")] = 1,
    no_lens: Annotated[bool, typer.Option("--no-lens", help="Skip every lens (KL, top-1, CE, entropy).")] = False,
    out: Annotated[Optional[Path], typer.Option(
        "--out", metavar="DIR", file_okay=False, show_default=False,
        help="Write shards, manifest and summary Parquet here; running again resumes.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run of other settings in --out.")] = False,
    shard_windows: Annotated[int, typer.Option("--shard-windows", min=1, help="Windows per shard.")] = 16,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Windows per forward pass.")] = 4,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Run the shards on Ray workers: at --ray-address, else RAY_ADDRESS, else a local Ray "
        "started for the run. Needs Ray (in a clone: pip install -e '.[ray]').")] = False,
    ray_address: Annotated[Optional[str], typer.Option(
        "--ray-address", metavar="ADDRESS", show_default=False,
        help="The Ray cluster for --ray (ray://host:10001, auto).")] = None,
    workers: Annotated[int, typer.Option("--workers", min=1, help="Ray workers (actors), one model each.")] = 2,
    gpus_per_worker: Annotated[float, typer.Option("--gpus-per-worker", min=0.0, help="GPUs per Ray worker.")] = 0.0,
    save_activations: Annotated[Optional[str], typer.Option(
        "--save-activations", metavar="SITE[,SITE]", show_default=False,
        help="Also save the activations at these hook points (blocks.6.hook_resid_post, ...) under --out DIR/"
             "activations as safetensors shards with a Parquet index, for training SAEs. See docs/corpus.md.")]
    = None,
    activation_dtype: Annotated[str, typer.Option(
        "--activation-dtype", metavar="fp32|fp16", help="The saved activations' dtype.")] = "fp32",
    allow_special: AllowSpecialOpt = False,
    spec: ModelSpec = ModelSpec(),
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Lens quality (logit, tuned, Jacobian), residual stream, massive activations per layer (and heads) over a corpus.

    Documents are packed into windows of --ctx tokens; every position of every window is measured and
    summed in float64 (mean ± standard error over windows). With --out DIR each shard of windows is saved
    as Parquet, and running the same command again skips finished shards. See docs/corpus.md.

    Examples:

    \b
        anatomy corpus docs/ --model model.gguf --max-tokens 20000
        anatomy corpus data.jsonl --column body --heads --out run1
        anatomy corpus docs/ --lens-every 4 --ray --workers 2 --format json
        anatomy corpus docs/ --lens logit --lens jacobian:lens.pt --lens tuned:tuned/
        anatomy corpus docs/ --model ./my-moe --experts --out run2
    """
    from anatomy_cli.errors import UsageError
    from anatomy_cli.output.views import corpus as view
    from anatomy_cli.tasks import corpus as task

    if no_lens and lens:
        raise UsageError("--no-lens skips every lens: give it or --lens, not both")
    opts = task.CorpusOptions(
        ctx=ctx, max_tokens=max_tokens, column=column, bos=bos, heads=heads, lens_every=lens_every,
        lens=() if no_lens else tuple(lens or ("logit",)),
        out=out, overwrite=overwrite, shard_windows=shard_windows, batch_size=batch_size, ray=ray,
        ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker, save_activations=save_activations,
        activation_dtype=activation_dtype, allow_special=allow_special, experts=experts)  # fails before anything opens
    run = task.measure(source, spec, opts)
    emit(view.report(run), fmt)
    if plot:
        from anatomy_cli.output import plots
        from anatomy_cli.output.plots import corpus as picture

        args, kwargs = view.figure(run)
        plots.save(picture.figure(*args, **kwargs), plot)  # .html: the picture embedded in a page
