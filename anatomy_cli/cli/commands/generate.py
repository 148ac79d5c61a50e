"""`anatomy generate PROMPT`: the continuation, token by token through the KV cache, with a per-step trace;
optionally steered by a vector (`anatomy steer`), with a coefficient sweep and a cache check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import (
    PromptArg,
    emit_prompts,
    load_weights,
    open_prompts,
)
from anatomy_cli.cli.options import FormatOpt, PlotOpt, TargetIdOpt, TargetOpt, model_options, prompt_options
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format, emit_jsonl, resolve_format
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions


@app.command("generate")
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
    lens: Annotated[bool, typer.Option("--lens", help="Per step: the chosen token's probability under the "
                                       "logit lens of every block, and the first block that ranks it first.")]
    = False,
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
    steering = steer if steer is not None else steer_feature
    coefs = check_options(coef=coef, steer=steering, targeted=target is not None or target_id is not None,
                          plot=plot, lens=lens, sample=sample, temperature=temperature, top_p=top_p, seed=seed)
    wanted = targets.choice(target, target_id)
    opened, encoded = open_prompts(prompt, spec, prompts)
    if not opened.info.is_causal:
        raise UsageError(f"{spec.model} is an encoder ({opened.adapter.name}): `generate` needs a decoder")
    wanted_id = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=spec.model,
                                                             vocab_size=opened.info.lm_head_rows)
    from anatomy_cli.cli.commands.sae import feature_steering

    feature, notes = feature_steering(steer, steer_feature, sae_path, opened, spec.model)
    lm = load_weights(opened)
    from anatomy_cli.cli.commands import _generation as gen

    vector, settings = gen.prepare(lm, steer, feature=feature, notes=notes, sample=sample, temperature=temperature,
                                   top_p=top_p, seed=seed, max_new_tokens=max_new_tokens, k=k, lens=lens)
    reports, rows = [], []
    for index, enc in enumerate(encoded):
        header = gen.header(lm, enc, _sampling(sample, temperature, top_p, seed), steer or sae_path, vector, coefs,
                            feature=steer_feature)
        with status(f"generating ({index + 1}/{len(encoded)})"):
            outcome = gen.one_prompt(lm, enc, settings, coefs, wanted_id, check, header)
        reports.append(outcome.report)
        rows += outcome.rows
        if plot:
            from anatomy_cli.output import plots

            plots.draw("generate", plot, len(reports) if prompt == "-" else None, outcome.result,
                       gen.caption(lm, enc, outcome.result, vector, coefs))
    if resolve_format(fmt) is Format.jsonl:
        emit_jsonl(rows)
    else:
        emit_prompts(reports, fmt, from_stdin=prompt == "-")


def check_options(*, coef: str | float | list[float] | None, steer: object, targeted: bool, plot: object,
                  lens: bool, sample: bool, temperature: float, top_p: float, seed: int | None) -> list[float]:
    """The coefficients (``--coef`` text, a number or a list; default [1]) once the options agree with each
    other; UsageError otherwise. Runs before anything is opened."""
    from anatomy_cli.analyses.generate import parse_coefs

    if coef is not None and steer is None:
        raise UsageError("--coef needs --steer FILE (or --steer-feature ID --sae PATH)")
    if coef is None:
        coefs = [1.0]
    elif isinstance(coef, str):
        coefs = parse_coefs(coef)
    else:
        coefs = parse_coefs(",".join(repr(float(c)) for c in (coef if isinstance(coef, (list, tuple)) else [coef])))
    if targeted and len(coefs) < 2:
        raise UsageError("--target is for a coefficient sweep (--steer FILE --coef -4,0,4)")
    if plot is not None and not lens and len(coefs) < 2:
        raise UsageError("--plot draws a coefficient sweep (--steer FILE --coef -2,0,2) or the --lens grid: "
                         "give one of them")
    if not sample and (temperature != 1.0 or top_p != 1.0 or seed is not None):
        raise UsageError("--temperature, --top-p and --seed need --sample")
    return coefs


def _sampling(sample: bool, temperature: float, top_p: float, seed: int | None) -> dict[str, object]:
    if not sample:
        return {"method": "greedy"}
    return {"method": "sample", "temperature": temperature, "top_p": top_p, "seed": seed}
