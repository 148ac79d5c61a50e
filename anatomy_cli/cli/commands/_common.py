"""The prompt pipeline shared by commands that run prompts through a model (`trace`, `next`, ...).

A command reads its options as two objects (:func:`anatomy_cli.cli.options.model_options` hands it a
``ModelSpec``, :func:`~anatomy_cli.cli.options.prompt_options` a ``PromptOptions``), then, in this order:

1. :func:`open_prompts` (or :func:`open_texts`, :func:`open_model`): the model's config, tokenizer and
   :class:`~anatomy_cli.models.info.ModelInfo`, without any weight (and without torch where the files
   allow); PROMPT (one text, or ``-`` for one prompt per non-empty stdin line) tokenized (special-token
   text is plain text unless ``--allow-special``) and checked against the context length (``--truncate
   left`` cuts, said on stderr);
2. its own checks on ``opened.info`` and ``opened.tokenizer`` (``--layer``, ``--position``, target tokens),
   so bad input fails in a second;
3. :func:`load_weights`: the weights, with a status line on a terminal.

Both phases go through the current :class:`~anatomy_cli.engine.opening.Loader` (``anatomy serve`` hands
its cache). The command runs the engine; :func:`emit_prompts` prints one report per prompt:

* ``jsonl``: one object per prompt, always;
* ``json``: the object for a PROMPT argument, ``{"results": [...]}`` for stdin
  (decided by the source, not by how many lines it had, so scripts get one shape);
* ``tsv``/``csv``: for stdin, each section's rows of all prompts together with a
  leading ``prompt`` column; the model line and the notes go to stderr once;
* ``table``: one report after the other, each with its own heading.

No torch at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from anatomy_cli.cli import records
from anatomy_cli.cli.app import info, status, warn
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Format, Report, Section, emit, emit_jsonl, resolve_format
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded, LoadedModel, OpenedModel


PromptArg = Annotated[str, typer.Argument(
    metavar="PROMPT", show_default=False,
    help="The prompt text, or '-' to read one prompt per non-empty line of stdin.")]
BatchSizeOpt = Annotated[int, typer.Option(
    "--batch-size", min=1, help="Prompts per forward pass when reading several from stdin.")]


def open_model(spec: ModelSpec) -> OpenedModel:
    """The first phase: ``spec``'s config, tokenizer and ModelInfo through the current loader, no weights.

    Raises the engine's opening errors (ModelNotFound, OfflineError, CheckpointError, UnsupportedArchitecture).
    """
    from anatomy_cli.engine.loader import current_loader

    with status(f"opening {spec.model}"):
        return current_loader().open(spec)


def open_prompts(prompt: str, spec: ModelSpec, prompts: PromptOptions = PromptOptions()
                 ) -> tuple[OpenedModel, list[Encoded]]:
    """Read PROMPT (or stdin lines), then :func:`open_texts`. Raises UsageError for an empty prompt or
    invalid UTF-8 (before anything is opened) and whatever :func:`open_texts` raises."""
    from anatomy_cli.text.inputs import read_prompts

    return open_texts(read_prompts(prompt), spec, prompts)


def open_texts(texts: list[str], spec: ModelSpec, prompts: PromptOptions = PromptOptions(), *,
               what: str = "prompt", truncate_hint: bool = True) -> tuple[OpenedModel, list[Encoded]]:
    """Open ``spec`` and tokenize ``texts`` as ``prompts`` says, checking the context length.

    ``prompts.bos`` on a text that already starts with the BOS token keeps one and warns. ``what`` names the
    texts in messages ("prompt", "context"). Returns ``(opened, encoded)``, one Encoded per text. Raises
    PromptTooLong unless ``prompts.truncate`` is ``left``, and what :func:`open_model` raises.
    """
    from anatomy_cli.text import chat
    from anatomy_cli.text.length import check_length
    from anatomy_cli.text.tokenization import starts_with_bos

    opened = open_model(spec)
    tokenizer = opened.tokenizer
    encoded = chat.encode(tokenizer, texts, prompts, opened.name)
    encoded = check_length(opened, encoded, truncate=prompts.truncate, what=what, truncate_hint=truncate_hint)
    for i, enc in enumerate(encoded, start=1):
        which = f"{what} {i}" if len(encoded) > 1 else what
        if prompts.bos and starts_with_bos(enc, tokenizer.bos_id):
            warn(f"{which} already starts with the BOS token {enc.pieces[0]}: --bos adds no second one")
        if enc.dropped:
            warn(f"{which} is {len(enc) + enc.dropped} tokens; {opened.name} takes at most {opened.info.n_ctx}: "
                 f"kept the last {len(enc)} (--truncate left)")
    if prompts.bos and encoded and encoded[0].bos is False:
        warn(f"{opened.name}'s tokenizer has no BOS token: --bos adds nothing")
    return opened, encoded


def load_weights(opened: OpenedModel) -> LoadedModel:
    """The second phase: the weights of ``opened`` through the current loader, with a status line on a
    terminal's stderr. With a device map, says on stderr where the weights went. Raises the engine's
    loading errors."""
    from transformers.utils import logging as hf_logging

    from anatomy_cli.engine.loader import current_loader

    # The status line says the model is loading; transformers' own weight-loading bar would fight with it.
    hf_logging.disable_progress_bar()
    if not sys.stderr.isatty():
        # Download bars are for people watching a terminal; in a pipeline or a log they are noise.
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    with status(f"loading {opened.name}"):
        lm = current_loader().load_weights(opened)
    if opened.spec.device_map is not None:
        info(placement_line(lm))
    return lm


def warn_cost(what: str, lm: LoadedModel, flops: float) -> None:
    """One ``warning:`` line before a run whose estimate (:mod:`anatomy_cli.models.cost`) is long."""
    from anatomy_cli.models import cost

    line = cost.warning(what, flops, lm.device.type)
    if line is not None:
        warn(line)


def load_model(spec: ModelSpec) -> LoadedModel:
    """Both phases at once, for commands with no input to check before the weights."""
    return load_weights(open_model(spec))


def placement_line(lm: LoadedModel) -> str:
    """``placement: cpu 24.6 MiB (transformer.wte, lm_head) · disk 396.5 KiB (transformer.h); ...``"""
    from anatomy_cli.models import bigmodel
    from anatomy_cli.output.render import human_bytes

    devices = bigmodel.device_summary(lm.model)
    parts = []
    for d in devices:
        names = [m or "all" for m in d["modules"][:4]] + ([f"+{len(d['modules']) - 4} more"]
                                                          if len(d["modules"]) > 4 else [])
        where = f"GPU {d['device']}" if d["device"].isdigit() else d["device"]
        parts.append(f"{where} {human_bytes(d['bytes'])} ({', '.join(names)})")
    used = {d["device"] for d in devices}
    line = "placement: " + " · ".join(parts)
    if "cpu" in used and lm.device.type != "cpu":
        line += f"; cpu weights are copied to {lm.device} at every forward"
    if "disk" in used:
        line += "; disk weights are read from disk at every forward"
    return line


def dtype_name(lm: LoadedModel) -> str:
    """``fp32``, ``bf16`` or ``fp16``: the weights' dtype as ``--dtype`` names it (engine.DTYPES)."""
    return records.dtype_name(lm)


