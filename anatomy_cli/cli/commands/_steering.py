"""The parts of `anatomy steer`: reading the prompt pairs and layers, making and saving the vector."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    from anatomy_cli.analyses.steering import LayerDirection
    from anatomy_cli.engine import Encoded, LoadedModel
    from anatomy_cli.engine.steering import SteeringVector


def read_pairs(positive: list[str], negative: list[str], pairs: Path | None) -> tuple[list[str], list[str]]:
    """The positive and negative prompts from the options and/or a pairs file (TSV or JSON lines). Raises
    UsageError for a missing side, an empty prompt or a malformed line."""
    pos, neg = list(positive), list(negative)
    if pairs is not None:
        if not pairs.is_file():
            raise UsageError(f"--pairs {pairs}: no such file")
        for number, line in enumerate(pairs.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            p, n = _pair(line, pairs, number)
            pos.append(p)
            neg.append(n)
    if not pos or not neg:
        raise UsageError("give both sides: --positive TEXT and --negative TEXT (repeatable), or --pairs FILE")
    if any(not t.strip() for t in pos + neg):
        raise UsageError("empty prompt in --positive/--negative/--pairs")
    return pos, neg


def _pair(line: str, path: Path, number: int) -> tuple[str, str]:
    if line.lstrip().startswith("{"):
        try:
            obj = json.loads(line)
            return str(obj["positive"]), str(obj["negative"])
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UsageError(f"{path}:{number}: a JSON line needs \"positive\" and \"negative\"") from None
    parts = line.split("\t")
    if len(parts) != 2:
        raise UsageError(f"{path}:{number}: expected POSITIVE<TAB>NEGATIVE (or a JSON line)")
    return parts[0], parts[1]


def parse_layers(text: str, n_layers: int) -> list[int]:
    """``"6"``, ``"4-8"``, ``"2,6"`` -> block numbers in 0..n_layers-1. Raises UsageError otherwise."""
    if not text.strip():
        raise UsageError(f"--layer is required: a block 0..{n_layers - 1}, a range A-B or a list L,L")
    layers: list[int] = []
    try:
        for part in text.split(","):
            if "-" in part:
                a, b = part.split("-", 1)
                layers += list(range(int(a), int(b) + 1))
            else:
                layers.append(int(part))
    except ValueError:
        raise UsageError(f"--layer {text!r}: a block number, a range A-B or a list L,L") from None
    bad = [x for x in layers if not 0 <= x < n_layers]
    if bad or not layers:
        raise UsageError(f"--layer {text!r}: blocks are 0..{n_layers - 1}")
    return sorted(dict.fromkeys(layers))


def make(lm: LoadedModel, pos_enc: list[Encoded], neg_enc: list[Encoded], layers: list[int], site: str,
         reduce: str, method: str, batch_size: int, pos: list[str], neg: list[str]
         ) -> tuple[SteeringVector, list[LayerDirection]]:
    """Run both sides, take the directions, and the vector with its metadata."""
    from anatomy_cli.analyses import steering as analysis
    from anatomy_cli.engine import steering

    a = steering.site_activations(lm, pos_enc, layers, site, reduce=reduce, batch_size=batch_size)
    b = steering.site_activations(lm, neg_enc, layers, site, reduce=reduce, batch_size=batch_size)
    dirs = analysis.directions(a, b, layers, method)
    meta: dict[str, Any] = {"format": "anatomy-steering-vector", "version": 1, "method": method, "reduce": reduce,
                            "model": steering.model_identity(lm), "positive": pos, "negative": neg}
    vector = steering.SteeringVector({d.layer: d.vector.float() for d in dirs}, site=site, meta=meta)
    return vector, dirs


def save_all(lm: LoadedModel, vector: SteeringVector, out: Path | None, gguf_out: Path | None,
             model: str) -> list[str]:
    """Write the files asked for; the notes: where they went and how llama.cpp (and Ollama) use them."""
    from anatomy_cli.engine import control_vector, steering

    notes = []
    if out is not None:
        steering.save(vector, out)
        notes.append(f"saved {out}: anatomy generate PROMPT -m {model} --steer {out} --coef 1")
    if gguf_out is not None:
        control_vector.write({k: v.numpy() for k, v in vector.directions.items()}, gguf_out,
                             model_hint=lm.info.model_type, site=vector.site)
        first, last = vector.layers[0], vector.layers[-1]
        gguf_model = model if model.lower().endswith(".gguf") else "MODEL.gguf"
        notes += [f"saved {gguf_out} (llama.cpp control vector: block L = direction.L)",
                  f"llama.cpp: llama-cli -m {gguf_model} --control-vector-scaled {gguf_out} C "
                  f"--control-vector-layer-range {first} {last}  (C: the coefficient of anatomy generate --coef)",
                  f"Ollama: released Ollama has no Modelfile instruction for control vectors (open pull "
                  f"request ollama/ollama#8148 proposes one); run it through llama.cpp, e.g. llama-server -m "
                  f"{gguf_model} --control-vector-scaled {gguf_out} C"]
    return notes
