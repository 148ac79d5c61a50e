"""`anatomy tokens TEXT`: how a tokenizer splits text. Imports neither torch nor transformers
unless ``--model`` is given (the analysis module is imported inside the command body)."""

from __future__ import annotations

from typing import Annotated

import typer

from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import AllowSpecialOpt
from anatomy_cli.cli.options import BosOpt
from anatomy_cli.cli.options import FormatOpt
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.tasks import tokens as task
from anatomy_cli.text.inputs import read_text_arg
from anatomy_cli.units import counted

_COLUMNS = (
    Column("index", "#", "int"),
    Column("token_id", "id", "id"),
    Column("token", "token"),
    Column("bytes", "bytes"),
    Column("start", "start", "int"),
    Column("end", "end", "int"),
)


@command("tokens", task.TokensOptions)
def tokens(
    text: Annotated[str, typer.Argument(help="Text to tokenize, exactly as given; '-' reads all of stdin "
                                        "(a trailing newline is part of the text).", show_default=False)],
    opts: task.TokensOptions,
    allow_special: AllowSpecialOpt = False,
    bos: BosOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Show the tokens of TEXT: index, id, token, bytes of partial characters, character span.

    Whitespace is made visible (·much). A token that is only part of a UTF-8
    character (GPT-2 splits most Chinese characters into 2-3 tokens) is shown
    as hex bytes, and its span is the whole character it belongs to. The
    summary (tokens, characters, bytes) goes under the table, into the JSON, or
    to stderr for tsv/csv. With --model, the ids are those the other commands run:
    a decoder's BOS as its tokenizer adds it (Gemma, Llama: yes; GPT-2: no), or as
    --bos / --no-bos say.

    Examples:

        anatomy tokens "Thank you very"

        anatomy tokens "你好" --format json

        anatomy tokens "a<|endoftext|>b" --allow-special

        printf 'line one\\nline two' | anatomy tokens - --encoding cl100k_base
    """
    analysis = when_run("analyses.tokens")

    if opts.model is None and bos is not None:
        raise UsageError("--bos and --no-bos apply to a model's tokenizer (--model); tiktoken adds no BOS")
    source = read_text_arg(text)
    if opts.model is not None:
        result = analysis.tokenize_hf(source, opts.model, allow_special=allow_special, bos=bos)
    else:
        result = analysis.tokenize_tiktoken(source, opts.encoding or "gpt2", allow_special=allow_special)
    data = result.to_dict()
    summary = (f"{counted(data['n_tokens'], 'token')}, {counted(data['n_characters'], 'character')}, "
               f"{counted(data['n_bytes'], 'byte')} ({result.tokenizer})")
    if result.bos is not None:
        summary += f"; bos: {'true' if result.bos else 'false'} ({result.bos_source})"
    emit(Report(data=data, sections=[Section(columns=_COLUMNS, rows=data["tokens"])], notes=[summary]), fmt)
