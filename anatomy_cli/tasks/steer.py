"""`steer`: a steering vector from contrastive prompts, saved for `generate --steer` and for llama.cpp (the task).

:class:`SteerOptions` reads the prompts (``positive``/``negative`` and a ``pairs`` file) and refuses what needs
no model (a site, reduction or method it does not know, a block list it cannot read, a control vector llama.cpp
has no slot for, a missing output directory); :func:`check` refuses a model that cannot generate and blocks past
it; :func:`run` makes the vector, writes the files asked for and returns a :class:`Steering`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.analyses.steering import LayerDirection
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.steering import SteeringVector
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "steer"
SITES = tuple(s.value for s in sites.WRITE_SITES)
Layer = int | str | list[int] | tuple[int, ...]


def _prompts(given: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    """One prompt (a str) or several."""
    return () if given is None else (given,) if isinstance(given, str) else tuple(given)


@dataclass(frozen=True)
class SteerOptions(Declared):
    """``positive``/``negative``: the prompts of each side (a str is one prompt), ``pairs``: a file of more;
    ``layer``: the block(s) (``6``, ``"4-8"``, ``[2, 6]``); ``site``: one of :data:`SITES`; ``reduce``: ``last``
    or ``mean``; ``method``: ``mean`` or ``pca``; ``out``: the safetensors file; ``save_control_vector``: the
    llama.cpp GGUF."""

    positive: str | list[str] | tuple[str, ...] | None = option(
        None, "--positive", metavar="TEXT", show_default=False, cli=list[str] | None,
        help="A prompt of the side to steer towards (repeat the option for more).")
    negative: str | list[str] | tuple[str, ...] | None = option(
        None, "--negative", metavar="TEXT", show_default=False, cli=list[str] | None,
        help="A prompt of the side to steer away from.")
    pairs: Path | str | None = option(
        None, "--pairs", metavar="FILE", show_default=False, cli=Path | None,
        help="Prompt pairs, one per line: POSITIVE<TAB>NEGATIVE, or JSON lines {\"positive\": ..., \"negative\": "
        "...}.")
    layer: Layer = option("", "--layer", "-l", metavar="L|A-B|L,L", cli=str,
                          help="Block(s) whose site gets a direction.")
    site: str = option("resid_post", "--site", help=f"Hook point kind: {', '.join(SITES)}.")
    reduce: str = option("last", "--reduce",
                         help="'last': the last token's activation; 'mean': the mean over the prompt's tokens.")
    method: str = option("mean", "--method", help="'mean': mean(positive) - mean(negative) (ActAdd/CAA); 'pca': "
                         "repeng's first principal component of the pair differences (unit norm).")
    out: Path | str | None = option(None, "--out", metavar="FILE", show_default=False, cli=Path | None,
                                    help="Save the vector (safetensors + JSON metadata).")
    save_control_vector: Path | str | None = option(
        None, "--save-control-vector", metavar="FILE.gguf", show_default=False, cli=Path | None,
        help="Also write llama.cpp's control-vector GGUF.")
    batch_size: int = shared.batch_size()
    sides: tuple[tuple[str, ...], tuple[str, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        pos, neg = read_pairs(_prompts(self.positive), _prompts(self.negative),
                              None if self.pairs is None else Path(self.pairs))
        object.__setattr__(self, "sides", (tuple(pos), tuple(neg)))
        if self.site not in SITES:
            raise UsageError(f"--site {self.site!r}: one of {', '.join(SITES)}")
        if self.reduce not in ("last", "mean"):
            raise UsageError(f"--reduce {self.reduce!r}: 'last' or 'mean'")
        if self.method not in ("mean", "pca"):
            raise UsageError(f"--method {self.method!r}: 'mean' or 'pca'")
        if self.method == "pca" and (len(pos) != len(neg) or len(pos) < 2):
            raise UsageError(f"--method pca needs pairs: as many positive as negative prompts, at least 2 "
                             f"(got {len(pos)} and {len(neg)})")
        for flag, path in (("--out", self.out), ("--save-control-vector", self.save_control_vector)):
            if path is not None and not Path(path).parent.is_dir():
                raise UsageError(f"{flag} {path}: no such directory {Path(path).parent}")
        if self.layer_text.strip():
            blocks = [int(b) for b in sites.parse_blocks(self.layer_text, None, "--layer", negative=False)]
            if self.save_control_vector is not None:
                from anatomy_cli.engine.control_vector import check_exportable

                check_exportable(blocks, self.site)

    @property
    def layer_text(self) -> str:
        return sites.blocks_text(self.layer)

    def blocks(self, n_layers: int) -> list[int]:
        """The blocks, in order, checked against a model of ``n_layers``."""
        if not self.layer_text.strip():
            raise UsageError(f"--layer is required: a block 0..{n_layers - 1}, a range A-B or a list L,L")
        found = sites.parse_blocks(self.layer_text, n_layers, "--layer", negative=False)
        return sorted(int(b) for b in found)


@dataclass(frozen=True)
class SteerPlan:
    layers: list[int]
    gguf_model: str  # the .gguf file behind the model, for the llama.cpp line (MODEL.gguf when none)


@dataclass(frozen=True)
class Steering:
    """What `anatomy steer` made: the vector (with its metadata), one direction record per layer, and what was
    saved (the lines saying where, and how llama.cpp and Ollama use it)."""

    vector: SteeringVector
    directions: tuple[LayerDirection, ...]
    saved: tuple[str, ...] = ()


def texts(opts: SteerOptions) -> list[str]:
    """The prompts to encode: the positive ones, then the negative ones."""
    return [*opts.sides[0], *opts.sides[1]]


def check(opened: Opened, opts: SteerOptions) -> SteerPlan:
    """``opened``: an OpenedModel or a LoadedModel. Refuses a model that cannot generate and blocks past it."""
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    layers = opts.blocks(opened.info.n_layers)
    if opts.out is None and opts.save_control_vector is None:
        notes.info("no --out or --save-control-vector: the vector is shown, not saved")
    source = opened.info.source  # the .gguf file (or the directory) behind the spec, decided by engine.open
    return SteerPlan(layers, source if source and not Path(source).is_dir() else "MODEL.gguf")


def run(lm: LoadedModel, encoded: list[Encoded], opts: SteerOptions, plan: SteerPlan) -> Steering:
    """Make the vector from ``encoded`` (the positive prompts, then the negative ones) and write the files."""
    pos, neg = opts.sides
    with notes.status(f"running {counted(len(encoded), 'prompt')}"):
        vector, dirs = make(lm, encoded[:len(pos)], encoded[len(pos):], plan.layers, opts.site, opts.reduce,
                            opts.method, opts.batch_size, list(pos), list(neg))
    saved = save_all(lm, vector, opts, plan.gguf_model)
    return Steering(vector, tuple(dirs), tuple(saved))


def make(lm: LoadedModel, pos_enc: list[Encoded], neg_enc: list[Encoded], layers: list[int], site: str,
         reduce: str, method: str, batch_size: int, pos: list[str], neg: list[str]
         ) -> tuple[SteeringVector, list[LayerDirection]]:
    """Run both sides, take the directions, and the vector with its metadata."""
    from anatomy_cli.analyses import steering as analysis
    from anatomy_cli.engine import steering

    a = steering.site_activations(lm, pos_enc, layers, site, reduce=reduce, batch_size=batch_size)
    b = steering.site_activations(lm, neg_enc, layers, site, reduce=reduce, batch_size=batch_size)
    dirs = analysis.directions(a, b, layers, method)
    meta: dict[str, object] = {"format": "anatomy-steering-vector", "version": 1, "method": method, "reduce": reduce,
                            "model": steering.model_identity(lm), "positive": pos, "negative": neg}
    vector = steering.SteeringVector({d.layer: d.vector.float() for d in dirs}, site=site, meta=meta)
    return vector, dirs


def save_all(lm: LoadedModel, vector: SteeringVector, opts: SteerOptions, gguf_model: str) -> list[str]:
    """Write the files asked for; the lines: where they went and how llama.cpp (and Ollama) use them."""
    from anatomy_cli.engine import control_vector
    from anatomy_cli.engine import steering

    lines = []
    if opts.out is not None:
        steering.save(vector, Path(opts.out))
        lines.append(f"saved {opts.out}: anatomy generate PROMPT -m {lm.name} --steer {opts.out} --coef 1")
    gguf_out = opts.save_control_vector
    if gguf_out is not None:
        control_vector.write({k: v.numpy() for k, v in vector.directions.items()}, Path(gguf_out),
                             model_hint=lm.info.model_type, site=vector.site)
        first, last = vector.layers[0], vector.layers[-1]
        lines += [f"saved {gguf_out} (llama.cpp control vector: block L = direction.L)",
                  f"llama.cpp: llama-cli -m {gguf_model} --control-vector-scaled {gguf_out} C "
                  f"--control-vector-layer-range {first} {last}  (C: the coefficient of anatomy generate --coef; "
                  f"llama-server takes the same options)",
                  *ollama_modelfile(gguf_model, gguf_out, first, last)]
    return lines


def ollama_modelfile(gguf_model: str, gguf_out: Path | str, first: int, last: int) -> list[str]:
    """The Ollama Modelfile lines, honest about what released Ollama does: it loads the model from the GGUF but
    has no Modelfile instruction for a control vector (ollama/ollama#8148, open and unmerged, proposes one), so
    the vector is named in a comment only."""
    return ["Ollama Modelfile (released Ollama does NOT apply control vectors; the vector below is a comment):",
            f"  FROM {gguf_model}",
            f"  # control vector {gguf_out}, blocks {first}-{last}, coefficient C: not supported by released Ollama;",
            "  # ollama/ollama#8148 (open, unmerged) proposes a Modelfile instruction for it. Use llama.cpp above."]


def read_pairs(positive: tuple[str, ...], negative: tuple[str, ...], pairs: Path | None
               ) -> tuple[list[str], list[str]]:
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
