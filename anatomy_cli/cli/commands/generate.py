"""`anatomy generate PROMPT`: the continuation, token by token through the KV cache, with a per-step trace;
optionally steered by a vector (`anatomy steer`), with a coefficient sweep and a cache check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from typing import Optional

import typer

from anatomy_cli.cli.app import LensValueOptional
from anatomy_cli.cli.app import app
from anatomy_cli.cli.commands._common import PromptArg
from anatomy_cli.cli.commands._common import emit_prompts
from anatomy_cli.cli.commands._common import load_weights
from anatomy_cli.cli.commands._common import open_prompts
from anatomy_cli.cli.options import FirstTokenOpt
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.cli.options import PlotOpt
from anatomy_cli.cli.options import TargetIdOpt
from anatomy_cli.cli.options import TargetOpt
from anatomy_cli.cli.options import model_options
from anatomy_cli.cli.options import prompt_options
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import emit_jsonl
from anatomy_cli.output.render import resolve_format
from anatomy_cli.text.options import PromptOptions


@app.command("generate", cls=LensValueOptional)
@model_options()
@prompt_options()
def generate_command(
    prompt: PromptArg,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, metavar="N",
                                                help="Stop after N new tokens (or at the model's EOS).")] = 20,
    sample: Annotated[bool, typer.Option("--sample", help="Sample instead of greedy decoding.")] = False,
    temperature: Annotated[float, typer.Option("--temperature", help="With --sample: divide the logits by T.")] = 1.0,
    top_p: Annotated[float, typer.Option("--top-p", help="With --sample: nucleus sampling's mass.")] = 1.0,
    seed: Annotated[Optional[int], typer.Option("--seed", help="With --sample: fix the random draws.")] = None,
    k: Annotated[int, typer.Option("--top", "-k", min=1, metavar="N", help="Top tokens listed per step.")] = 5,
    lens: Annotated[Optional[str], typer.Option(
        "--lens", metavar="[logit|tuned:DIR|jacobian:FILE]", show_default=False,
        help="Per step: the chosen token's probability under a lens at every block, and the first block that ranks "
        "it first. A bare --lens is the logit lens; tuned:DIR or jacobian:FILE a fitted lens.")] = None,
    steer: Annotated[Optional[Path], typer.Option("--steer", metavar="FILE", show_default=False,
                                                  help="Add a steering vector (`anatomy steer --out`, or a "
                                                  "llama.cpp control vector .gguf) at every position.")] = None,
    coef: Annotated[Optional[str], typer.Option("--coef", metavar="C[,C...]", show_default=False,
                                                help="With --steer: the coefficient (default 1), or a "
                                                "comma-separated sweep such as -8,-4,0,4,8.")] = None,
    steer_feature: Annotated[Optional[int], typer.Option(
        "--steer-feature", metavar="ID", min=0, show_default=False,
        help="Add C times this SAE feature's decoder row (--sae PATH) at the SAE's hook point.")] = None,
    sae_path: Annotated[Optional[Path], typer.Option("--sae", metavar="PATH", show_default=False,
                                                     help="With --steer-feature: the SAE (as `anatomy sae`).")]
    = None,
    check: Annotated[bool, typer.Option("--check", help="Replay the tokens without the KV cache (a full forward "
                                        "per step) and report the largest logit difference.")] = False,
    plot: PlotOpt = None,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    first_token: FirstTokenOpt = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    fmt: FormatOpt = None,
) -> None:
    """Continue PROMPT token by token (greedy unless --sample), printing each step's token, probability, rank
    and top tokens. Stops at the model's EOS or after --max-new-tokens.

    With --steer FILE --coef C, C times the vector is added at its site on every position of the prompt and
    of every generated token (through the KV cache). A list of coefficients prints a sweep: each
    continuation, the KL of the first next-token distribution from coefficient 0, and --target's
    log-probability shift. --format jsonl prints one object per step (per coefficient for a sweep).

    Examples:

    \b
        anatomy generate "The capital of France is" --max-new-tokens 8
        anatomy generate "Once upon a time" --sample --temperature 0.8 --top-p 0.95 --seed 1
        anatomy generate "The capital of France is" --max-new-tokens 4 --lens --format jsonl
        anatomy generate "I think that" --steer happy.safetensors --coef 4 --check
        anatomy generate "I think that" --steer happy.safetensors --coef -8,-4,0,4,8 --target " love"
        anatomy generate "I think that" --steer happy.safetensors --coef -2,-1,0,1,2 --plot sweep.png
        anatomy generate "I think that" --steer-feature 123 --sae sae_dir/ --coef 4
    """
    from anatomy_cli.output.views import generate as view
    from anatomy_cli.tasks import generate as task

    opts = task.GenerateOptions(  # fails before anything opens
        max_new_tokens=max_new_tokens, k=k, lens=lens, check=check, target=target, target_id=target_id,
        first_token=first_token,
        sampling=task.SamplingOptions(sample=sample, temperature=temperature, top_p=top_p, seed=seed),
        steering=task.SteeringOptions(steer=steer, coef=coef, steer_feature=steer_feature, sae=sae_path))
    if plot:
        task.check_plot(opts)
    opened, encoded = open_prompts(prompt, spec, prompts)
    plan = task.check(opened, opts)
    lm = load_weights(opened)
    outs = task.run(lm, encoded, opts, plan)
    reports = [view.report(lm, enc, out, opts, plan) for enc, out in zip(encoded, outs)]
    if plot:
        from anatomy_cli.output import plots

        for index, (enc, out) in enumerate(zip(encoded, outs), start=1):
            args, kwargs = view.figure(lm, enc, out, opts, plan)
            plots.draw("generate", plot, index if prompt == "-" else None, *args, **kwargs)
    if resolve_format(fmt) is Format.jsonl:
        emit_jsonl([row for enc, r in zip(encoded, reports) for row in view.jsonl_rows(enc, r.data, opts)])
    else:
        emit_prompts(reports, fmt, from_stdin=prompt == "-")
