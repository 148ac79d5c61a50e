"""`anatomy next PROMPT`: the next-token distribution after a prompt, and a target token's rank."""

from __future__ import annotations

from typing import Annotated

import typer

from anatomy_cli.cli.app import app, status
from anatomy_cli.cli.commands._common import (
    BatchSizeOpt,
    PromptArg,
    describe,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
)
from anatomy_cli.cli.options import (
    FirstTokenOpt,
    FormatOpt,
    TargetIdOpt,
    TargetOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions

COLUMNS = (
    Column("rank", "rank", "int"),
    Column("token", "token"),
    Column("token_id", "id", "id"),
    Column("probability", "probability", "prob", 4),
    Column("logprob", "logprob", "float", 3),
)


@app.command("next")
@model_options()
@prompt_options()
def next_command(
    prompt: PromptArg,
    k: Annotated[int, typer.Option("--top", "-k", "--k", min=1, metavar="N",
                                   help="How many of the most probable tokens to list.")] = 10,
    target: TargetOpt = None,
    target_id: TargetIdOpt = None,
    first_token: FirstTokenOpt = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    batch_size: BatchSizeOpt = 8,
    fmt: FormatOpt = None,
) -> None:
    """The model's next-token distribution after PROMPT: rank, token, id, probability, log-probability.

    Probabilities are a float64 softmax over the whole vocabulary at the last position.
    Needs a decoder-only model with an LM head (encoders such as BERT are refused).

    Examples:

    \b
        anatomy next "Thank you very"
        anatomy next "Thank you very" --target " much" --top 5
        anatomy next "Thank you very" --target-id 881
        anatomy next "Thank you very" --init random --format json
        printf 'Thank you very\\nThe capital of France is\\n' | anatomy next - --format jsonl
    """
    wanted = targets.choice(target, target_id, first_token=first_token)  # fails before anything loads
    targets.check_first_token(first_token, wanted)
    opened, encoded = open_prompts(prompt, spec, prompts)
    if not opened.info.is_causal:  # before the weights: the architecture and the target need no weights
        raise UsageError(f"{spec.model} is an encoder ({opened.adapter.name}), not a next-token predictor; "
                         f"`next` needs a decoder-only model such as gpt2 (`trace` works with encoders)")
    target_id = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=spec.model,
                                                             vocab_size=opened.info.lm_head_rows)
    lm = load_weights(opened)
    # torch from here on: the prompt checks above ran without it where the model's files allow
    from anatomy_cli import engine
    from anatomy_cli.analyses import next_token as analysis
    if not lm.has_unembed:
        raise UsageError(f"{lm.name} is an encoder ({lm.adapter.name}), not a next-token predictor; "
                         f"`next` needs a decoder-only model such as gpt2 (`trace` works with encoders)")
    with status(f"running {len(encoded)} prompt{'' if len(encoded) == 1 else 's'}"):
        caches = engine.run(lm, encoded, ["logits"], positions=[[-1]] * len(encoded), batch_size=batch_size)
    name_token = describe(lm)
    reports = []
    for enc, cache in zip(encoded, caches):
        result = analysis.next_tokens(cache.logits[0], k, name_token, target_id=target_id)
        data = {**prompt_record(lm, enc), **result.to_dict()}
        sections = [Section(COLUMNS, data["top"], title=f"top {len(result.top)} next tokens")]
        if result.target is not None:
            sections.append(Section(COLUMNS, [data["target"]], title="target"))
        heading = [f"next · {model_label(lm)}",
                   f"{prompt_line(enc)} · after {enc.pieces[-1]}"]
        reports.append(Report(data=data, sections=sections, heading=heading))
    emit_prompts(reports, fmt, from_stdin=prompt == "-")
