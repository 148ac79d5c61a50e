"""`features`' whole run: the cost first, the pass over the corpus (progress on the status line), the summary, the
logit effects, the files (:func:`measure`)."""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from anatomy_cli.corpus.ray_run import ray_module
from anatomy_cli.corpus.sources import open_source
from anatomy_cli.models import cost
from anatomy_cli.models import sites
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._corpus_status import CorpusStatus
from anatomy_cli.tasks.features import FeaturesOptions
from anatomy_cli.tasks.features import FeaturesPlan
from anatomy_cli.tasks.features import check
from anatomy_cli.tasks.features import settings_of
from anatomy_cli.tasks.recorded_model import chosen
from anatomy_cli.tasks.session import check_early
from anatomy_cli.tasks.session import describe
from anatomy_cli.tasks.session import load_weights
from anatomy_cli.tasks.session import open_model
from anatomy_cli.units import counted
from anatomy_cli.units import human_seconds


@dataclass(frozen=True)
class FeaturesRun:
    """What :func:`measure` returns. ``cost``: the estimate (tokens, FLOP, seconds, bytes); with ``--estimate``
    only that (``result`` None)."""

    model: str
    sae_file: Any
    plan: FeaturesPlan
    cost: dict[str, Any]
    result: Any = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    contexts: list[dict[str, Any]] = field(default_factory=list)
    logits: list[dict[str, Any]] = field(default_factory=list)
    files: tuple[str, ...] = ()
    lm: Any = None
    show: int = 0  # the table's rows (--show; 0: every feature)
    display: str = ""  # the model's display name (ModelInfo.display_name) for the estimate's heading