def model_label(lm: LoadedModel) -> str:
    """``gpt2``, ``gpt2 (untrained: random weights)``, ``gemma-3-270m-Q4_K_M (weights dequantized from Q4_K_M
    (...))``; a dtype other than fp32 is said too: ``gpt2 (bf16)``. The model's short name (``lm.label``:
    :func:`anatomy_cli.models.resolve.label`); JSON's ``model`` keeps the spec as given."""
    dtype = dtype_name(lm)
    extra = "" if dtype == "fp32" else dtype
    if lm.untrained:
        what = "untrained: random weights" + (f", {extra}" if extra else "")
    elif lm.dequantized_from:
        what = f"weights dequantized from {lm.dequantized_from}" + (f" to {extra}" if extra else "")
    else:
        what = extra
    name = lm.label or lm.name
    return f"{name} ({what})" if what else name


def describe(lm: LoadedModel):
    """``token_id -> (display, text)`` for the analyses.

    display: ``·much``, hex bytes for a partial UTF-8 piece, a special token's name, ``<unused id 50290>``
    for a padded LM head's row past the tokenizer; text: the token's decoded string, None when its bytes
    are not whole UTF-8 characters or the id has no token.
    """
    tok = lm.tokenizer

    def _describe(token_id: int) -> tuple[str, str | None]:
        if not tok.known(token_id):
            return tok.piece(token_id), None
        raw = tok.token_bytes(token_id)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        return tok.piece(token_id), text

    return _describe


def prompt_line(enc: Encoded, width: int = 60) -> str:
    """``prompt 'Thank you very' · 3 tokens · bos: false (model default)`` for a heading; a long prompt is
    cut in the middle. The BOS part is left out for encoders (their tokenizer adds its own specials)."""
    text = enc.text if len(enc.text) <= width else enc.text[:width // 2 - 1] + " … " + enc.text[-(width // 2 - 2):]
    line = f"prompt {text!r} · {len(enc)} token{'' if len(enc) == 1 else 's'}"
    return line if enc.bos is None else f"{line} · {bos_text(enc)}"


def bos_text(enc: Encoded) -> str:
    """``bos: true (model default)``, ``bos: false (--no-bos)``: which BOS rule applied to ``enc``."""
    return f"bos: {'true' if enc.bos else 'false'} ({enc.bos_source})"


def prompt_record(lm: LoadedModel, enc: Encoded) -> dict[str, Any]:
    """The per-prompt keys every record starts with (see docs/commands/trace.md): the model, then the prompt."""
    return {**records.model_record(lm), "prompt": enc.text, "token_ids": list(enc.ids),
            "tokens": list(enc.pieces), "truncated_tokens": enc.dropped, "bos": enc.bos,
            "bos_source": enc.bos_source}


def emit_prompts(reports: Sequence[Report], fmt: Format | None, *, from_stdin: bool) -> None:
    """Print one report per prompt in ``fmt`` (see the module docstring for the layout)."""
    fmt = resolve_format(fmt)
    if fmt is Format.jsonl:
        emit_jsonl(r.data for r in reports)
    elif from_stdin and fmt is Format.json:
        emit(Report(data={"results": [r.data for r in reports]}, sections=()), fmt)
    elif from_stdin and fmt in (Format.tsv, Format.csv):
        # The first heading line names the model (and "untrained"); the others are per prompt.
        emit(Report(data=None, sections=_with_prompt_column(reports), heading=reports[0].heading[:1],
                    notes=list(dict.fromkeys(n for r in reports for n in r.notes))), fmt)
    else:
        for report in reports:
            emit(report, fmt)

def _with_prompt_column(reports: Sequence[Report]) -> list[Section]:
    merged = []
    for i, first in enumerate(reports[0].sections):
        rows = [{"prompt": r.data["prompt"], **row} for r in reports for row in r.sections[i].rows]
        merged.append(Section(columns=[Column("prompt"), *first.columns], rows=rows, title=first.title))
    return merged
