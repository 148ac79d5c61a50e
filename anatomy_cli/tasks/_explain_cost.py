"""`explain`'s cost, from the first generation's measured rates: seconds per prompt token (the prefill, up to the
first new token) and per new token, applied to one feature's explainer prompt and scorer prompts."""

from __future__ import annotations

import math
from typing import Any

from anatomy_cli.analyses.explain_prompts import explainer_messages
from anatomy_cli.analyses.explain_prompts import scorer_messages
from anatomy_cli.analyses.explain_score import SCORERS
from anatomy_cli.units import counted
from anatomy_cli.units import human_seconds

SCORER_TOKENS = 32  # the scorer answers a list of --shown 0/1s: [1,0,0,1,1] is about 11 tokens


def estimate(chat: Any, ex: Any, opts: Any, n_features: int) -> dict[str, Any]:
    """``{"prompt_tokens", "prefill_s_per_token", "decode_s_per_token", "explain_s", "scorer_prompts",
    "scorer_prompt_tokens", "score_s", "per_feature_s", "features", "total_s"}`` (seconds), the explanation
    assumed to use --max-new-tokens and each scorer answer 32 tokens: an upper bound where they stop early."""

    rates = chat.rates
    pre, dec = rates["prefill_s_per_token"], rates["decode_s_per_token"]
    explain_tokens = len(chat.ids(explainer_messages(ex.train, ex.max_activation)))
    texts = ["".join(t) for t, _ in (list(ex.test) + list(ex.not_active))[:opts.shown]]
    score_tokens = len(chat.ids(scorer_messages("fuzz", "an explanation of about ten words, as a small model writes",
                                                texts)))
    per_scorer = math.ceil((len(ex.test) + len(ex.not_active)) / opts.shown)
    prompts = per_scorer * len(SCORERS) * 2  # its own explanation and the control's
    explain_s = explain_tokens * pre + opts.max_new_tokens * dec
    score_s = prompts * (score_tokens * pre + SCORER_TOKENS * dec)
    return {**rates, "explain_prompt_tokens": explain_tokens, "explain_s": explain_s, "scorer_prompts": prompts,
            "scorer_prompt_tokens": score_tokens, "score_s": score_s, "per_feature_s": explain_s + score_s,
            "features": n_features, "total_s": n_features * (explain_s + score_s)}


def line(c: dict[str, Any], other_scorer: bool) -> str:
    note = " (the scorer's rate taken as the explainer's)" if other_scorer else ""
    return (f"explain: measured {c['prefill_s_per_token'] * 1e3:.2f} ms per prompt token and "
            f"{c['decode_s_per_token'] * 1e3:.1f} ms per new token; per feature about "
            f"{human_seconds(c['per_feature_s'])} (an explanation: {c['explain_prompt_tokens']:,} prompt tokens, "
            f"{human_seconds(c['explain_s'])}; {c['scorer_prompts']} scorer prompts of about "
            f"{c['scorer_prompt_tokens']:,} tokens, {human_seconds(c['score_s'])}){note}; "
            f"{counted(c['features'], 'feature')}: at most {human_seconds(c['total_s'])}")
