"""delphi's detection and fuzzing scores: the samples, their order, the batches, the parsing of the scorer's
answer and the metrics (EleutherAI/delphi, eai-delphi 0.1.3: ``delphi/scorers/classifier/{classifier,detection,
fuzz,sample}.py``, ``delphi/log/result_analysis.py`` ``compute_confusion``/``compute_classification_metrics``).

An example is ``(tokens, activations)``: the token strings and the feature's activation at each. Detection shows
held-out activating examples and random non-activating ones as plain text and asks which hold the feature;
fuzzing shows the activating ones with their tokens above 0.3 x the example's max between ``<<`` ``>>`` and the
non-activating ones with as many random tokens marked (the mean count of nonzero activations over the activating
examples, rounded up; the token at ``len - len // 4`` first, as delphi does), and asks which are marked correctly.
Standard library only.
"""

from __future__ import annotations

import json
import math
import random
import re
import struct
from collections.abc import Callable
from collections.abc import Sequence
from dataclasses import dataclass

from anatomy_cli.analyses.explain_prompts import THRESHOLD
from anatomy_cli.analyses.explain_prompts import scorer_messages

Example = tuple[Sequence[str], Sequence[float]]
DEFAULT_MESSAGE = "<<NNsight>> is the best library for <<interpretability>> on huge models!"
SCORERS = ("detection", "fuzz")


@dataclass(frozen=True)
class Sample:
    """One text shown to the scorer; ``activating``: whether it came from the feature's activating examples."""

    text: str
    activating: bool


def marked(tokens: Sequence[str], check: Callable[[int], bool]) -> str:
    """delphi's ``sample._highlight``: runs of tokens where ``check(i)`` between ``<<`` and ``>>``."""
    out: list[str] = []
    run: list[str] = []
    state: bool | None = None
    for i, tok in enumerate(tokens):
        now = bool(check(i))
        if state is not None and now != state:
            out += ["<<", *run, ">>"] if state else run
            run = []
        state = now
        run.append(tok)
    if run:
        out += ["<<", *run, ">>"] if state else run
    return "".join(out)


def _f32(x: float) -> float:
    """``x`` rounded to float32: delphi compares its float32 activations with the threshold as a torch scalar,
    which takes the tensor's dtype (3.0 >= 0.3 x 10.0 holds in float32, not in float64)."""
    return float(struct.unpack("f", struct.pack("f", x))[0])


def _false_positive(tokens: Sequence[str], activations: Sequence[float], n_incorrect: int) -> str:
    """delphi's ``_prepare_text`` for a non-activating example with ``n_incorrect`` tokens wrongly marked."""
    limit = _f32(THRESHOLD * max(activations))
    below = [i for i, a in enumerate(activations) if _f32(a) <= limit]
    if len(below) == 1:  # delphi: torch.nonzero(...).squeeze() of one index is 0-d: its default message
        return DEFAULT_MESSAGE
    rng = random.Random(22)  # delphi: random.seed(22) before each example
    k = min(n_incorrect, len(below))
    pos = len(tokens) - len(tokens) // 4
    if pos in below:
        picked = [pos]
        if k - 1 > 0:
            rest = [i for i in below if i != pos]
            picked += rng.sample(rest, k - 1)
    else:
        picked = rng.sample(below, k)
    chosen = set(picked)
    return marked(tokens, lambda i: i in chosen)


def samples(kind: str, test: Sequence[Example], not_active: Sequence[Example]) -> list[Sample]:
    """The samples delphi's ``DetectionScorer._prepare`` / ``FuzzingScorer._prepare`` (fuzz_type ``default``,
    non-activating examples without activations) make: the non-activating ones first, then the activating."""
    if kind == "detection":
        return [Sample("".join(t), False) for t, _ in not_active] + [Sample("".join(t), True) for t, _ in test]
    n_incorrect = math.ceil(sum(sum(1 for a in acts if a != 0) for _, acts in test) / len(test))
    out = [Sample(_false_positive(t, a, n_incorrect), False) for t, a in not_active]
    return out + [Sample(_true_positive(t, a), True) for t, a in test]


def _true_positive(tokens: Sequence[str], activations: Sequence[float]) -> str:
    """delphi's ``_prepare_text`` for an activating example: its tokens at or above 0.3 x its max marked."""
    limit = _f32(THRESHOLD * _f32(max(activations)))
    return marked(tokens, lambda i: _f32(activations[i]) >= limit)


def batches(items: list[Sample], shown: int, seed: int = 42) -> list[list[Sample]]:
    """delphi's ``Classifier.__call__``: the samples shuffled by ``random.Random(seed)`` (delphi's scorer seed 42,
    here fresh for every feature), cut into batches of ``shown`` (``n_examples_shown``)."""
    order = list(items)
    random.Random(seed).shuffle(order)
    return [order[i:i + shown] for i in range(0, len(order), shown)]


def parse(text: str, shown: int) -> list[bool] | None:
    """delphi's ``Classifier._parse``: the first ``[...]`` of the answer as a JSON list of 0/1, which must hold
    ``shown`` entries; None where it does not parse (delphi then counts the batch's samples as unanswered)."""
    match = re.search(r"\[.*?\]", text)
    if match is None:
        return None
    try:
        raw = json.loads(match.group(0))
    except json.JSONDecodeError:
        return None
    if not isinstance(raw, list) or len(raw) != shown:
        return None
    return [bool(x) for x in raw]


def metrics(pairs: Sequence[tuple[bool, bool | None]]) -> dict[str, float | int]:
    """delphi's ``compute_confusion`` and ``compute_classification_metrics`` over ``(activating, prediction)``
    pairs, the unanswered (None) left out: ``balanced_accuracy`` = (TP/P + TN/N) / 2, ``f1`` = 2PR/(P+R) with
    precision TP/(TP+FP) and recall TP/P (0 where a denominator is 0), and the counts."""
    valid = [(a, p) for a, p in pairs if p is not None]
    pos = sum(1 for a, _ in valid if a)
    neg = len(valid) - pos
    tp = sum(1 for a, p in valid if a and p)
    tn = sum(1 for a, p in valid if not a and not p)
    fp = sum(1 for a, p in valid if not a and p)
    recall = tp / pos if pos else 0.0
    precision = tp / (tp + fp) if tp + fp else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    balanced = ((tp / pos if pos else 0.0) + (tn / neg if neg else 0.0)) / 2
    return {"balanced_accuracy": balanced, "f1": f1, "precision": precision, "recall": recall,
            "true_positives": tp, "true_negatives": tn, "false_positives": fp, "false_negatives": pos - tp,
            "answered": len(valid), "unanswered": len(pairs) - len(valid)}


def score(kind: str, explanation: str, test: Sequence[Example], not_active: Sequence[Example], shown: int,
          ask: Callable[[list[dict[str, str]]], str], seed: int = 42) -> dict[str, float | int]:
    """One scorer on one explanation: the samples, shuffled and batched, each batch's prompt
    (:func:`~anatomy_cli.analyses.explain_prompts.scorer_messages`) answered by ``ask(messages) -> text``, the
    answers parsed, the metrics."""

    pairs: list[tuple[bool, bool | None]] = []
    for batch in batches(samples(kind, test, not_active), shown, seed):
        answer = parse(ask(scorer_messages(kind, explanation, [s.text for s in batch])), shown)
        predictions: list[bool | None] = list(answer) if answer is not None else [None] * len(batch)
        pairs += [(s.activating, p) for s, p in zip(batch, predictions)]
    return metrics(pairs)
