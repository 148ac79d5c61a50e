"""delphi's prompts, as its explainer and its detection and fuzzing scorers send them (EleutherAI/delphi,
eai-delphi 0.1.3: ``delphi/explainers/default/prompts.py``, ``prompt_builder.py``, ``default.py``,
``explainers/explainer.py``; ``delphi/scorers/classifier/prompts/{detection,fuzz}_prompt.py``, ``classifier.py``).

The texts (:mod:`anatomy_cli.analyses.delphi_prompts`) are delphi's, byte for byte (tests/test_explain.py builds
delphi's own prompts with delphi's code and compares); the builders return the chat messages delphi hands its
client, which renders them with the model's chat template (``apply_chat_template(messages,
add_generation_prompt=True)``). Standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from anatomy_cli.analyses import delphi_prompts as P

Messages = list[dict[str, str]]

THRESHOLD = 0.3  # delphi's Explainer.threshold and the fuzzing scorer's: tokens above 0.3 x the example's max
MAX_LISTED = 10  # explainer.py _join_activations: "for each example, we only show the first 10 activations"
UNPARSED = "Explanation could not be parsed."
LOOP_TIMES = 4  # a run of words said this many times in a row: the explainer looped (a degenerate repetition)
LOOP_WORDS = 12  # the longest run of words looked for


def highlight(tokens: Sequence[str], activations: Sequence[float], threshold: float = THRESHOLD) -> str:
    """delphi's ``Explainer._highlight``: runs of tokens whose activation is above ``threshold`` x the example's
    maximum, each run between ``<<`` and ``>>``."""
    limit = max(activations) * threshold
    out = ""
    i = 0
    while i < len(tokens):
        if activations[i] > limit:
            out += "<<"
            while i < len(tokens) and activations[i] > limit:
                out += tokens[i]
                i += 1
            out += ">>"
        else:
            out += tokens[i]
            i += 1
    return out


def activation_line(tokens: Sequence[str], activations: Sequence[float], normalized: Sequence[float],
                    threshold: float = THRESHOLD) -> str:
    """delphi's ``Explainer._join_activations``: ``Activations: ("tok" : 7), ...`` for the highlighted tokens
    (the first 11, as its ``activation_count > 10`` test stops), each with its activation on delphi's 0-10
    scale."""
    acts = ""
    count = 0
    limit = max(activations) * threshold
    for tok, act, norm in zip(tokens, activations, normalized):
        if act > limit:
            if count > MAX_LISTED:
                break
            acts += f'("{tok}" : {int(norm)}), '
            count += 1
    return "Activations: " + acts


def normalized(activations: Sequence[float], max_activation: float, eps: float = 1e-6) -> list[float]:
    """delphi's ``samplers.normalize_activations``: ``ceil(a * 10 / max)`` clamped to 0..10, ``max`` the
    feature's largest activation (at least ``eps``)."""
    top = max(max_activation, eps)
    return [float(min(10, max(0, math.ceil(a * 10 / top)))) for a in activations]


def explainer_messages(examples: Sequence[tuple[Sequence[str], Sequence[float]]], max_activation: float,
                       activations: bool = True) -> Messages:
    """delphi's ``DefaultExplainer._build_prompt`` with its defaults as delphi's pipeline runs it (activations
    shown, no chain of thought, threshold 0.3): the system prompt, the three worked examples, then the
    examples, each highlighted and followed by its activation line."""
    shown: list[str] = []
    for tokens, acts in examples:
        shown.append(highlight(tokens, acts))
        if activations:
            shown.append(activation_line(tokens, acts, normalized(acts, max_activation)))
    messages = [{"role": "system", "content": P.SYSTEM.format(prompt="")}]
    worked = ((P.EXAMPLE_1_ACTIVATIONS if activations else P.EXAMPLE_1, P.EXAMPLE_1_EXPLANATION),
              (P.EXAMPLE_2_ACTIVATIONS if activations else P.EXAMPLE_2, P.EXAMPLE_2_EXPLANATION),
              (P.EXAMPLE_3_ACTIVATIONS if activations else P.EXAMPLE_3, P.EXAMPLE_3_EXPLANATION))
    for prompt, response in worked:
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    messages.append({"role": "user", "content": "\n" + "\n".join(shown) + "\n"})
    return messages


def parse_explanation(text: str) -> str:
    """delphi's ``Explainer.parse_explanation``: what follows ``[EXPLANATION]:``, stripped; else its
    "Explanation could not be parsed."."""
    match = re.search(r"\[EXPLANATION\]:\s*(.*)", text, re.DOTALL)
    return match.group(1).strip() if match else UNPARSED


def cut_loop(text: str) -> tuple[str, dict[str, object] | None]:
    """``text`` cut where it starts repeating itself: the first run of 1 to :data:`LOOP_WORDS` words said
    :data:`LOOP_TIMES` or more times in a row (words compared without case and the punctuation around them: "the
    word X, the word X, the word X, the word X." loops on "the word X,") is kept once, what follows dropped.
    Returns ``(text, None)`` when nothing loops, else ``(the text up to the run's first copy, {"repeated": the
    run as written, "times": how often in a row, "original_chars": len(text)})``."""
    words = list(re.finditer(r"\S+", text))
    keys = [w.group().lower().strip(".,;:!?\"'()") for w in words]
    for i in range(len(words)):
        for n in range(1, min(LOOP_WORDS, (len(words) - i) // LOOP_TIMES) + 1):
            unit = keys[i:i + n]
            times = 1
            while keys[i + times * n:i + (times + 1) * n] == unit:
                times += 1
            if times >= LOOP_TIMES:
                end = words[i + n - 1].end()
                repeated = text[words[i].start():end]
                return text[:end].rstrip(" ,;:"), {"repeated": repeated, "times": times,
                                                   "original_chars": len(text)}
    return text, None


def scorer_messages(kind: str, explanation: str, texts: Sequence[str]) -> Messages:
    """delphi's ``Classifier._build_prompt`` and its ``detection_prompt``/``fuzz_prompt``: the scorer's system
    prompt, its three worked examples, then ``Latent explanation: ...`` and the batch as ``Example i: text``.
    ``kind``: ``detection`` or ``fuzz``."""
    examples = "\n".join(f"Example {i}: {text}" for i, text in enumerate(texts))
    if kind == "detection":
        system, shots = P.DETECTION_SYSTEM_PROMPT, ((P.DETECTION_EXAMPLE_ONE, P.DETECTION_RESPONSE_ONE),
                                                    (P.DETECTION_EXAMPLE_TWO, P.DETECTION_RESPONSE_TWO),
                                                    (P.DETECTION_EXAMPLE_THREE, P.DETECTION_RESPONSE_THREE))
    else:
        system, shots = P.FUZZ_SYSTEM_PROMPT, ((P.FUZZ_EXAMPLE_ONE, P.FUZZ_RESPONSE_ONE),
                                               (P.FUZZ_EXAMPLE_TWO, P.FUZZ_RESPONSE_TWO),
                                               (P.FUZZ_EXAMPLE_THREE, P.FUZZ_RESPONSE_THREE))
    messages = [{"role": "system", "content": system}]
    for prompt, response in shots:
        messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    messages.append({"role": "user", "content": P.DETECTION_GENERATION_PROMPT.format(explanation=explanation,
                                                                                    examples=examples)})
    return messages
