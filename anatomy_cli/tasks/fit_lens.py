"""`fit-lens jacobian`: fit a Jacobian lens on prompts and write it in jlens' format (the task). `fit-lens tuned`
(a tuned lens on a corpus, tuned-lens' format) is :mod:`anatomy_cli.tasks._tuned_fit`; its options are the field
``tuned`` here.

jlens' estimator exactly (:mod:`anatomy_cli.engine.jacobian_fit`): per prompt (its first ``max_seq_len`` tokens)
one forward of the ids replicated ``dim_batch`` times and ``ceil(d_model / dim_batch)`` backward passes; ``J_l``
averaged over the valid positions (``skip_first`` through the second-to-last), then over the prompts. Prompts
too short to have a valid position are skipped and counted. Blocks are anatomy's (0..L−1, jlens' layers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._tuned_fit import TunedFitOptions

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel

COMMAND = "fit-lens"
INPUTS = {"kind": None, "prompt": "prompts"}  # KIND (positional), the CLI's --prompts FILE (the API's prompt)
KINDS = ("jacobian", "tuned")
DTYPES = {"fp16": "float16", "fp32": "float32"}


@dataclass(frozen=True)
class FitLensOptions:
    """``kind``: ``jacobian`` or ``tuned`` (``tuned``: the corpus options, :class:`TunedFitOptions`; ``out`` the
    directory; the Jacobian lens's options keep their defaults); ``prompt``: the prompts; ``out``: the ``.pt`` file to
    write; ``source_layers``: the blocks to fit (a list or the text ``0,4-8``; None: every block below the
    target); ``target_layer``: the block whose output J maps onto (None: the last; negative: from the end);
    ``dim_batch``: output dimensions per backward pass (the prompt's copies per forward); ``max_seq_len``: tokens
    kept per prompt; ``skip_first``: leading positions left out of the average; ``dtype``: ``fp16`` (jlens'
    files) or ``fp32``; ``overwrite``: replace an existing ``out``; ``checkpoint``: a file the running sums are
    written to after every prompt (atomically) and resumed from when it exists (same settings and prompts only);
    ``shard``: ``i/N`` (or ``(i, N)``) fits prompts i, i + N, i + 2N, ... (0-based) only, for ``fit-lens merge``."""

    kind: str = "jacobian"
    prompt: tuple[str, ...] = ()
    out: Path | None = None
    source_layers: Any = None
    target_layer: int | None = None
    dim_batch: int = 8
    max_seq_len: int = 128
    skip_first: int = 16
    dtype: str = "fp16"
    overwrite: bool = False
    checkpoint: Path | None = None
    shard: Any = None
    tuned: TunedFitOptions = field(default_factory=TunedFitOptions)

    def __post_init__(self) -> None:
        from anatomy_cli.errors import UsageError
        from anatomy_cli.tasks import _tuned_fit

        if self.kind not in KINDS:
            raise UsageError(f"fit-lens {self.kind}: anatomy fits {', '.join(KINDS)} lenses; fit-lens merge A.pt "
                             "B.pt --out C.pt merges Jacobian lens fits")
        object.__setattr__(self, "prompt", tuple(self.prompt or ()))
        if self.kind == "tuned":
            _tuned_fit.validate(self)
            object.__setattr__(self, "out", Path(self.out).expanduser())  # type: ignore[arg-type]
            return
        _tuned_fit.refuse_tuned_options(self.tuned, self.kind)
        if not self.prompt:
            raise UsageError("fit-lens needs prompts: --prompts FILE (one per line)")
        if self.out is None:
            raise UsageError("fit-lens needs --out FILE (the lens file to write)")
        object.__setattr__(self, "out", Path(self.out).expanduser())
        if self.out.is_dir():
            raise UsageError(f"--out {self.out} is a directory; give the .pt file to write")
        if self.out.exists() and not self.overwrite:
            raise UsageError(f"--out {self.out} exists: give --overwrite to replace it")
        if self.dtype not in DTYPES:
            raise UsageError(f"--dtype {self.dtype!r}: use fp16 (jlens' files) or fp32")
        if self.shard is not None:
            object.__setattr__(self, "shard", _shard(self.shard))
        if self.checkpoint is not None:
            object.__setattr__(self, "checkpoint", Path(self.checkpoint).expanduser())
            if self.checkpoint == self.out:
                raise UsageError("--checkpoint must be another file than --out")
        for name, value, least in (("--dim-batch", self.dim_batch, 1), ("--max-seq-len", self.max_seq_len, 2),
                                   ("--skip-first", self.skip_first, 0)):
            if value < least:
                raise UsageError(f"{name} takes a whole number of at least {least}")
        if self.skip_first + 2 > self.max_seq_len:
            raise UsageError(f"--skip-first {self.skip_first} leaves no position in --max-seq-len "
                             f"{self.max_seq_len} tokens (a prompt needs skip_first + 2)")
        if self.source_layers is not None:
            text = self.source_layers if isinstance(self.source_layers, str) else ",".join(
                str(v) for v in self.source_layers)
            object.__setattr__(self, "source_layers", tuple(sites.parse_blocks(text, None, "--source-layers")))


def _shard(value: Any) -> tuple[int, int]:
    """``"i/N"`` or ``(i, N)`` -> ``(i, N)`` with 0 <= i < N; UsageError otherwise."""
    from anatomy_cli.errors import UsageError

    try:
        i, n = (int(v) for v in (value.split("/") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise UsageError(f"--shard {value!r}: give i/N, e.g. 0/4 (shards 0..N-1)") from None
    if not 0 <= i < n:
        raise UsageError(f"--shard {i}/{n}: i must be in 0..{n - 1}")
    return i, n


@dataclass(frozen=True)
class FitLensPlan:
    source_layers: tuple[int, ...]
    target_layer: int


@dataclass(frozen=True)
class JacobianFit:
    """A fitted Jacobian lens as written to ``out``: ``n_prompts`` used, ``skipped`` (too short), per source
    block ``identity_distance`` ``‖J_l − I‖_F / √d`` and ``norms`` ``‖J_l‖_F``, and the settings."""

    out: str
    n_prompts: int
    skipped: int
    source_layers: tuple[int, ...]
    target_layer: int
    d_model: int
    dim_batch: int
    skip_first: int
    max_seq_len: int
    dtype: str
    tokens: int
    flops: float
    identity_distance: tuple[float, ...]
    norms: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "n_prompts": self.n_prompts, "skipped": self.skipped,
                "source_layers": list(self.source_layers), "target_layer": self.target_layer,
                "d_model": self.d_model, "dim_batch": self.dim_batch, "skip_first": self.skip_first,
                "max_seq_len": self.max_seq_len, "dtype": self.dtype, "tokens": self.tokens, "flops": self.flops,
                "blocks": [{"block": b, "identity_distance": i, "frobenius": n}
                           for b, i, n in zip(self.source_layers, self.identity_distance, self.norms)]}


def check(opened: Any, opts: FitLensOptions) -> Any:
    """Resolves the target and source blocks against the model (before its weights load); refuses an encoder.
    ``tuned``: :func:`anatomy_cli.tasks._tuned_fit.check` (a TunedPlan)."""
    from anatomy_cli.errors import UsageError

    if opts.kind == "tuned":
        from anatomy_cli.tasks import _tuned_fit

        return _tuned_fit.check(opened, opts)

    require(opened.info, Need.decoder, command=f"{COMMAND} {opts.kind}")
    n = opened.info.n_layers
    target = n - 1 if opts.target_layer is None else opts.target_layer
    target = sites.check_block(target + n if target < 0 else target, n, "--target-layer")
    if target == 0:
        raise UsageError("--target-layer 0 leaves no block below it to fit")
    if opts.source_layers is None:
        sources = tuple(range(target))
    else:
        sources = tuple(sorted({sites.check_block(b, n, "--source-layers") for b in opts.source_layers}))
        above = [b for b in sources if b >= target]
        if above:
            raise UsageError(f"--source-layers {','.join(map(str, above))}: every source block must be below the "
                             f"target block {target}")
    return FitLensPlan(sources, target)


def run(lm: LoadedModel, encoded: list[Encoded], opts: FitLensOptions, plan: Any) -> Any:
    """Fits, writes ``opts.out`` (atomically) and returns the summary (a JacobianFit; ``tuned``: a TunedFit, the
    corpus in ``plan``, ``encoded`` empty). Raises UsageError when no prompt is long enough."""
    if opts.kind == "tuned":
        from anatomy_cli.tasks import _tuned_fit

        return _tuned_fit.run(lm, opts, plan)

    import torch

    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.errors import UsageError
    from anatomy_cli.models import cost
    from anatomy_cli.units import human_seconds

    ids = [list(e.ids[:opts.max_seq_len]) for e in encoded]
    if opts.shard is not None:
        first, every = opts.shard
        ids = ids[first::every]
        notes.info(f"shard {first}/{every}: {len(ids)} of {len(encoded)} prompts (every {every}th from {first})")
    usable = [i for i in ids if jacobian_fit.valid_positions(len(i), opts.skip_first)]
    flops = sum(cost.jacobian_fit_flops(lm.info, len(i), opts.dim_batch, min(plan.source_layers), plan.target_layer)
                for i in usable)
    notes.info(f"fit-lens jacobian: {len(usable)} prompt{'' if len(usable) == 1 else 's'}, "
               f"{sum(map(len, usable)):,} tokens, block{'s' if len(plan.source_layers) > 1 else ''} "
               f"{_blocks(plan.source_layers)} -> {plan.target_layer}, "
               f"{math.ceil(lm.info.d_model / opts.dim_batch)} backward passes per prompt: about {flops:.2g} FLOP, "
               f"roughly {human_seconds(cost.seconds(flops, lm.device.type))} on {lm.device.type} "
               "(a rough estimate)")
    settings = _settings(lm, ids, opts, plan)
    sums = {b: torch.zeros(lm.info.d_model, lm.info.d_model, dtype=torch.float64) for b in plan.source_layers}
    done = skipped = start = 0
    if opts.checkpoint is not None and opts.checkpoint.exists():
        sums, done, skipped, start = _resume(opts.checkpoint, settings)
        notes.info(f"resuming from {opts.checkpoint}: {start} of {len(ids)} prompts done")
    with notes.status("fit-lens jacobian") as line:
        for i, prompt_ids in enumerate(ids[start:], start=start + 1):
            if not jacobian_fit.valid_positions(len(prompt_ids), opts.skip_first):
                skipped += 1
            else:
                what = f"prompt {i}/{len(ids)}"
                jac = jacobian_fit.jacobian_for_prompt(lm, prompt_ids, plan.source_layers, plan.target_layer,
                                                       dim_batch=opts.dim_batch, skip_first=opts.skip_first,
                                                       progress=line.counter(what, "backward passes"))
                for b, m in jac.items():
                    sums[b] += m
                done += 1
            if opts.checkpoint is not None:
                _atomic_save({"jacobian_sum": sums, "n_done": done, "next_idx": i, "skipped": skipped,
                              "source_layers": list(plan.source_layers), "settings": settings}, opts.checkpoint)
    if skipped:
        notes.warn(f"{skipped} prompt{'' if skipped == 1 else 's'} skipped: fewer than skip_first + 2 = "
                   f"{opts.skip_first + 2} tokens")
    if done == 0:
        raise UsageError(f"no prompt is long enough to fit on: each needs at least {opts.skip_first + 2} tokens "
                         "(--skip-first)")
    state = jacobian_fit.lens_state(sums, done, lm.info.d_model, getattr(torch, DTYPES[opts.dtype]))
    assert opts.out is not None  # __post_init__
    _atomic_save(state, opts.out)
    eye = torch.eye(lm.info.d_model)
    mats = [state["J"][b].float() for b in plan.source_layers]  # type: ignore[index]
    return JacobianFit(
        out=str(opts.out), n_prompts=done, skipped=skipped, source_layers=plan.source_layers,
        target_layer=plan.target_layer, d_model=lm.info.d_model, dim_batch=opts.dim_batch,
        skip_first=opts.skip_first, max_seq_len=opts.max_seq_len, dtype=opts.dtype,
        tokens=sum(map(len, usable)), flops=flops,
        identity_distance=tuple(float((m - eye).norm() / math.sqrt(lm.info.d_model)) for m in mats),
        norms=tuple(float(m.norm()) for m in mats))


def _settings(lm: LoadedModel, ids: list[list[int]], opts: FitLensOptions, plan: FitLensPlan) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the model's shape, the blocks, the position rules, the prompts'
    tokens (a hash)."""
    import hashlib

    digest = hashlib.sha256(repr(ids).encode()).hexdigest()
    return {"d_model": lm.info.d_model, "n_layers": lm.info.n_layers, "source_layers": list(plan.source_layers),
            "target_layer": plan.target_layer, "skip_first": opts.skip_first, "max_seq_len": opts.max_seq_len,
            "prompts": digest}


def _resume(path: Path, settings: dict[str, Any]) -> tuple[dict[int, Any], int, int, int]:
    """``(sums, done, skipped, next prompt)`` from a checkpoint of these ``settings``; UsageError otherwise."""
    import torch

    from anatomy_cli.errors import UsageError

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"--checkpoint {path} is not a fit-lens checkpoint ({type(exc).__name__})") from None
    theirs = state.get("settings") if isinstance(state, dict) else None
    if theirs != settings:
        what = ", ".join(k for k in settings if not isinstance(theirs, dict) or theirs.get(k) != settings[k])
        raise UsageError(f"--checkpoint {path} was written with other settings ({what or 'not anatomy’s'}); "
                         "delete it or give another --checkpoint to start over")
    sums = {int(b): t.double() for b, t in state["jacobian_sum"].items()}
    return sums, int(state["n_done"]), int(state.get("skipped", 0)), int(state["next_idx"])


def _atomic_save(obj: object, path: Path) -> None:
    """``torch.save`` to a temporary file beside ``path``, then a rename: never a half-written file."""
    import os

    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _blocks(blocks: tuple[int, ...]) -> str:
    if len(blocks) == 1:
        return str(blocks[0])
    return f"{blocks[0]}..{blocks[-1]}" if blocks == tuple(range(blocks[0], blocks[-1] + 1)) else ",".join(
        map(str, blocks))


@dataclass(frozen=True)
class MergedLens:
    """``fit-lens merge``: the fits read (``inputs``, their ``counts`` of prompts) and the merged file ``out``."""

    out: str
    inputs: tuple[str, ...]
    counts: tuple[int, ...]
    source_layers: tuple[int, ...]
    d_model: int
    dtype: str

    def to_dict(self) -> dict[str, Any]:
        return {"out": self.out, "n_prompts": sum(self.counts), "source_layers": list(self.source_layers),
                "d_model": self.d_model, "dtype": self.dtype,
                "inputs": [{"file": f, "n_prompts": n} for f, n in zip(self.inputs, self.counts)]}


def merge(files: list[Path], out: Path, *, dtype: str = "fp16", overwrite: bool = False) -> MergedLens:
    """Jacobian lens files (jlens' format) of one model and one set of blocks as one: the ``n_prompts``-weighted
    mean, equal to one fit on all their prompts. Raises UsageError for fewer than two files, a file that is not a
    lens, fits of different shapes, an existing ``out`` without ``overwrite``."""

    import torch

    from anatomy_cli.engine import jacobian_fit
    from anatomy_cli.errors import UsageError

    if len(files) < 2:
        raise UsageError("fit-lens merge takes two or more lens files: fit-lens merge A.pt B.pt --out C.pt")
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: use fp16 (jlens' files) or fp32")
    out = Path(out).expanduser()
    if out.exists() and not overwrite:
        raise UsageError(f"--out {out} exists: give --overwrite to replace it")
    states = []
    for f in files:
        try:
            state = torch.load(f, map_location="cpu", weights_only=True, mmap=True)
        except FileNotFoundError:
            raise UsageError(f"fit-lens merge: {f} does not exist") from None
        except Exception as exc:
            raise UsageError(f"fit-lens merge: {f} is not a Jacobian lens file ({type(exc).__name__})") from None
        if not isinstance(state, dict) or not {"J", "n_prompts", "d_model"} <= set(state):
            raise UsageError(f"fit-lens merge: {f} is not a Jacobian lens file (it needs \"J\", \"n_prompts\", "
                             "\"d_model\")")
        states.append(state)
    try:
        merged = jacobian_fit.merge_states(states, getattr(torch, DTYPES[dtype]))
    except ValueError as exc:
        raise UsageError(f"fit-lens merge: {exc}") from None
    _atomic_save(merged, out)
    return MergedLens(str(out), tuple(map(str, files)), tuple(int(s["n_prompts"]) for s in states),
                      tuple(sorted(int(b) for b in states[0]["J"])), int(states[0]["d_model"]), dtype)