def estimate(info: Any, plan: FeaturesPlan, opts: FeaturesOptions, size: int, done: tuple[int, int] = (0, 0)
             ) -> dict[str, Any]:
    """The expected cost: ``tokens`` (``--max-tokens``, else the corpus' bytes / 4: ``tokens_estimated``), FLOP
    of what remains: the pass over the tokens not yet in ``--out`` (``done``: the shards and tokens a resumed run
    reads back; ``resumed_tokens``), i.e. the forwards up to the dictionary's block (:func:`forward_share`:
    ``forward_blocks`` of ``n_layers``), the encoder and the co-firing counts (a [tokens, followed] x [tokens, d_sae]
    product), and then the logit effects (each followed decoder row through the LM head);
    ``seconds`` at the assumed rate, ``bytes``: what the pass keeps (co-firing counts twice, the histograms, at
    most every bin's samples and the top contexts)."""
    from anatomy_cli.corpus.feature_sums import N_BINS

    tokens = opts.max_tokens if opts.max_tokens is not None else max(2, size // 4)
    left = max(0, tokens - done[1])
    f, d_sae = len(plan.features), plan.sae_file.d_sae
    blocks, share = forward_share(info, plan.sae_file)
    passing = left / plan.ctx * cost.forward_flops(info, plan.ctx) * share \
        + 2.0 * left * plan.sae_file.d_in * d_sae \
        + (2.0 * left * f * d_sae if plan.cooccur else 0.0)
    vocab = info.lm_head_rows or 0
    flops = passing + 2.0 * f * plan.sae_file.d_out * vocab
    per_context = (2 * opts.window + 1) * 12 + 48
    kept = f * (8 * N_BINS + 24) + (2 * 8 * f * d_sae if plan.cooccur else 0) \
        + f * (opts.top_k + N_BINS * opts.quantile_size) * per_context
    device = "cpu"
    return {"tokens": tokens, "tokens_estimated": opts.max_tokens is None, "features": f, "flops": flops,
            "seconds": cost.seconds(flops, device), "device": device, "bytes": kept, "resumed_shards": done[0],
            "resumed_tokens": min(done[1], tokens), "forward_blocks": blocks, "n_layers": info.n_layers}


def forward_share(info: Any, sae: Any) -> tuple[int, float]:
    """``(blocks, share)``: the blocks a window's forward runs and that share of a whole forward. A dictionary that
    reads block b: blocks 0..b of the model's L, ``(b + 1) / L`` (the pass stops there: engine/sae.py
    ``window_features``); a site outside the blocks: all L, 1."""

    n = max(1, int(info.n_layers))
    try:
        blocks = min(n, sites.block_of(sae.site) + 1)
    except ValueError:
        blocks = n
    return blocks, blocks / n


def cost_line(c: dict[str, Any]) -> str:
    tokens = f"about {c['tokens']:,} tokens (the corpus' bytes / 4)" if c["tokens_estimated"] else \
        f"{c['tokens']:,} tokens"
    shards = c["resumed_shards"]
    left = (f", {c['resumed_tokens']:,} of them already in --out ({counted(shards, 'shard')}): "
            "what is left" if shards else "")
    return (f"features: {c['features']:,} features over {tokens}{left}: about {c['flops']:.2g} FLOP, roughly "
            f"{human_seconds(c['seconds'])} on {c['device']} (the pass, its forward through blocks 0-"
            f"{c['forward_blocks'] - 1} of {c['n_layers']}, and the logit effects; the model's load and the output not "
            f"counted); at most {c['bytes'] / 2 ** 20:,.0f} MiB kept")


def resumed(out: Path | None, settings: dict[str, Any]) -> tuple[int, int]:
    """``(shards, tokens)`` that ``--out`` holds of a run with these settings (its manifest's shards, each
    shard file's token count), read before anything loads; ``(0, 0)`` for none (another run's folder is refused
    later, when the pass opens it)."""
    manifest = None if out is None else Path(out) / "manifest.json"
    try:
        held = json.loads(manifest.read_text()) if manifest is not None and manifest.is_file() else {}
    except (OSError, ValueError):
        return 0, 0
    if held.get("settings") != settings:
        return 0, 0
    import pyarrow.parquet as pq

    assert out is not None
    shards, tokens = 0, 0
    for entry in held.get("shards", []):
        path = Path(out) / "shards" / f"shard-{int(entry['index']):05d}.parquet"
        try:
            meta = json.loads(pq.read_schema(path).metadata[b"anatomy.features"])
        except (OSError, KeyError, ValueError, TypeError):
            continue
        shards, tokens = shards + 1, tokens + int(meta["tokens"])
    return shards, tokens


def measure(spec: ModelSpec, opts: FeaturesOptions, *, given: bool = True) -> FeaturesRun:
    """The whole run; see the module docstring. ``given``: whether the model was given (else the one the
    dictionary records: tasks/recorded_model.py), decided after the corpus and the dictionary are read."""
    from anatomy_cli.models.ct_block import read_dictionary as read
    src = open_source(opts.corpus, column=opts.column)
    try:
        identity = src.identity()
        src.check_text()  # an empty corpus or one that is not UTF-8: refused before the model opens
        # the dictionary, read once (its shapes only for --estimate): a missing or truncated one is refused too
        sae_file = read(Path(opts.sae), hook=opts.hook, values=not opts.estimate)
        spec = chosen(spec, given, lambda: sae_file.model_name)
        check_early(spec, ctx=opts.ctx)  # --ctx past a GGUF's context: refused from its header, before the open
        opened = open_model(spec)
        plan = check(opened, opts, sae_file)
        done = (0, 0) if opts.overwrite else resumed(opts.out, settings_of(opts, plan).to_dict())
        c = estimate(opened.info, plan, opts, identity["size"], done)
        c["device"] = spec.device if spec.device != "auto" else c["device"]
        if opts.estimate:
            return FeaturesRun(opened.name, plan.sae_file, plan, c, display=opened.info.display_name)
        notes.info(cost_line(c))
        if opts.run.ray:
            ray_module()
        lm = load_weights(opened)  # on Ray too: the driver reads the logit effects
        result = _pass(src, spec, opts, plan, lm, identity)
    finally:
        if opts.corpus == "-":
            src.path.unlink(missing_ok=True)
    return _finish(lm, opts, plan, result, c)


def _pass(src: Any, spec: ModelSpec, opts: FeaturesOptions, plan: FeaturesPlan, lm: Any,
          identity: dict[str, Any]) -> tuple[Any, Any]:
    """``(FeatureResult, DelphiWriter or None)``."""
    from anatomy_cli.corpus import feature_run
    from anatomy_cli.corpus.delphi_cache import DelphiWriter

    delphi = None if opts.delphi is None else DelphiWriter(opts.delphi, plan.sae_file.hook_name,
                                                          overwrite=opts.overwrite)
    with notes.status("features: planning the first shard") as line:
        progress = CorpusStatus(line, opts.max_tokens, what="features")
        try:
            result = feature_run.run(src, spec, settings_of(opts, plan), tokenizer=lm.tokenizer,
                                     lm=None if opts.run.ray else lm, sae_file=plan.sae_file, out=opts.out,
                                     overwrite=opts.overwrite, identity=identity, ray=opts.run.on_ray(),
                                     progress=progress, delphi=delphi)
        except KeyboardInterrupt:
            notes.info(progress.interrupted(opts.out))
            raise
    for why in result.recomputed:
        notes.info(f"{why}; computed again")
    if result.resumed:
        notes.info(f"resumed: {result.resumed} of {result.shards} shards were read from the output directory")
    return result, delphi


def _finish(lm: Any, opts: FeaturesOptions, plan: FeaturesPlan, done: tuple[Any, Any], c: dict[str, Any]
            ) -> FeaturesRun:
    from anatomy_cli.corpus import feature_summary as summary
    from anatomy_cli.tasks import _features_files as files

    result, delphi = done
    sums = result.stats
    described = describe(lm)

    @functools.lru_cache(maxsize=1 << 16)  # a context's tokens repeat: each id decoded once
    def pieces(token_id: int) -> str:
        display, text = described(token_id)
        return text if text is not None else display

    rows = summary.feature_rows(sums, opts.cooccur)
    contexts = summary.context_rows(sums, opts.quantiles, lambda ids: [pieces(i) for i in ids])
    logits = logit_rows(lm, plan, opts.logit_top, pieces)
    written: list[str] = []
    if opts.out is not None:
        written += files.write_tables(Path(opts.out), rows, contexts, logits)
    if delphi is not None:
        written += files.write_delphi(delphi, lm, opts, plan, result)
    return FeaturesRun(lm.name, plan.sae_file, plan, c, result, rows, contexts, logits, tuple(written), lm,
                       opts.show)


def logit_rows(lm: Any, plan: FeaturesPlan, top: int, pieces: Any) -> list[dict[str, Any]]:
    """Per followed feature the ``top`` tokens its decoder direction promotes most (``side`` ``top``) and suppresses
    most (``bottom``), as ``_features_files.LOGIT_CONVENTION`` says; none where the dictionary writes no
    residual-stream vector."""
    import torch

    from anatomy_cli.engine.sae import logit_effects

    sae = plan.sae_file
    if sae.d_out != lm.d_model:
        notes.warn(f"no logit effects: the dictionary writes {sae.d_out}-wide vectors at {sae.site_out}, not the "
                   f"residual stream's {lm.d_model}")
        return []
    out: list[dict[str, Any]] = []
    ids = list(plan.features)
    for start in range(0, len(ids), 256):
        chunk = ids[start:start + 256]
        rows = torch.as_tensor(sae.W_dec[chunk[0]:chunk[-1] + 1][[i - chunk[0] for i in chunk]]).float()
        effects = logit_effects(lm, rows)
        k = min(top, effects.shape[-1])
        for side, (vals, idx) in (("top", effects.topk(k, dim=-1)), ("bottom", (-effects).topk(k, dim=-1))):
            vals = vals if side == "top" else -vals
            for r, fid in enumerate(chunk):
                out += [{"feature": fid, "side": side, "rank": j, "token_id": int(t), "token": pieces(int(t)),
                         "effect": float(v)} for j, (v, t) in enumerate(zip(vals[r].tolist(), idx[r].tolist()))]
    return out
