"""`anatomy drift WORD`: how one word's vector diverges across contexts, layer by layer."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Optional

import typer

from anatomy_cli.cli.app import app, status, warn
from anatomy_cli.cli.commands._common import (
    bos_text,
    dtype_name,
    load_weights,
    model_label,
    open_texts,
)
from anatomy_cli.cli.options import (
    FormatOpt,
    PlotOpt,
    model_options,
    prompt_options,
)
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text.options import PromptOptions


class Pool(str, Enum):
    mean = "mean"
    first = "first"
    last = "last"


BASELINE_NOTE = ("baseline: mean cosine between the word and every other token of its own context "
                 "(special tokens excluded), averaged over the contexts; drift is real where similarity "
                 "falls towards it")


@app.command("drift")
@model_options()
@prompt_options(truncate=False)
def drift_command(
    word: Annotated[str, typer.Argument(
        metavar="WORD", show_default=False,
        help="The word to follow: matched as a whole word; in scripts written without spaces (Chinese, Japanese, "
        "Thai) as characters.")],
    context: Annotated[Optional[list[str]], typer.Option(
        "--context", "-c", metavar="TEXT", show_default=False,
        help="A context containing WORD; repeat, at least two. Default (for 'bank'): a money and a river sentence.",
    )] = None,
    matrix: Annotated[Optional[int], typer.Option(
        "--matrix", metavar="LAYER", min=0, show_default=False,
        help="Print the full pairwise similarity matrix at this layer instead of the per-layer table.",
    )] = None,
    pool: Annotated[Pool, typer.Option("--pool", case_sensitive=False,
                                       help="How to pool a word that spans several tokens.")] = Pool.mean,
    occurrence: Annotated[int, typer.Option("--occurrence", "-n", min=1, metavar="N",
                                            help="Which occurrence of WORD to use in each context (1-based).")] = 1,
    ignore_case: Annotated[bool, typer.Option("--ignore-case", "-i",
                                              help="Match WORD regardless of case.")] = False,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """Cosine similarity of WORD's vector between contexts at every layer, with an anisotropy baseline.

    Layer 0 is the embedding; layer L is the last block's output before any final
    norm. The header gives the 0-based token positions of WORD in each context.
    Baseline: the mean cosine between WORD and the other tokens of its own context.

    Examples:

        anatomy drift bank --init random

        anatomy drift bank -c "I paid at the bank." -c "We swam to the bank."

        anatomy drift bank -c TEXT -c TEXT -c TEXT --matrix 6 --format json
    """
    from anatomy_cli.analyses import drift as analysis
    from anatomy_cli.output import plots

    analysis.word_spans("", word)  # rejects an empty word before the model loads
    _check_utf8(word, "WORD")
    contexts = _contexts(word, context, ignore_case)
    opened, encoded = open_texts(contexts, spec, prompts, what="context", truncate_hint=False)
    # Before the weights load: the word must be in every context, --matrix within the layers.
    n_layers = opened.info.n_layers
    if matrix is not None and matrix > n_layers:
        raise UsageError(f"--matrix layer must be in 0..{n_layers}, got {matrix}")
    locations = [analysis.locate(i + 1, e.text, e.ids, e.offsets, e.pieces, word, special=e.special,
                                 occurrence=occurrence, ignore_case=ignore_case)
                 for i, e in enumerate(encoded)]
    lm = load_weights(opened)

    from anatomy_cli import engine

    with status("running the contexts"):
        caches = engine.run(lm, encoded, engine.residual_names(lm))
    result = analysis.drift(
        word, [c.residual_stream() for c in caches], locations, [e.ids for e in encoded],
        [e.special for e in encoded], pool_how=pool.value, is_causal=lm.is_causal, model=lm.name,
        untrained=lm.untrained, occurrence=occurrence, ignore_case=ignore_case, matrix_layer=matrix,
    )
    for a, b in result.identical:
        why = ("the model is decoder-only and sees only the left context"
               if lm.is_causal else "the two texts tokenize identically")
        warn(f"contexts {a} and {b} are identical up to and including {word!r} and {why}: "
             f"the word's vectors are identical in every layer, whatever follows")

    from anatomy_cli.output.render import emit

    emit(_report(result, model_label(lm), dtype_name(lm), lm.dequantized_from, encoded[0]), fmt)
    if plot:
        detail = f"{word!r} in {len(result.contexts)} contexts · pool {result.pool}"
        plots.draw("drift", plot, None, result, plots.Caption.of("drift", lm, detail=detail))


def _contexts(word: str, given: list[str] | None, ignore_case: bool) -> list[str]:
    from anatomy_cli.analyses.drift import DEFAULT_CONTEXTS, DEFAULT_WORD

    if not given:
        same = word.casefold() == DEFAULT_WORD if ignore_case else word == DEFAULT_WORD
        if not same:
            raise UsageError(f"no contexts given: the built-in pair is for {DEFAULT_WORD!r}; pass at least two "
                             f"--context/-c TEXT containing {word!r}")
        return list(DEFAULT_CONTEXTS)
    if len(given) < 2:
        raise UsageError("drift needs at least two contexts: repeat --context/-c TEXT")
    for i, text in enumerate(given, start=1):
        if not text.strip():
            raise UsageError(f"context {i} is empty")
        _check_utf8(text, f"context {i}")
    return list(given)


def _check_utf8(text: str, what: str) -> None:
    # Undecodable argv bytes arrive as lone surrogates, which tokenizers reject with a TypeError.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UsageError(f"{what} is not valid UTF-8 (character {exc.start + 1})") from None


def _report(result, label: str, dtype: str, dequantized_from: str | None, first=None):
    from anatomy_cli.output.render import Column, Report, Section

    data = result.to_dict()
    # The same key, in the same place, as every command's prompt record; the BOS rule is one for all contexts.
    bos = {"bos": first.bos, "bos_source": first.bos_source} if first is not None else {}
    data = {**{k: data[k] for k in ("word", "model", "untrained")}, "dtype": dtype,
            "dequantized_from": dequantized_from, **bos, **data}
    n = len(result.contexts)
    heading = [f"{result.word!r} in {n} contexts · {label} · pool {result.pool}"
               + (f" · occurrence {result.occurrence}" if result.occurrence != 1 else "")]
    for loc in result.contexts:
        where = "token" if len(loc.positions) == 1 else "tokens"
        heading.append(f"context {loc.context}: {where} {', '.join(map(str, loc.positions))} "
                       f"({'|'.join(loc.pieces)}) in {loc.text!r}")
    if first is not None and first.bos is not None:
        heading.append(f"every context: {bos_text(first)}")
    notes = []
    if result.match == "characters":
        notes.append(f"{result.word!r} is in a script written without spaces between words: matched as characters "
                     f"(not as a whole word); its vector pools the tokens that cover them")
    if not result.same_tokenization:
        notes.append("the word tokenized differently across contexts: "
                     + "; ".join(f"context {loc.context} {'|'.join(loc.pieces)} {list(loc.ids)}"
                                 for loc in result.contexts))
    if result.matrix is not None:
        columns = [Column("context", "context", "int")] + [
            Column(f"c{loc.context}", f"c{loc.context}", "float", 3) for loc in result.contexts]
        rows = [{"context": loc.context, **{f"c{j + 1}": v for j, v in enumerate(values)}}
                for loc, values in zip(result.contexts, result.matrix)]
        heading.append(f"pairwise cosine similarity at layer {result.matrix_layer} of {result.n_layers}")
        return Report(data=data, sections=[Section(columns, rows)], heading=heading, notes=notes)
    similarity = "similarity" if n == 2 else f"similarity (mean of {n * (n - 1) // 2} pairs)"
    columns = [Column("layer", "layer", "int"), Column("similarity", similarity, "float", 3),
               Column("baseline", "baseline", "float", 3)]
    rows = data["layers"]
    notes = [f"layer 0 = embeddings; layer {result.n_layers} = last block output, before any final norm",
             BASELINE_NOTE, *notes]
    return Report(data=data, sections=[Section(columns, rows)], heading=heading, notes=notes)
