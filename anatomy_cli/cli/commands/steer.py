"""`anatomy steer`: a steering vector from contrastive prompts, saved for `generate --steer` and for llama.cpp."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_texts
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import steer as task
from anatomy_cli.text.options import PromptOptions


@command("steer", task.SteerOptions)
@model_options()
@prompt_options()
def steer_command(
    opts: task.SteerOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
) -> None:
    """A steering vector from contrastive prompts: per layer, the direction from the negative prompts'
    activations to the positive ones' at --site (default resid_post, block L's output, where llama.cpp adds a
    control vector), with its norm and how many pairs it separates.

    Examples:

    \b
        anatomy steer --positive "I love this" --positive "What a joy" --negative "I hate this" \\
            --negative "What a pain" --layer 6 --out joy.safetensors
        anatomy steer --pairs pairs.tsv --layer 4-8 --method pca --out joy.safetensors
        anatomy steer --pairs pairs.tsv --layer 6 --save-control-vector joy.gguf
    """
    view = when_run("output.views.steer")

    opened, encoded = open_texts(task.texts(opts), spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    emit(view.report(lm, task.run(lm, encoded, opts, plan), opts), fmt)
