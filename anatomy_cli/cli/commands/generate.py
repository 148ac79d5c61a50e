"""`anatomy generate PROMPT`: the continuation, token by token through the KV cache, with a per-step trace;
optionally steered by a vector (`anatomy steer`), with a coefficient sweep and a cache check."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, status, warn
from anatomy_cli.cli.commands._common import (
    PromptArg,
    describe,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
)
from anatomy_cli.cli.options import FormatOpt, TargetIdOpt, TargetOpt, model_options, prompt_options
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Format, Report, Section, emit_jsonl, resolve_format
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
    """
    from anatomy_cli.analyses.generate import parse_coefs

    if coef is not None and steer is None and steer_feature is None:
        raise UsageError("--coef needs --steer FILE (or --steer-feature ID --sae PATH)")
    coefs = parse_coefs(coef) if coef is not None else [1.0]
    if (target is not None or target_id is not None) and len(coefs) < 2:
        raise UsageError("--target is for a coefficient sweep (--steer FILE --coef -4,0,4)")
    if not sample and (temperature != 1.0 or top_p != 1.0 or seed is not None):
        raise UsageError("--temperature, --top-p and --seed need --sample")
    wanted = targets.choice(target, target_id)
    opened, encoded = open_prompts(prompt, spec, prompts)
    if not opened.info.is_causal:
        raise UsageError(f"{spec.model} is an encoder ({opened.adapter.name}): `generate` needs a decoder")
    wanted_id = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=spec.model,
                                                             vocab_size=opened.info.lm_head_rows)
    from anatomy_cli.cli.commands.sae import feature_steering

    vector, steer_notes = feature_steering(steer, steer_feature, sae_path, opened, spec.model)
    lm = load_weights(opened)
    from anatomy_cli.analyses.generate import sampler
    from anatomy_cli.cli.commands import _generation as gen
    from anatomy_cli.engine import steering
    from anatomy_cli.engine.generate import greedy, stop_ids

    if steer is not None:
        vector = steering.load(steer)
    if vector is not None:
        for line in steering.check(vector, lm, str(steer or sae_path)) + steer_notes:
            warn(line)
    choose = (lambda: sampler(temperature=temperature, top_p=top_p, seed=seed)) if sample else (lambda: greedy)
    if sample:
        sampler(temperature=temperature, top_p=top_p)  # bad values fail before the first run
    settings = gen.Settings(choose, max_new_tokens, k, lens, vector, stop_ids(lm))
    reports, rows = [], []
    for index, enc in enumerate(encoded):
        heading = [f"generate · {model_label(lm)}", prompt_line(enc)]
        data = {**prompt_record(lm, enc), "sampling": _sampling(sample, temperature, top_p, seed),
                "steer": None if vector is None else {"file": str(steer or sae_path), "site": vector.site,
                                                       "layers": vector.layers, "coef": coefs,
                                                       **({"feature": steer_feature} if steer is None else {})}}
        with status(f"generating ({index + 1}/{len(encoded)})"):
            if len(coefs) > 1:
                sweep_rows, worst = gen.sweep(lm, list(enc.ids), settings, coefs, wanted_id, check)
                data["sweep"] = [r.to_dict() for r in sweep_rows]
                sections = [Section(gen.SWEEP_COLUMNS, data["sweep"], title="coefficient sweep")]
                rows += [{"prompt": enc.text, **r} for r in data["sweep"]]
            else:
                g = gen.run_one(lm, list(enc.ids), settings, coefs[0])
                worst = gen.check(lm, g, settings, coefs[0]) if check else None
                trace, section = gen.trace_record(lm, g, settings, describe(lm))
                data.update(trace)
                sections = [section]
                rows += [{"prompt": enc.text, **st} for st in trace["steps"]]
                heading.append(f"continuation {trace['continuation']!r} · stopped: {g.stopped}")
        notes = []
        if check:
            data["check"] = {"max_abs_logit_diff": worst}
            notes.append(f"cache check: largest |logit difference| cached vs uncached {worst:.3g}")
        reports.append(Report(data=data, sections=sections, heading=heading, notes=notes))
    if resolve_format(fmt) is Format.jsonl:
        emit_jsonl(rows)
    else:
        emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _sampling(sample: bool, temperature: float, top_p: float, seed: int | None) -> dict[str, object]:
    if not sample:
        return {"method": "greedy"}
    return {"method": "sample", "temperature": temperature, "top_p": top_p, "seed": seed}
