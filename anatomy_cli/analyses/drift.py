"""Word drift: how one word's vector diverges across contexts, layer by layer.

Pure functions over token offsets and residual-stream tensors; no model, no
printing. The command (`anatomy drift`) tokenizes the contexts, runs the engine
and hands the residual streams to :func:`drift`.

Definitions used throughout:

- Layers are the engine's residual stream: row 0 is the embedding output (the
  input of block 0), row ``l`` is the output of block ``l - 1``, raw (before the
  final norm). A model with ``L`` blocks has rows ``0..L``.
- The word is found by character offsets (whole word, or its characters in a script
  written without spaces, see :func:`anatomy_cli.text.words.word_spans`);
  its tokens are every non-special token whose character span overlaps the word.
- Its vector at a layer is the pooled vector of those tokens (:func:`pool`).
- Similarity is cosine similarity, computed in float64 so that two identical
  vectors give exactly 1.0 (0 when a vector is zero).
- Baseline (anisotropy): for each context, the mean cosine between the word's
  pooled vector and the vector of every *other* token of the same context
  (special tokens such as ``[CLS]``/``[SEP]`` and the word's own tokens
  excluded), then averaged over the contexts. In a crowded (anisotropic) space
  this is already high; drift is real when the similarity between contexts falls
  towards or below it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from itertools import combinations
from typing import Any

import torch

from anatomy_cli.analyses.trace import cosine  # float64, exactly 1.0 for identical vectors, 0 for a zero vector
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sites import residual_label

# word_spans and tokens_in_span stay importable from here (the drift command and its tests use them).
from anatomy_cli.text.words import find_word
from anatomy_cli.text.words import matched_as_characters
from anatomy_cli.text.words import tokens_in_span  # noqa: F401
from anatomy_cli.text.words import word_spans  # noqa: F401

POOLS = ("mean", "first", "last")

# The built-in pair for `anatomy drift bank`: " bank" is token 6 in both for the
# GPT-2 tokenizer (and token 7, after [CLS], for BERT's uncased WordPiece), so the
# position embeddings match and layer 0 is identical; the left contexts differ.
DEFAULT_WORD = "bank"
DEFAULT_CONTEXTS = (
    "I deposited the cash at the bank.",
    "We sat on the muddy river bank.",
)


@dataclass(frozen=True)
class WordLocation:
    """Where the word sits in one context.

    ``context`` is 1-based (as shown to the user); ``start``/``end`` are character
    offsets into ``text``; ``positions`` are 0-based token positions; ``ids`` and
    ``pieces`` (display strings) are the tokens at those positions.
    """

    context: int
    text: str
    start: int
    end: int
    positions: tuple[int, ...]
    ids: tuple[int, ...]
    pieces: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"context": self.context, "text": self.text, "char_start": self.start, "char_end": self.end,
                "positions": list(self.positions), "token_ids": list(self.ids), "tokens": list(self.pieces)}


def locate(context: int, text: str, ids: Sequence[int], offsets: Sequence[tuple[int, int]],
           pieces: Sequence[str], word: str, *, special: Sequence[bool] | None = None,
           occurrence: int = 1, ignore_case: bool = False) -> WordLocation:
    """Find occurrence ``occurrence`` (1-based) of ``word`` in one tokenized context.

    ``ids``, ``offsets``, ``pieces`` and ``special`` are per token, as the engine's
    ``encode`` returns them; ``context`` is the 1-based number used in messages.
    Raises UsageError (exit 2) when the word is absent (the message shows how the
    context tokenized) or occurs fewer than ``occurrence`` times; AnatomyError when
    the word is present but no token covers it (e.g. cut off by truncation).
    """
    span, positions = find_word(text, word, offsets, special=special, pieces=pieces, occurrence=occurrence,
                                ignore_case=ignore_case, where=f"context {context}")
    return WordLocation(context=context, text=text, start=span[0], end=span[1], positions=tuple(positions),
                        ids=tuple(ids[p] for p in positions), pieces=tuple(pieces[p] for p in positions))


def pooled_positions(positions: Sequence[int], how: str) -> list[int]:
    """The token positions that ``how`` (mean/first/last) actually reads."""
    if how == "mean":
        return list(positions)
    if how == "first":
        return [positions[0]]
    if how == "last":
        return [positions[-1]]
    raise UsageError(f"unknown pooling {how!r}; choose one of {', '.join(POOLS)}")


def pool(stream: torch.Tensor, positions: Sequence[int], how: str = "mean") -> torch.Tensor:
    """Pool the word's tokens at every layer.

    ``stream``: float tensor [n_layers + 1, pos, d_model]. Returns float64
    [n_layers + 1, d_model]: the mean over ``positions`` ("mean"), or the first/last
    of them. float64 so that pooling a bf16/fp16 stream loses nothing more.
    """
    used = pooled_positions(positions, how)
    return stream[:, used].double().mean(dim=1)


def pairwise(vectors: Sequence[torch.Tensor]) -> dict[tuple[int, int], torch.Tensor]:
    """Cosine per layer for every pair of contexts.

    ``vectors``: one [n_layers + 1, d_model] tensor per context. Returns
    ``{(i, j): float64 [n_layers + 1]}`` for 0-based i < j.
    """
    return {(i, j): cosine(vectors[i], vectors[j]) for i, j in combinations(range(len(vectors)), 2)}


def context_baseline(stream: torch.Tensor, word_vector: torch.Tensor, exclude: Sequence[int]) -> torch.Tensor:
    """Mean cosine between the word's vector and the other tokens of its context, per layer.

    ``stream``: [n_layers + 1, pos, d_model] for the positions in question (the
    caller drops special tokens by listing them in ``exclude`` too);
    ``word_vector``: [n_layers + 1, d_model]. Returns float64 [n_layers + 1];
    all NaN when no other token is left.
    """
    dropped = set(exclude)
    keep = [p for p in range(stream.shape[1]) if p not in dropped]
    if not keep:
        return torch.full((stream.shape[0],), math.nan, dtype=torch.float64)
    return cosine(stream[:, keep], word_vector[:, None, :]).mean(dim=1)


def identical_pairs(ids: Sequence[Sequence[int]], used: Sequence[Sequence[int]], *,
                    is_causal: bool) -> list[tuple[int, int]]:
    """Pairs (0-based i < j) whose word vectors are identical by construction.

    A decoder-only (causal) model sees only the left context: when the pooled
    token positions ``used`` are the same and the token ids agree up to and
    including the last of them, every layer's vector is the same whatever
    follows. An encoder sees the whole text, so only identical token sequences
    qualify.
    """
    pairs = []
    for i, j in combinations(range(len(ids)), 2):
        if list(used[i]) != list(used[j]):
            continue
        if is_causal:
            stop = max(used[i]) + 1
            same = list(ids[i][:stop]) == list(ids[j][:stop])
        else:
            same = list(ids[i]) == list(ids[j])
        if same:
            pairs.append((i, j))
    return pairs


@dataclass(frozen=True)
class PairDrift:
    """Cosine similarity per layer between the word in two contexts (1-based numbers)."""

    context_a: int
    context_b: int
    similarity: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"context_a": self.context_a, "context_b": self.context_b, "similarity": list(self.similarity)}


@dataclass(frozen=True)
class DriftResult:
    """The drift of one word across contexts, residual rows 0..n_layers (named embed, blocks 0..L−1).

    ``similarity[l]``: cosine between the word's pooled vectors at layer ``l``
    (the mean over all pairs when there are more than two contexts).
    ``baseline[l]``: the anisotropy baseline (see the module docstring), the mean
    of ``baseline_by_context[c][l]`` over contexts. NaN (null in JSON) where
    undefined. ``identical`` lists 1-based context pairs whose vectors are
    identical by construction (see :func:`identical_pairs`).
    """

    word: str
    model: str
    untrained: bool
    is_causal: bool
    n_layers: int
    pool: str
    occurrence: int
    ignore_case: bool
    contexts: tuple[WordLocation, ...]
    similarity: tuple[float, ...]
    baseline: tuple[float, ...]
    baseline_by_context: tuple[tuple[float, ...], ...]
    pairs: tuple[PairDrift, ...]
    identical: tuple[tuple[int, int], ...] = ()
    matrix_layer: int | None = None
    matrix: tuple[tuple[float, ...], ...] | None = field(default=None)

    @property
    def match(self) -> str:
        """``word`` (whole-word matching) or ``characters`` (a script without spaces, see :func:`word_spans`)."""
        return "characters" if matched_as_characters(self.word) else "word"

    def __post_init__(self) -> None:
        rows = self.n_layers + 1
        if len(self.similarity) != rows or len(self.baseline) != rows:
            raise ValueError(f"similarity/baseline need {rows} rows (layers 0..{self.n_layers})")
        if len(self.contexts) < 2:
            raise ValueError("drift needs at least two contexts")

    @property
    def labels(self) -> list[str | int]:
        """The residual rows' names: ``embed``, then blocks 0..L−1 (docs/engine.md#layers)."""
        return [residual_label(row) for row in range(self.n_layers + 1)]

    @property
    def matrix_label(self) -> str | int | None:
        return None if self.matrix_layer is None else residual_label(self.matrix_layer)

    @property
    def same_tokenization(self) -> bool:
        """True when the word is the same token ids in every context."""
        return len({loc.ids for loc in self.contexts}) == 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "word": self.word,
            "model": self.model,
            "untrained": self.untrained,
            "is_causal": self.is_causal,
            "n_layers": self.n_layers,
            "pool": self.pool,
            "occurrence": self.occurrence,
            "ignore_case": self.ignore_case,
            "match": self.match,
            "same_tokenization": self.same_tokenization,
            "identical_pairs": [list(p) for p in self.identical],
            "contexts": [loc.to_dict() for loc in self.contexts],
            "layers": [{"layer": layer, "similarity": s, "baseline": b}
                       for layer, s, b in zip(self.labels, self.similarity, self.baseline)],
            "baseline_by_context": [list(b) for b in self.baseline_by_context],
            "pairs": [p.to_dict() for p in self.pairs],
            "matrix": None if self.matrix is None else {"layer": self.matrix_label,
                                                          "values": [list(r) for r in self.matrix]},
        }


