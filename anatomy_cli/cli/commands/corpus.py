"""`anatomy corpus SOURCE`: per-layer (and per-head) statistics over a whole corpus, resumable, on Ray if asked."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app, info, status
from anatomy_cli.cli.commands._common import load_weights, model_label, open_model
from anatomy_cli.cli.commands._corpus_status import CorpusStatus
from anatomy_cli.cli.options import (
    AllowSpecialOpt,
    FormatOpt,
    PlotOpt,
    model_options,
)
from anatomy_cli.cli.records import model_record, spec_record
from anatomy_cli.errors import UsageError
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section, emit

if TYPE_CHECKING:
    from anatomy_cli.engine.opening import OpenedModel

LAYER_COLUMNS = (
    Column("layer", "layer", "int"),
    Column("kl_nats", "KL nats", "float", 4), Column("kl_nats_se", "±", "float", 4),
    Column("top1_agree", "top-1 agree", "pct", 1), Column("top1_agree_se", "±", "pct", 1),
    Column("ce_bits", "CE bits", "float", 3), Column("ce_bits_se", "±", "float", 3),
    Column("resid_norm", "|resid|", "float", 2), Column("resid_norm_se", "±", "float", 2),
    Column("cos_to_embedding", "cos emb", "float", 3), Column("cos_to_embedding_se", "±", "float", 3),
    Column("attn_out_norm", "|attn_out|", "float", 2), Column("attn_out_norm_se", "±", "float", 2),
    Column("mlp_out_norm", "|mlp_out|", "float", 2), Column("mlp_out_norm_se", "±", "float", 2),
    Column("max_abs", "max |h|", "float", 1), Column("max_abs_dim", "dim", "id"),
    Column("max_abs_dim_share", "dim share", "pct", 1),
    Column("lens_positions", "lens pos", "int"), Column("ce_positions", "CE pos", "int"),
)
HEAD_COLUMNS = (
    Column("layer", "layer", "int"), Column("head", "head", "int"),
    Column("entropy_nats", "entropy nats", "float", 3), Column("entropy_nats_se", "±", "float", 3),
    Column("first_token", "first tok", "float", 3), Column("first_token_se", "±", "float", 3),
    Column("prev_token", "prev tok", "float", 3), Column("prev_token_se", "±", "float", 3),
)
NOTE = ("mean over every measured position of every window, ± its standard error over windows; row 0 the embedding, "
        "row L the model's output. KL(final || lens) in nats; CE: -log2 p(next token) through the lens (row L: the "
        "model's loss); max |h|: the largest |activation| seen, dim share: how often that dimension holds a "
        "position's largest |activation|. See docs/commands/corpus.md")


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
    lens_every: Annotated[int, typer.Option(
        "--lens-every", min=1, metavar="N",
        help="Measure the logit lens at every N-th position only (it costs (L+1)·d·vocab per position).")] = 1,
    no_lens: Annotated[bool, typer.Option("--no-lens", help="Skip the logit lens (KL, top-1, CE).")] = False,
    out: Annotated[Optional[Path], typer.Option(
        "--out", metavar="DIR", file_okay=False, show_default=False,
        help="Write shards, manifest and summary Parquet here; running again resumes.")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace a run of other settings in --out.")] = False,
    shard_windows: Annotated[int, typer.Option("--shard-windows", min=1, help="Windows per shard.")] = 16,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Windows per forward pass.")] = 4,
    ray: Annotated[bool, typer.Option(
        "--ray", help="Run the shards on Ray workers: at --ray-address, else RAY_ADDRESS, else a local Ray "
        "started for the run. Needs pip install 'anatomy-cli[ray]'.")] = False,
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
    """Logit lens quality, residual stream and massive activations per layer (and heads) over a whole corpus.

    Documents are packed into windows of --ctx tokens; every position of every window is measured and
    summed in float64 (mean ± standard error over windows). With --out DIR each shard of windows is saved
    as Parquet, and running the same command again skips finished shards. See docs/corpus.md.

    Examples:

    \b
        anatomy corpus docs/ --model model.gguf --max-tokens 20000
        anatomy corpus data.jsonl --column body --heads --out run1
        anatomy corpus docs/ --lens-every 4 --ray --workers 2 --format json
    """
    report, result, caption = measure(
        source, spec, ctx=ctx, max_tokens=max_tokens, column=column, bos=bos, heads=heads, lens_every=lens_every,
        lens=not no_lens, out=out, overwrite=overwrite, shard_windows=shard_windows, batch_size=batch_size,
        ray=ray, ray_address=ray_address, workers=workers, gpus_per_worker=gpus_per_worker,
        save_activations=save_activations, activation_dtype=activation_dtype, allow_special=allow_special)
    emit(report, fmt)
    if plot:
        from anatomy_cli.output import plots
        from anatomy_cli.output.plots import corpus as picture

        plots.save(picture.figure(result.stats, caption), plot)


def measure(source: str, spec: ModelSpec, *, ctx: int | None = None, max_tokens: int | None = None,
            column: str = "text", bos: bool | None = None, heads: bool = False, lens_every: int = 1,
            lens: bool = True, out: Path | None = None, overwrite: bool = False, shard_windows: int = 16,
            batch_size: int = 4, ray: bool = False, ray_address: str | None = None, workers: int = 2,
            gpus_per_worker: float = 0.0, save_activations: str | None = None, activation_dtype: str = "fp32",
            allow_special: bool = False) -> tuple[Report, Any, Any]:
    """The whole run of `anatomy corpus` (the command's options as keywords; ``lens`` is not ``--no-lens``):
    ``(report, result, caption)``, the report the command emits, the runner's
    :class:`~anatomy_cli.corpus.runner.Result` and the picture's caption. The model is opened and loaded through
    the current loader. The command and ``anatomy.corpus`` both run this."""
    from anatomy_cli.corpus.runner import Settings, run
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.models.resolve import short_name
    from anatomy_cli.output import plots

    sites = _sites(save_activations, activation_dtype, out, ray)
    src = open_source(source, column=column)
    try:
        identity = src.identity()
        lm, opened, tokenizer = _load(spec, ray, sites)
        settings = Settings(ctx=_ctx(ctx, opened.info, spec.model), bos=opened.info.add_bos if bos is None else bos,
                            max_tokens=max_tokens,
                            lens=lens, lens_every=lens_every, heads=heads, shard_windows=shard_windows,
                            allow_special=allow_special, batch_size=batch_size, save_activations=sites,
                            activation_dtype=activation_dtype)
        ray_opts = {"address": ray_address, "workers": workers, "gpus_per_worker": gpus_per_worker} if ray else None
        with status("corpus: planning the first shard") as line:
            progress = CorpusStatus(line, max_tokens)
            try:
                result = run(src, spec, settings, tokenizer=tokenizer, lm=lm, out=out, overwrite=overwrite,
                             identity=identity, ray=ray_opts, progress=progress)
            except KeyboardInterrupt:
                info(progress.interrupted(out))
                raise
    finally:
        if source == "-":
            src.path.unlink(missing_ok=True)
    name = model_label(lm) if lm is not None else spec.model
    report = _report(name, model_record(lm) if lm is not None else spec_record(spec), identity, settings, result)
    caption = plots.Caption("corpus", short_name(spec.model), None,
                            f"{identity['path']} · {result.stats.tokens:,} tokens", untrained=spec.init == "random")
    return report, result, caption


def _sites(text: str | None, dtype: str, out: Path | None, on_ray: bool) -> tuple[str, ...]:
    """``--save-activations``' hook points, checked before anything loads."""
    if text is None:
        return ()
    from anatomy_cli.corpus.activations import DTYPES, parse_sites

    if dtype not in DTYPES:
        raise UsageError(f"--activation-dtype is fp32 or fp16, not '{dtype}'")
    if out is None or on_ray:
        raise UsageError("--save-activations needs --out DIR and runs in-process (not with --ray)")
    return parse_sites(text)


def _load(spec: ModelSpec, on_ray: bool, sites: tuple[str, ...] = ()) -> tuple[Any, OpenedModel, Any]:
    """``(lm, opened, tokenizer)``; with Ray the driver opens the model only (lm None: the workers load the
    weights). ``tokenizer``: transformers' own (the windows are planned with its batch encoding)."""
    if on_ray:
        from anatomy_cli.corpus.ray_run import ray_module

        ray_module()  # not installed: the one-line error before anything loads
    opened = open_model(spec)
    if not opened.info.is_causal:
        raise UsageError(f"corpus measures next-token prediction; {spec.model} is not a causal language model")
    if sites:
        from anatomy_cli.corpus.activations import check_sites

        check_sites(sites, opened.info, spec.model)
    if not on_ray:
        lm = load_weights(opened)
        return lm, opened, lm.tokenizer
    if opened.light:
        from anatomy_cli.engine.opening import open_exact

        return None, opened, open_exact(spec).tokenizer
    return None, opened, opened.tokenizer


def _ctx(ctx: int | None, info: ModelInfo, name: str) -> int:
    n_ctx = info.n_ctx
    if ctx is None:
        return min(512, n_ctx) if n_ctx else 512
    if n_ctx and ctx > n_ctx:
        raise UsageError(f"--ctx {ctx} is more than {name}'s context of {n_ctx} tokens")
    return ctx


def _report(name: str, model: dict[str, Any], identity: dict[str, Any], settings: Any, result: Any) -> Report:
    stats = result.stats
    data = {**model, "source": identity, "settings": settings.to_dict(), "shards": result.shards,
            "resumed_shards": result.resumed, **stats.to_dict()}
    loss = f" · loss {stats.loss_bits:.4f} bits/token, perplexity {stats.perplexity:.2f}" \
        if stats.loss_bits is not None else ""
    heading = [f"corpus · {name} · {identity['path']} · {stats.tokens:,} tokens in {stats.windows:,} windows of "
               f"≤ {settings.ctx}{' (BOS first)' if settings.bos else ''}{loss}"]
    notes = [NOTE]
    if settings.lens_every > 1:
        notes.append(f"logit lens at every {settings.lens_every}th position only (--lens-every)")
    for why in result.recomputed:
        info(f"{why}; computed again")
    if result.resumed:
        info(f"resumed: {result.resumed} of {result.shards} shards were read from the output directory")
    sections = [Section(LAYER_COLUMNS, list(stats.layers), title="per layer")]
    if stats.heads:
        sections.append(Section(HEAD_COLUMNS, list(stats.heads), title="per head"))
    return Report(data=data, sections=sections, heading=heading, notes=notes)
