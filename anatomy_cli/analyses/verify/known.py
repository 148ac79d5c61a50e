"""Section 4 of `anatomy verify`: known answers of trained models, which catch an engine that is exact against
the wrong reference (a rotary embedding or a norm applied wrongly everywhere). Skipped for random weights.

* induction and previous-token heads on ``SEQ_LEN`` random ordinary tokens repeated (``analyses.heads``'
  scores, ``engine.attention_patterns``): the best induction score and the best previous-token score;
* IOI: "When Mary and John went to the store, John gave a drink to" from name pairs and two templates: the
  fraction of prompts where the indirect object's logit beats the subject's;
* capitals: "The capital of France is": the fraction whose answer's first token is in the top 5.

Each row gives its score beside its threshold (measured on SmolLM2-135M and Gemma-3-270M: docs/commands/
verify.md).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from anatomy_cli import engine
from anatomy_cli.analyses import heads as head_scores
from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.engine.model import LoadedModel

SEQ_LEN, SEED = 20, 0
INDUCTION, PREV_TOKEN, IOI, CAPITALS = 0.3, 0.3, 0.7, 0.6   # thresholds (see the module docstring)
NAMES = ("Mary", "John", "Tom", "Sarah", "James", "Alice", "David", "Emma")
TEMPLATES = ("When {io} and {s} went to the store, {s} gave a drink to",
             "Then, {s} and {io} had a long argument. Afterwards {s} said to")
CAPITAL_PROMPTS = (("France", "Paris"), ("Germany", "Berlin"), ("Japan", "Tokyo"), ("Italy", "Rome"),
                   ("Spain", "Madrid"), ("Russia", "Moscow"), ("Egypt", "Cairo"), ("China", "Beijing"))


def _first_token(lm: LoadedModel, text: str) -> int:
    return int(lm.tokenizer.hf(text, add_special_tokens=False)["input_ids"][0])


def induction(lm: LoadedModel) -> list[C.Check]:
    ids = head_scores.random_repeat(engine.ordinary_token_ids(lm), SEQ_LEN, SEED)
    bos = lm.info.bos_id if lm.info.add_bos else None
    start = 0 if bos is None else 1
    enc = engine.encode_ids(lm, ([bos] if bos is not None else []) + ids, text="random tokens repeated")

    def reduce(_i: int, _layer: int, pattern: torch.Tensor) -> torch.Tensor:
        rep = head_scores.repeat_scores(pattern, start=start, seq_len=SEQ_LEN)
        prev = head_scores.pattern_scores(pattern)[2:3]
        return torch.cat([rep, prev])                                 # [3, n_heads]

    scores = engine.attention_patterns(lm, [enc], reduce=reduce)[0]   # [layers, 3, heads]
    ind, prev = scores[:, 0].flatten(), scores[:, 2].flatten()

    def where(flat: torch.Tensor) -> str:
        k = int(flat.argmax())
        return f"L{k // lm.n_heads}.H{k % lm.n_heads}, median head {float(flat.median()):.3f}"

    return [C.score_check("induction head", float(ind.max()), INDUCTION,
                          note=f"{where(ind)}; {SEQ_LEN} random tokens x 2, seed {SEED}"),
            C.score_check("previous-token head", float(prev.max()), PREV_TOKEN, note=where(prev))]


def ioi_prompts() -> list[tuple[str, str, str]]:
    """``(prompt, indirect object, subject)`` for each ordered pair of the first names and each template."""
    pairs = list(itertools.permutations(NAMES[:3], 2)) + [(NAMES[i], NAMES[i + 1]) for i in range(3, 7, 2)]
    return [(t.format(io=io, s=s), io, s) for t in TEMPLATES for io, s in pairs]


def _last_logits(lm: LoadedModel, texts: Sequence[str]) -> list[torch.Tensor]:
    encoded = engine.encode(lm, list(texts))
    return [c.logits[-1] for c in engine.run(lm, encoded, ["logits"], positions=[[-1]] * len(encoded))]


def ioi(lm: LoadedModel) -> C.Check:
    prompts = ioi_prompts()
    logits = _last_logits(lm, [p for p, _, _ in prompts])
    wins = [float(x[_first_token(lm, " " + io)]) > float(x[_first_token(lm, " " + s)])
            for x, (_, io, s) in zip(logits, prompts)]
    return C.score_check("IOI: IO beats S", sum(wins) / len(wins), IOI,
                         note=f"{sum(wins)}/{len(wins)} prompts, {len(TEMPLATES)} templates")


def capitals(lm: LoadedModel) -> C.Check:
    logits = _last_logits(lm, [f"The capital of {country} is" for country, _ in CAPITAL_PROMPTS])
    hits = [_first_token(lm, " " + city) in x.topk(5).indices.tolist() for x, (_, city) in zip(logits, CAPITAL_PROMPTS)]
    missed = [city for hit, (_, city) in zip(hits, CAPITAL_PROMPTS) if not hit]
    return C.score_check("capitals in top 5", sum(hits) / len(hits), CAPITALS,
                         note=f"{sum(hits)}/{len(hits)}" + (f"; missed {', '.join(missed)}" if missed else ""))


def known_answers(lm: LoadedModel) -> C.SectionResult:
    title = "known answers of trained models"
    if lm.untrained:
        return C.SectionResult("known", title, (C.skipped("known answers", "untrained weights (--init random): "
                                                          "no known answers to expect"),))
    if not lm.is_causal or not lm.has_unembed:
        return C.SectionResult("known", title, (C.skipped("known answers", "needs a decoder with an LM head"),))
    rows = induction(lm) + [ioi(lm), capitals(lm)]
    return C.SectionResult("known", title, tuple(rows), note="score >= threshold passes")