def _floats(t: torch.Tensor) -> tuple[float, ...]:
    return tuple(float(v) for v in t.tolist())


def drift(word: str, streams: Sequence[torch.Tensor], locations: Sequence[WordLocation],
          ids: Sequence[Sequence[int]], special: Sequence[Sequence[bool]], *, pool_how: str = "mean",
          is_causal: bool, model: str = "", untrained: bool = False, occurrence: int = 1,
          ignore_case: bool = False, matrix_layer: int | None = None) -> DriftResult:
    """Compare the word's vectors across contexts at every layer.

    ``streams``: per context, float tensor [n_layers + 1, pos, d_model] over all
    token positions (the engine's ``Cache.residual_stream()``); ``locations``,
    ``ids`` and ``special`` per context, aligned with ``streams``. ``matrix_layer``
    (0..n_layers) adds the full pairwise matrix at that layer. Raises UsageError
    for fewer than two contexts, an unknown pooling or a layer out of range.
    """
    if len(streams) < 2:
        raise UsageError("drift needs at least two contexts")
    n_layers = streams[0].shape[0] - 1
    if matrix_layer is not None and not 0 <= matrix_layer <= n_layers:
        raise UsageError(f"--matrix layer must be in 0..{n_layers}, got {matrix_layer}")
    used = [pooled_positions(loc.positions, pool_how) for loc in locations]
    vectors = [pool(stream, loc.positions, pool_how) for stream, loc in zip(streams, locations)]
    per_pair = pairwise(vectors)
    similarity = torch.stack(list(per_pair.values())).mean(dim=0)
    by_context = [
        context_baseline(stream, vec, [*loc.positions, *(p for p, s in enumerate(sp) if s)])
        for stream, vec, loc, sp in zip(streams, vectors, locations, special)
    ]
    stacked = torch.stack(by_context)
    baseline = stacked.nanmean(dim=0)  # a context made of the word alone has no baseline of its own
    matrix = None
    if matrix_layer is not None:
        n = len(vectors)
        self_sim = [float(cosine(v[matrix_layer], v[matrix_layer])) for v in vectors]
        matrix = tuple(
            tuple(self_sim[i] if i == j else float(per_pair[(min(i, j), max(i, j))][matrix_layer])
                  for j in range(n))
            for i in range(n)
        )
    return DriftResult(
        word=word, model=model, untrained=untrained, is_causal=is_causal, n_layers=n_layers, pool=pool_how,
        occurrence=occurrence, ignore_case=ignore_case, contexts=tuple(locations),
        similarity=_floats(similarity), baseline=_floats(baseline),
        baseline_by_context=tuple(_floats(b) for b in by_context),
        pairs=tuple(PairDrift(i + 1, j + 1, _floats(v)) for (i, j), v in per_pair.items()),
        identical=tuple((i + 1, j + 1) for i, j in identical_pairs(ids, used, is_causal=is_causal)),
        matrix_layer=matrix_layer, matrix=matrix,
    )
