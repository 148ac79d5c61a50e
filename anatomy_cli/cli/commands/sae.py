"""`anatomy sae PROMPT --sae PATH`: does a sparse autoencoder fit this model, and which features fire."""

from __future__ import annotations

from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import draw_each
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import model_given
from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import output_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import sae as task
from anatomy_cli.tasks.recorded_model import chosen
from anatomy_cli.tasks.session import open_texts
from anatomy_cli.text.inputs import read_prompts
from anatomy_cli.text.options import PromptOptions


@command("sae", task.SaeOptions)
@model_options()
@prompt_options()
@output_options()
def sae_command(
    prompt: PromptArg,
    opts: task.SaeOptions,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    out: Output = Output(),
) -> None:
    """An SAE or transcoder on PROMPT: its health first (L0, FVE, MSE, relative error, next-token CE and KL
    with the reconstruction spliced in, with and without the error term), then the top features per token.

    Reads SAELens (standard, JumpReLU, TopK; BatchTopK saved as JumpReLU), EleutherAI sparsify (TopK) and
    Gemma Scope (JumpReLU) files offline. CE and KL are in nats. --plot FILE draws tokens x features (the
    top features over the prompt, activation as colour). Labels: --labels, else --features-dir DIR's
    explanations.json, else explanations.json beside the SAE; no label is invented. See docs/commands/sae.md.

    Examples:

    \b
        anatomy sae "The cat sat on the mat" --sae ./gpt2-res-jb/blocks.6.hook_resid_post --model gpt2
        anatomy sae "The cat sat" --sae ./sparsify-ckpt --hook layers.6 --model EleutherAI/pythia-70m
        anatomy sae "Paris is" --sae ./layer_12/width_16k/average_l0_82/params.npz --hook blocks.12.hook_resid_post
        anatomy sae "The cat" --sae ./sae --feature 123 --feature 4567 --labels ./explanations --format json
        anatomy sae "The cat sat on the mat" --sae ./sae --labels ./explanations --plot features.html
    """
    plot, fmt = out.plot, out.fmt
    view = when_run("output.views.sae")

    texts = read_prompts(prompt)  # an empty PROMPT: a usage error before the dictionary or the model are read
    sae_file = task.before_open(opts)  # no SAE at the path: refused before the model opens
    spec = chosen(spec, model_given(spec), lambda: sae_file.model_name)  # no --model: the recorded one
    opened, encoded = open_texts(texts, spec, prompts)
    plan = task.check(opened, opts, sae_file)
    lm = load_weights(opened)
    readings = task.run(lm, encoded, opts, plan)
    draw_each("sae", plot, prompt, (view.figure(lm, enc, r, plan.sae_file) for enc, r in zip(encoded, readings)))
    emit_prompts([view.report(lm, enc, r, plan.sae_file) for enc, r in zip(encoded, readings)], fmt,
                 from_stdin=prompt == "-")
