"""delphi's own explainer prompt and detection/fuzzing scorers, run on examples given as JSON on stdin (for
tests/test_explain.py). Run with a Python that has torch and transformers, with eai-delphi (installed --no-deps,
plus the few packages its modules import: jaxtyping, orjson, aiofiles, beartype, blobfile, simple_parsing,
asyncer, httpx) importable, e.g. from ``ANATOMY_DELPHI_PATH`` (a site-packages folder), appended to sys.path.
vllm and faiss (imported by delphi's clients and constructors, used by neither the prompt nor the scorers) are
stubbed. The scorer model is a deterministic stand-in: :func:`answer`, the same rule the test gives anatomy.

Input: a list of ``{"examples": [[tokens, activations], ...], "max_activation": m, "test": [...], "not_active": [...],
"explanation": str, "shown": n}``. Output: a list of ``{"explainer": messages, "detection": {"prompts": [...],
"pairs": [[activating, prediction], ...]}, "fuzz": {...}}``.
"""

from __future__ import annotations

import json
import os
import sys
import types


def _stub(name: str) -> None:
    def attr(a: str):
        if a.startswith("__"):
            raise AttributeError(a)
        return type(a, (), {})

    module = types.ModuleType(name)
    module.__getattr__ = attr  # type: ignore[method-assign]
    sys.modules[name] = module


def answer(messages: list[dict[str, str]]) -> str:
    """The stand-in scorer: per ``Example i: text`` line of the last message, 1 when the text holds ``<<`` or
    its characters' code points sum to an odd number; no list at all when the first text's sum is a multiple
    of 7 (an unparsable answer)."""
    texts = [line.split(": ", 1)[1] if ": " in line else "" for line in messages[-1]["content"].splitlines()
             if line.startswith("Example ")]
    if texts and sum(map(ord, texts[0])) % 7 == 0:
        return "I cannot tell."
    return "[" + ",".join("1" if "<<" in t or sum(map(ord, t)) % 2 else "0" for t in texts) + "]"


def main() -> None:
    for extra in os.environ.get("ANATOMY_DELPHI_PATH", "").split(os.pathsep):
        if extra:
            sys.path.append(extra)
    for name in ("vllm", "vllm.distributed", "vllm.distributed.parallel_state", "vllm.inputs", "faiss"):
        _stub(name)
    import torch
    from delphi.clients.client import Client
    from delphi.clients.client import Response
    from delphi.explainers.default.default import DefaultExplainer
    from delphi.latents.latents import ActivatingExample
    from delphi.latents.latents import Latent
    from delphi.latents.latents import LatentRecord
    from delphi.latents.latents import NonActivatingExample
    from delphi.latents.samplers import normalize_activations
    from delphi.scorers.classifier.detection import DetectionScorer
    from delphi.scorers.classifier.fuzz import FuzzingScorer

    cases = json.load(sys.stdin)
    prompts: list[list[dict[str, str]]] = []

    class StandIn(Client):
        async def generate(self, prompt, **kwargs):
            prompts.append(prompt)
            return Response(text=answer(prompt))

    def activating(rows):
        return [ActivatingExample(tokens=torch.zeros(len(t), dtype=torch.long), activations=torch.tensor(a),
                                  str_tokens=list(t)) for t, a in rows]

    outs = []
    for given in cases:
        train = normalize_activations(activating(given["examples"]), given["max_activation"])
        out = {"explainer": DefaultExplainer(StandIn("x"), threshold=0.3)._build_prompt(train)}
        for name, cls in (("detection", DetectionScorer), ("fuzz", FuzzingScorer)):
            prompts.clear()
            quiet = [NonActivatingExample(tokens=torch.zeros(len(t), dtype=torch.long), activations=torch.zeros(len(t)),
                                          str_tokens=list(t)) for t, _ in given["not_active"]]
            record = LatentRecord(Latent("m", 0), test=activating(given["test"]), not_active=quiet,
                                  explanation=given["explanation"])
            result = cls(StandIn("x"), n_examples_shown=given["shown"]).call_sync(record)
            out[name] = {"prompts": list(prompts), "pairs": [[s.activating, s.prediction] for s in result.score]}
        outs.append(out)
    json.dump(outs, sys.stdout)


if __name__ == "__main__":
    main()
