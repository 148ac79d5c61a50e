"""The parts of `anatomy steer`: reading the prompt pairs and layers, making and saving the vector."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anatomy_cli.errors import UsageError
from anatomy_cli.output.render import Column, Report, Section

if TYPE_CHECKING:
    from anatomy_cli.analyses.steering import LayerDirection
    from anatomy_cli.engine import Encoded, LoadedModel
    from anatomy_cli.engine.steering import SteeringVector


COLUMNS = (Column("layer", "layer", "int"), Column("norm", "norm", "float", 3),
           Column("separation", "pairs separated", "pct", 1))
SITES = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


@dataclass(frozen=True)
class Steering:
    """What `anatomy steer` made: the vector (with its metadata) and one direction record per layer."""

    vector: SteeringVector
    directions: tuple[LayerDirection, ...]


def check_options(positive: list[str], negative: list[str], pairs: Path | None, site: str, reduce: str,
                  method: str) -> tuple[list[str], list[str]]:
    """The positive and negative prompts once the options agree; UsageError otherwise (before any model)."""
    pos, neg = read_pairs(positive, negative, pairs)
    if site not in SITES:
        raise UsageError(f"--site {site!r}: one of {', '.join(SITES)}")
    if reduce not in ("last", "mean"):
        raise UsageError(f"--reduce {reduce!r}: 'last' or 'mean'")
    if method not in ("mean", "pca"):
        raise UsageError(f"--method {method!r}: 'mean' or 'pca'")
    if method == "pca" and (len(pos) != len(neg) or len(pos) < 2):
        raise UsageError(f"--method pca needs pairs: as many positive as negative prompts, at least 2 "
                         f"(got {len(pos)} and {len(neg)})")
    return pos, neg


def run(lm: LoadedModel, encoded: list[Encoded], pos: list[str], neg: list[str], layers: list[int], site: str,
        reduce: str, method: str, batch_size: int, out: Path | None, gguf_out: Path | None, model: str
        ) -> tuple[Steering, Report]:
    """Make the vector from ``encoded`` (the positive prompts, then the negative ones), write the files asked
    for, and the report the command prints."""
    from anatomy_cli.cli.app import status
    from anatomy_cli.cli.commands._common import model_label
    from anatomy_cli.cli.records import model_record

    with status(f"running {len(encoded)} prompts"):
        vector, dirs = make(lm, encoded[:len(pos)], encoded[len(pos):], layers, site, reduce, method,
                            batch_size, pos, neg)
    notes = save_all(lm, vector, out, gguf_out, model)
    data = {**model_record(lm), "site": site, "reduce": reduce, "method": method,
            "n_positive": len(pos), "n_negative": len(neg), "layers": [d.to_dict() for d in dirs],
            "out": None if out is None else str(out), "control_vector": None if gguf_out is None else str(gguf_out)}
    heading = [f"steer · {model_label(lm)}", f"{len(pos)} positive · {len(neg)} negative · {site} · "
               f"{reduce} position{'s' if reduce == 'mean' else ''} · {method}"]
    report = Report(data=data, sections=[Section(COLUMNS, data["layers"], title="directions")], heading=heading,
                    notes=notes)
    return Steering(vector, tuple(dirs)), report


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
        gguf_model = _gguf_model(model)
        notes += [f"saved {gguf_out} (llama.cpp control vector: block L = direction.L)",
                  f"llama.cpp: llama-cli -m {gguf_model} --control-vector-scaled {gguf_out} C "
                  f"--control-vector-layer-range {first} {last}  (C: the coefficient of anatomy generate --coef; "
                  f"llama-server takes the same options)",
                  *ollama_modelfile(gguf_model, gguf_out, first, last)]
    return notes


def _gguf_model(model: str) -> str:
    """The GGUF file for the llama.cpp command line: ``model`` itself, a packaged model's file, else MODEL.gguf."""
    if model.lower().endswith(".gguf"):
        return model
    from anatomy_cli.models import packaged

    found = packaged.find(model)
    return str(found) if found is not None else "MODEL.gguf"


def ollama_modelfile(gguf_model: str, gguf_out: Path, first: int, last: int) -> list[str]:
    """The Ollama Modelfile lines, honest about what released Ollama does: it loads the model from the GGUF but
    has no Modelfile instruction for a control vector (ollama/ollama#8148, open and unmerged, proposes one), so
    the vector is named in a comment only."""
    return ["Ollama Modelfile (released Ollama does NOT apply control vectors; the vector below is a comment):",
            f"  FROM {gguf_model}",
            f"  # control vector {gguf_out}, blocks {first}-{last}, coefficient C: not supported by released Ollama;",
            "  # ollama/ollama#8148 (open, unmerged) proposes a Modelfile instruction for it. Use llama.cpp above."]
