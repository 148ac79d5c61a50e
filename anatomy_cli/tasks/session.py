"""The prompt pipeline every task runs on: open (no weights) → check → load → run.

1. :func:`open_prompts` (or :func:`open_texts`, :func:`open_model`): the model's config, tokenizer and
   :class:`~anatomy_cli.models.info.ModelInfo`, without any weight (and without torch where the files allow);
   the texts tokenized (special-token text is plain text unless ``allow_special``) and checked against the
   context length (``truncate="left"`` cuts, and says so);
2. the task's ``check(info, opts)``: every refusal that needs no weights;
3. :func:`load_weights`: the weights.

Both phases go through the current :class:`~anatomy_cli.engine.opening.Loader` (``anatomy serve`` hands its
cache, the API a model it already holds). What the pipeline says (warnings, status lines) goes to the current
:mod:`~anatomy_cli.tasks.notes`, never to a stream. No torch at import time.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli import engine
from anatomy_cli.declare.commands import when_run
from anatomy_cli.engine.estimate import now
from anatomy_cli.engine.threads import machine_threads
from anatomy_cli.errors import UsageError
from anatomy_cli.models import bigmodel
from anatomy_cli.models import cost
from anatomy_cli.models.info import check_ctx
from anatomy_cli.models.sites import parse_blocks
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import notes
from anatomy_cli.tasks import records
from anatomy_cli.text import chat
from anatomy_cli.text.inputs import read_prompts
from anatomy_cli.text.length import check_length
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.tokenization import starts_with_bos
from anatomy_cli.units import counted
from anatomy_cli.units import human_bytes

if TYPE_CHECKING:
    from collections.abc import Callable

    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine import OpenedModel
    from anatomy_cli.models.headers import GGUFHeader


def open_model(spec: ModelSpec) -> OpenedModel:
    """The first phase: ``spec``'s config, tokenizer and ModelInfo through the current loader, no weights.

    Raises the engine's opening errors (ModelNotFound, OfflineError, CheckpointError, UnsupportedArchitecture).
    """
    with notes.status(f"opening {spec.model}"):
        return engine.current_loader().open(spec)


def open_prompts(prompt: str, spec: ModelSpec, prompts: PromptOptions = PromptOptions()
                 ) -> tuple[OpenedModel, list[Encoded]]:
    """Read PROMPT (or stdin lines for ``-``), then :func:`open_texts`. Raises UsageError for an empty prompt or
    invalid UTF-8 (before anything is opened) and whatever :func:`open_texts` raises."""
    return open_texts(read_prompts(prompt), spec, prompts)


def check_early(spec: ModelSpec, blocks: tuple[str, str] | None = None, ctx: int | None = None,
                **parse: Any) -> GGUFHeader | None:
    """What a GGUF file's header states, checked before the model opens (the open imports torch: seconds), with the
    messages the task's own checks give once it is open: ``blocks`` (an option's text and flag,
    :func:`anatomy_cli.models.sites.parse_blocks` with ``parse``) against its block count, a block out of range
    refused; ``ctx`` (``--ctx``) against its context (``models.info.check_ctx``). Other sources: nothing here (a
    directory's light open is quick; a Hub id or a preset is known once opened). Returns the header, for the task's own
    checks of what it states (None: no GGUF file)."""
    light = when_run("models.light")

    header = light.gguf_header(spec.model)
    if header is None:
        return None
    if blocks is not None and header.block_count is not None:
        parse_blocks(blocks[0], header.block_count, blocks[1], **parse)
    if ctx is not None:
        check_ctx(ctx, header.context_length, spec.model)
    return header


def open_texts(texts: list[str], spec: ModelSpec, prompts: PromptOptions = PromptOptions(), *,
               what: str = "prompt", truncate_hint: bool = True) -> tuple[OpenedModel, list[Encoded]]:
    """Open ``spec`` and tokenize ``texts`` as ``prompts`` says, checking the context length.

    ``prompts.bos`` on a text that already starts with the BOS token keeps one and warns. ``what`` names the
    texts in messages ("prompt", "context"). Returns ``(opened, encoded)``, one Encoded per text. Raises
    PromptTooLong unless ``prompts.truncate`` is ``left``, and what :func:`open_model` raises.
    """
    opened = open_model(spec)
    return opened, encode(opened, texts, prompts, what=what, truncate_hint=truncate_hint)


def encode(opened: OpenedModel | LoadedModel, texts: list[str], prompts: PromptOptions = PromptOptions(), *,
           what: str = "prompt", truncate_hint: bool = True) -> list[Encoded]:
    """``texts`` tokenized with ``opened``'s tokenizer and length-checked (see :func:`open_texts`)."""
    if not isinstance(prompts, PromptOptions):
        raise TypeError(f"prompts= takes a PromptOptions, not {type(prompts).__name__}")
    tokenizer = opened.tokenizer
    encoded = chat.encode(tokenizer, list(texts), prompts, opened.name)
    encoded = check_length(opened, encoded, truncate=prompts.truncate, what=what, truncate_hint=truncate_hint)
    for i, enc in enumerate(encoded, start=1):
        which = f"{what} {i}" if len(encoded) > 1 else what
        if prompts.bos and starts_with_bos(enc, tokenizer.bos_id):
            notes.warn(f"{which} already starts with the BOS token {enc.pieces[0]}: --bos adds no second one")
        if enc.dropped:
            notes.warn(f"{which} is {counted(len(enc) + enc.dropped, 'token')}; {opened.name} takes at most "
                       f"{opened.info.n_ctx:,}: kept the last {len(enc):,} (--truncate left)")
    if prompts.bos and encoded and encoded[0].bos is False:
        notes.warn(f"{opened.name}'s tokenizer has no BOS token: --bos adds nothing")
    return encoded


def load_weights(opened: OpenedModel) -> LoadedModel:
    """The second phase: the weights of ``opened`` through the current loader, under a status line. With a
    device map, says where the weights went. Raises the engine's loading errors."""
    from transformers.utils import logging as hf_logging

    # The status line says the model is loading; transformers' own weight-loading bar would fight with it.
    hf_logging.disable_progress_bar()
    if not sys.stderr.isatty():
        # Download bars are for people watching a terminal; in a pipeline or a log they are noise.
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()

    start = now()
    with notes.status(f"loading {opened.name}"):
        lm = engine.current_loader().load_weights(opened)
    lm.load_seconds = now() - start  # the fits' estimates count it (engine/estimate.py)
    if opened.spec.device_map is not None:
        notes.info(placement_line(lm))
    return lm


def load_model(spec: ModelSpec) -> LoadedModel:
    """Both phases at once, for tasks with no input to check before the weights."""
    return load_weights(open_model(spec))


@contextmanager
def busy_threads(command: str) -> Iterator[None]:
    """A long CPU loop of ``command`` (fit-sae, fit-lens, circuit, explain's generation) on one torch thread where
    the machine is busy (:func:`anatomy_cli.engine.threads.machine_threads`), with one line saying so; inside
    another such block nothing changes and nothing more is said."""
    import torch

    before = torch.get_num_threads()
    with machine_threads() as threads:
        if threads < before:
            notes.info(f"{command}: the machine is busy (load average at or over its CPUs): 1 thread, not {before} "
                       "(they would wait for each other at every op)")
        yield


def warn_cost(what: str, lm: LoadedModel, flops: float) -> None:
    """One warning before a run whose estimate (:mod:`anatomy_cli.models.cost`) is long."""

    line = cost.warning(what, flops, lm.device.type)
    if line is not None:
        notes.warn(line)


def placement_line(lm: LoadedModel) -> str:
    """``placement: cpu 24.6 MiB (transformer.wte, lm_head) · disk 396.5 KiB (transformer.h); ...``"""

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
    (...))``; a dtype other than fp32 is said too: ``gpt2 (bf16)``. The model's one display name
    (``lm.display``); JSON's ``model`` keeps the spec as given."""
    dtype = dtype_name(lm)
    extra = "" if dtype == "fp32" else dtype
    if lm.untrained:
        what = "untrained: random weights" + (f", {extra}" if extra else "")
    elif lm.dequantized_from:
        what = f"weights dequantized from {lm.dequantized_from}" + (f" to {extra}" if extra else "")
    else:
        what = extra
    return f"{lm.display} ({what})" if what else lm.display


