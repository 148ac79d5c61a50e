"""The prompt pipeline shared by commands that run prompts through a model (`trace`, `next`).

PROMPT is one text, or ``-`` for one prompt per non-empty stdin line. Steps:
:func:`load_prompts` reads the prompts (before the model loads, so bad input
fails fast), loads the model, tokenizes, checks the context length (and says
on stderr what ``--truncate left`` cut); the command runs the engine in
batches; :func:`emit_prompts` prints one report per prompt:

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
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from anatomy_cli.app import info, warn
from anatomy_cli.errors import UsageError
from anatomy_cli.render import Column, Format, Report, Section, emit, emit_jsonl, resolve_format

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded, LoadedModel


class Truncate(str, Enum):
    left = "left"


PromptArg = Annotated[str, typer.Argument(
    metavar="PROMPT", show_default=False,
    help="The prompt text, or '-' to read one prompt per non-empty line of stdin.")]
TruncateOpt = Annotated[Optional[Truncate], typer.Option(
    "--truncate", case_sensitive=False, show_default=False,
    help="'left': keep the last tokens of a prompt longer than the model's context (said on stderr). "
    "Default: such a prompt is an error.")]
BatchSizeOpt = Annotated[int, typer.Option(
    "--batch-size", min=1, help="Prompts per forward pass when reading several from stdin.")]
BosOpt = Annotated[bool, typer.Option(
    "--bos", help="Prepend the tokenizer's BOS token (decoders get none by default).")]


def load_prompts(prompt: str, *, model: str, device: Any, dtype: Any, init: Any, trust_remote_code: bool,
                 bos: bool = False, truncate: Truncate | None = None, device_map: Any = None,
                 max_memory: str | None = None, offload_folder: Any = None) -> tuple[LoadedModel, list[Encoded]]:
    """Read PROMPT (or stdin lines), load the model, tokenize and check the context length.

    Returns ``(lm, encoded)``, one :class:`Encoded` per prompt. Raises UsageError for
    bad placement options or an empty prompt or invalid UTF-8 (before loading),
    PromptTooLong unless ``truncate`` is ``left``, and the engine's loading errors.
    """
    from anatomy_cli import bigmodel, engine
    from anatomy_cli.inputs import read_prompts

    placement = bigmodel.placement_kwargs(device_map, max_memory, offload_folder)
    texts = read_prompts(prompt)
    lm = load_model(model, device=device, dtype=dtype, init=init, trust_remote_code=trust_remote_code, **placement)
    encoded = engine.check_length(lm, engine.encode(lm, texts, bos=bos),
                                  truncate=truncate.value if truncate else None)
    for i, enc in enumerate(encoded, start=1):
        if enc.dropped:
            which = f"prompt {i}" if len(encoded) > 1 else "prompt"
            warn(f"{which} is {len(enc) + enc.dropped} tokens; {lm.name} takes at most {lm.n_ctx}: "
                 f"kept the last {len(enc)} (--truncate left)")
    return lm, encoded


def load_model(model: str, *, device: Any, dtype: Any, init: Any, trust_remote_code: bool, device_map: Any = None,
               max_memory: Any = None, offload_folder: Any = None) -> LoadedModel:
    """``engine.load`` with the shared options; with a device map, says on stderr where the weights went."""
    from anatomy_cli import engine

    chosen = getattr(device, "value", device)
    if device_map is not None and chosen != "auto":
        raise UsageError(f"--device {chosen} and --device-map exclude each other: "
                         "the device map decides where each block goes")
    if not sys.stderr.isatty():
        # Progress bars are for people watching a terminal; in a pipeline or a log they are noise.
        from huggingface_hub.utils import disable_progress_bars
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        disable_progress_bars()
    lm = engine.load(model, device=device.value, dtype=dtype.value, init=init.value,
                     trust_remote_code=trust_remote_code, device_map=device_map, max_memory=max_memory,
                     offload_folder=offload_folder)
    if device_map is not None:
        info(placement_line(lm))
    return lm


def placement_line(lm: LoadedModel) -> str:
    """``placement: cpu 24.6 MiB (transformer.wte, lm_head) · disk 396.5 KiB (transformer.h); ...``"""
    from anatomy_cli import bigmodel
    from anatomy_cli.render import human_bytes

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


def model_label(lm: LoadedModel) -> str:
    """``gpt2`` or ``gpt2 (untrained: random weights)``."""
    return f"{lm.name} (untrained: random weights)" if lm.untrained else lm.name


def describe(lm: LoadedModel):
    """``token_id -> (display, text)`` for the analyses.

    display: ``·much``, hex bytes for a partial UTF-8 piece, a special token's name;
    text: the token's decoded string, None when its bytes are not whole UTF-8 characters.
    """
    tok = lm.tokenizer

    def _describe(token_id: int) -> tuple[str, str | None]:
        raw = tok.token_bytes(token_id)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = None
        return tok.piece(token_id), text

    return _describe


def prompt_line(enc: Encoded, width: int = 60) -> str:
    """``prompt 'Thank you very' · 3 tokens`` for a heading; a long prompt is cut in the middle."""
    text = enc.text if len(enc.text) <= width else enc.text[:width // 2 - 1] + " … " + enc.text[-(width // 2 - 2):]
    return f"prompt {text!r} · {len(enc)} token{'' if len(enc) == 1 else 's'}"


def prompt_record(lm: LoadedModel, enc: Encoded) -> dict[str, Any]:
    """The per-prompt keys every record starts with (see docs/commands/trace.md)."""
    return {"model": lm.name, "untrained": lm.untrained, "prompt": enc.text, "token_ids": list(enc.ids),
            "tokens": list(enc.pieces), "truncated_tokens": enc.dropped}


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
