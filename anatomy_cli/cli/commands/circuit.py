"""`anatomy circuit PROMPT --transcoders DIR`: the attribution graph of the next-token prediction."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_and_emit
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.options import FirstTokenOpt
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text.options import PromptOptions


def _html_plot(value: Path | None) -> Path | None:
    # circuit draws one kind of picture, an interactive page: any other suffix is refused with that (then the
    # shared checks of the directory).
    from anatomy_cli.output.plots import check_path
    from anatomy_cli.output.plots import is_html

    if value is not None and not is_html(value):
        got = f"not '{value.suffix}'" if value.suffix else "no suffix"
        raise UsageError(f"--plot {str(value)!r}: circuit draws an interactive page: give a .html file ({got})")
    return check_path(value)


HtmlPlotOpt = Annotated[Optional[Path], typer.Option(
    "--plot", metavar="FILE.html", show_default=False, callback=_html_plot,
    help="Also draw the pruned graph to FILE.html, an interactive page (plotly, opens offline; .html only). Results "
    "still go to stdout. With '-' (stdin) prompts: one file per prompt, FILE-1.html, FILE-2.html, ...")]


@app.command("circuit")
@model_options()
@prompt_options()
def circuit_command(
    prompt: PromptArg,
    transcoders: Annotated[str, typer.Option(
        "--transcoders", metavar="DIR", help="circuit-tracer transcoder_set folder (config.yaml + one file per "
        "layer; Gemma Scope 2 safetensors too), cross_layer_transcoder folder (config.yaml + W_enc_l / W_dec_l), "
        "a folder of SAELens / sparsify transcoders, or Gemma Scope params.npz files (layer_N/.../params.npz), "
        "one per layer (anatomy fit-sae CORPUS --transcoder --layer all --out DIR trains one).")],
    max_n_logits: Annotated[int, typer.Option("--max-n-logits", min=1, help="At most this many logit nodes.")] = 10,
    desired_logit_prob: Annotated[float, typer.Option(
        "--desired-logit-prob", help="Logit nodes until their probabilities sum to this.")] = 0.95,
    target: Annotated[Optional[list[str]], typer.Option(
        "--target", metavar="TOKEN", show_default=False, help="These tokens as the logit nodes (repeatable); each "
        "exactly one token (mind the leading space: ' Paris').")] = None,
    target_id: Annotated[Optional[list[int]], typer.Option(
        "--target-id", metavar="N", min=0, show_default=False, help="Logit nodes given by token id (repeatable; "
        "after the --target ones).")] = None,
    first_token: FirstTokenOpt = False,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Rows per backward pass.")] = 256,
    max_feature_nodes: Annotated[Optional[int], typer.Option(
        "--max-feature-nodes", min=1, help="Feature rows computed, in influence order.")] = 7500,
    update_interval: Annotated[int, typer.Option(
        "--update-interval", min=1, help="Re-rank the features every this many batches.")] = 4,
    node_threshold: Annotated[float, typer.Option("--node-threshold", help="Keep nodes up to this cumulative "
                                                  "influence.")] = 0.8,
    edge_threshold: Annotated[float, typer.Option("--edge-threshold", help="Keep edges up to this cumulative "
                                                  "influence.")] = 0.98,
    out: Annotated[Optional[Path], typer.Option("--out", metavar="FILE", show_default=False,
                                                help="Write circuit-tracer's graph.pt.")] = None,
    json_out: Annotated[Optional[Path], typer.Option("--json", metavar="FILE", show_default=False,
                                                     help="Write the Neuronpedia graph JSON.")] = None,
    labels: Annotated[Optional[Path], typer.Option("--labels", metavar="PATH", show_default=False,
                                                   help="Neuronpedia explanations export(s): fills clerp.")] = None,
    check: Annotated[int, typer.Option("--check", min=0, metavar="N",
                                       help="Re-measure N edges by intervention.")] = 0,
    top: Annotated[int, typer.Option("--top", min=1, help="Rows of the paths table.")] = 10,
    offload: Annotated[Optional[str], typer.Option(
        "--offload", metavar="cpu|disk", show_default=False,
        help="Keep the transcoders off the device (cpu) or on disk (disk: read a block's when it is used); a "
        "cross-layer transcoder's encoders so, its decoders read row by row either way.")] = None,
    estimate: Annotated[bool, typer.Option(
        "--estimate", help="Print the graph's size, memory and expected time, before any weight loads; compute "
        "nothing.")] = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
    plot: HtmlPlotOpt = None,
) -> None:
    """The attribution graph of the next-token prediction over a transcoder replacement model.

    circuit-tracer's algorithm: attention patterns and norm denominators frozen at the prompt, each MLP
    replaced by its transcoder's active features plus an error node; edges are direct effects from batched
    backward passes, pruned by influence on the logits. Position 0 carries no features (as circuit-tracer);
    --bos prepends the BOS token as circuit-tracer always does. --estimate prints the dense graph's size
    (an upper bound: the active features are known only after the forward), memory and time from the shapes
    alone and exits. No transcoders at hand: anatomy fit-sae CORPUS --transcoder --layer all --out ./tc trains
    one per block (docs/commands/circuit.md's example).

    Examples:

    \b
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --out graph.pt
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --json graph.json --check 20
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --estimate
    """
    from anatomy_cli.output.views import circuit as view
    from anatomy_cli.tasks import circuit as task

    opts = task.CircuitOptions(
        transcoders=transcoders, max_n_logits=max_n_logits, desired_logit_prob=desired_logit_prob,
        target=tuple(target or ()), target_id=tuple(target_id or ()), first_token=first_token,
        batch_size=batch_size, max_feature_nodes=max_feature_nodes,
        update_interval=update_interval, node_threshold=node_threshold, edge_threshold=edge_threshold,
        out=None if out is None else str(out), json=None if json_out is None else str(json_out),
        labels=None if labels is None else str(labels), check=check, top=top, offload=offload, estimate=estimate)
    if plot is not None and estimate:
        raise UsageError("--estimate computes no graph: it draws no --plot (drop one of the two)")
    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts)
    if estimate:
        estimates = task.estimate(opened.info, encoded, opts, plan, spec.device)
        emit_prompts([view.report(opened, enc, e) for enc, e in zip(encoded, estimates)], fmt, from_stdin=prompt == "-")
        return
    lm = load_weights(opened)
    results = task.run(lm, encoded, opts, plan)
    draw_and_emit("circuit", view, lm, encoded, results, plot, fmt, prompt)