def describe(lm: LoadedModel) -> Callable[[int], tuple[str, str | None]]:
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
    line = f"prompt {text!r} · {counted(len(enc), 'token')}"
    return line if enc.bos is None else f"{line} · {bos_text(enc)}"


def bos_text(enc: Encoded) -> str:
    """``bos: true (model default)``, ``bos: false (--no-bos)``: which BOS rule applied to ``enc``."""
    return f"bos: {'true' if enc.bos else 'false'} ({enc.bos_source})"


def prompt_record(lm: LoadedModel, enc: Encoded) -> dict[str, Any]:
    """The per-prompt keys every record starts with (see docs/commands/trace.md): the model, then the prompt."""
    return {**records.model_record(lm), "prompt": enc.text, "token_ids": list(enc.ids),
            "tokens": list(enc.pieces), "truncated_tokens": enc.dropped, "bos": enc.bos,
            "bos_source": enc.bos_source}


def texts_of(prompt: str | list[str]) -> tuple[list[str], bool]:
    """``([prompt], True)`` for one text (the API's ``prompt=``), ``(list, False)`` for several; UsageError for an
    empty text or list."""

    texts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not texts or any(not isinstance(t, str) or t == "" for t in texts):
        raise UsageError("give a non-empty prompt (a str, or a list of them)")
    return texts, isinstance(prompt, str)
