"""`anatomy circuit PROMPT --transcoders DIR`: the attribution graph of the next-token prediction."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Optional

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_and_emit
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import model_given
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import html_plot
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import circuit as task
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.recorded_model import for_transcoders
from anatomy_cli.tasks.session import open_texts
from anatomy_cli.text.inputs import read_prompts
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anatomy_cli.tasks._circuit_estimate import CircuitEstimate
    from anatomy_cli.tasks.circuit import CircuitResult

HtmlPlotOpt = Annotated[Optional[Path], html_plot(
    "circuit", "Also draw the pruned graph to FILE.html, an interactive page (plotly, opens offline; .html only). "
    "Results still go to stdout. With '-' (stdin) prompts: one file per prompt, FILE-1.html, FILE-2.html, ...")]


@command("circuit", task.CircuitOptions)
@model_options()
@prompt_options()
def circuit_command(
    prompt: PromptArg,
    opts: task.CircuitOptions,
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
    one per block (docs/commands/circuit.md's example). Features are labelled from --labels, else
    --features-dir DIR's explanations.json (anatomy features --out DIR; its dashboard DIR/features.html is
    linked from the --plot page), else explanations.json beside the transcoders; no label is invented.

    Examples:

    \b
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --out graph.pt
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --json graph.json --check 20
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --estimate
        anatomy circuit "The capital of France is" --model smollm2 --transcoders ./tc --features-dir f14 --plot g.html
    """
    view = when_run("output.views.circuit")

    if plot is not None and opts.estimate:
        raise UsageError("--estimate computes no graph: it draws no --plot (drop one of the two)")
    texts = read_prompts(prompt)  # an empty PROMPT: a usage error before the transcoders or the model are read
    task.before_open(opts)
    spec = for_transcoders(spec, model_given(spec), opts.transcoders)  # no --model: the recorded one
    with notes.recorded() as warned:  # the JSON's `warnings` start with these (stderr has them as they come)
        opened, encoded = open_texts(texts, spec, prompts)
        plan = task.check(opened, opts)
        if opts.estimate:
            estimates = task.estimate(opened.info, encoded, opts, plan, spec.device, warned)
            emit_prompts([view.report(opened, enc, e) for enc, e in zip(encoded, estimates)], fmt,
                         from_stdin=prompt == "-")
            return
        lm = load_weights(opened)
    results: Sequence[CircuitResult | CircuitEstimate] = task.run(lm, encoded, opts, plan, batch=prompt == "-",
                                                                  warned=warned)
    draw_and_emit("circuit", view, lm, encoded, results, plot, fmt, prompt)
