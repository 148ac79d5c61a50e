"""`anatomy lens PROMPT`: the logit lens at every residual-stream row and position, optionally following a target."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import lens as task
from anatomy_cli.text.options import PromptOptions


@command("lens", task.LensOptions)
@model_options()
@prompt_options()
@output_options()
def lens_command(
    prompt: PromptArg,
    opts: task.LensOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """The logit lens at every layer and position: what the model would predict if it stopped there.

    A grid with rows embed, 0, ..., L-1 (the embedding, then each block's output) and the prompt's
    positions as columns; each cell is the most probable token of unembed(final_norm(h)) at that row
    and position, with --stat's number. --target adds the target's rank and probability in every cell
    and, per position, the first row (embed or block) where it is the top token. The table shows the
    grid; tsv/csv/json give one row per cell.

    Examples:

    \b
        anatomy lens "The capital of Germany is"
        anatomy lens "The capital of Germany is" --target " Berlin" --stat rank
        anatomy lens "Thank you very" --stride 4 --stat entropy
        anatomy lens "Thank you very" --layers embed,5,11 --top 3 --format json
        anatomy lens "The capital of Germany is" --lens jacobian:lens.pt
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output import plots
    from anatomy_cli.output.render import Format
    from anatomy_cli.output.render import resolve_format
    from anatomy_cli.output.views import lens as view

    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    # An HTML page's hover text lists each cell's top 5 tokens, whatever --k the table shows.
    k_run = max(opts.k or 1, view.HOVER_TOP) if plots.is_html(plot) else opts.k
    grids = task.run(lm, encoded, opts, plan, k=k_run)
    as_grid = resolve_format(fmt) is Format.table
    reports = []
    for enc, grid in zip(encoded, grids):
        reports.append(view.report(lm, enc, grid.keep_top(opts.k) if k_run != opts.k else grid, opts.stat, as_grid))
        if plot:
            args, kwargs = view.figure(lm, enc, grid, opts.stat)
            plots.draw("lens", plot, len(reports) if prompt == "-" else None, *args, **kwargs)
    emit_prompts(reports, fmt, from_stdin=prompt == "-")
