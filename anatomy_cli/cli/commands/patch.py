"""`anatomy patch CLEAN CORRUPT --target TOKEN`: activation patching, one site x layer x position grid."""

from __future__ import annotations

from typing import Annotated

import typer

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import emit
from anatomy_cli.output.render import resolve_format
from anatomy_cli.tasks import patch as task
from anatomy_cli.text.options import PromptOptions


@command("patch", task.PatchOptions)
@model_options()
@prompt_options(truncate=False)
@output_options()
def patch_command(
    clean: Annotated[str, typer.Argument(metavar="CLEAN", show_default=False,
                                         help="The prompt whose activations are copied in.")],
    corrupt: Annotated[str, typer.Argument(metavar="CORRUPT", show_default=False,
                                           help="The prompt that is run and patched; same token count as CLEAN.")],
    opts: task.PatchOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """Activation patching: run CORRUPT, and at one site, layer and position replace the activation
    with CLEAN's; one patched run per cell of the grid.

    Each cell is (m - m_corrupt) / (m_clean - m_corrupt) at the last position, where m is
    logit(target) - logit(foil), or the target's logit without --foil: 0 = the corrupt run,
    1 = the clean run. The patched runs go in batches of --batch-size, each starting from the
    corrupt run's activations at the patched layer. --method attribution estimates every cell
    at once from one backward (attribution patching); --check N reruns the N largest exactly.

    Examples:

    \b
        anatomy patch "The Eiffel Tower is in the city of" "The Colosseum is in the city of" \\
            --target " Paris" --foil " Rome" -m SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy patch "The Eiffel Tower is in the city of" "The Colosseum is in the city of" \\
            --target " Paris" --foil " Rome" --site head --format json
        anatomy patch CLEAN CORRUPT --target " Paris" --foil " Rome" --site head --method attribution --check 10
    """
    plot, fmt = out.plot, out.fmt
    from anatomy_cli.output.views import patch as view

    task.check_texts(clean, corrupt)
    opened, (enc_clean, enc_corrupt) = open_texts([clean, corrupt], spec, prompts, truncate_hint=False)
    ids = task.check(opened, opts, enc_clean, enc_corrupt)
    lm = load_weights(opened)
    result = task.run(lm, enc_clean, enc_corrupt, opts, ids)
    fmt = resolve_format(fmt)
    emit(view.report(lm, enc_clean, enc_corrupt, result, wide=fmt is Format.table), fmt)
    if plot:
        from anatomy_cli.output import plots

        args, kwargs = view.figure(lm, enc_clean, enc_corrupt, result)
        plots.draw("patch", plot, None, *args, **kwargs)
