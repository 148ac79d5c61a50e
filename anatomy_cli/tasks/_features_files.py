"""`features --out DIR`'s tables and `--delphi DIR`'s latent cache.

``DIR/features.parquet``: one row per followed feature (feature_summary.py ``feature_rows``; ``histogram`` a list of
counts, the bin edges in the schema metadata ``anatomy.features``; ``cooccurring_ids``/``cooccurring_tokens``);
``DIR/contexts.parquet``: one row per context (``context_rows``: ``tokens`` list<string>, ``token_ids``
list<int64>, ``activations`` list<double>); ``DIR/logit_effects.parquet``: one row per (feature, side, rank).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from anatomy_cli.corpus.delphi_cache import N_SPLITS
from anatomy_cli.corpus.feature_summary import hist_edges
from anatomy_cli.corpus.store import _atomic
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError

FEATURE_COLUMNS = ("feature", "fires", "frequency", "mean_activation", "max_activation", "status", "histogram",
                   "cooccurring_ids", "cooccurring_tokens")
CONTEXT_COLUMNS = ("feature", "kind", "rank", "quantile", "lower", "upper", "activation", "window", "position", "at",
                   "tokens", "token_ids", "activations")
LOGIT_COLUMNS = ("feature", "side", "rank", "token_id", "token", "effect")
LOGIT_CONVENTION = ("W_U (g * d): the decoder row d times the final norm's gain g (its scale, centring and bias left "
                    "out, as TransformerLens' fold_ln and Neuronpedia), through the LM head without its bias, minus "
                    "the row's mean over the vocabulary (center_unembed)")


def _schema(columns: tuple[str, ...]) -> Any:
    import pyarrow as pa

    types = {"feature": pa.int64(), "fires": pa.int64(), "status": pa.string(), "kind": pa.string(),
             "side": pa.string(), "token": pa.string(), "rank": pa.int64(), "quantile": pa.int64(),
             "window": pa.int64(), "position": pa.int64(), "at": pa.int64(), "token_id": pa.int64(),
             "histogram": pa.list_(pa.int64()), "cooccurring_ids": pa.list_(pa.int64()),
             "cooccurring_tokens": pa.list_(pa.int64()), "tokens": pa.list_(pa.string()),
             "token_ids": pa.list_(pa.int64()), "activations": pa.list_(pa.float64())}
    return pa.schema([(c, types.get(c, pa.float64())) for c in columns])


def _write(path: Path, rows: list[dict[str, Any]], columns: tuple[str, ...], meta: dict[str, Any] | None = None
           ) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = _schema(columns)
    if meta is not None:
        schema = schema.with_metadata({"anatomy.features": json.dumps(meta, sort_keys=True)})
    table = pa.Table.from_pylist([{c: r.get(c) for c in columns} for r in rows], schema=schema)
    _atomic(path, lambda tmp: pq.write_table(table, tmp))
    return str(path)


def write_tables(out: Path, rows: list[dict[str, Any]], contexts: list[dict[str, Any]],
                 logits: list[dict[str, Any]]) -> list[str]:
    flat = [{**r, "cooccurring_ids": [c["feature"] for c in r.get("cooccurring", [])],
             "cooccurring_tokens": [c["tokens"] for c in r.get("cooccurring", [])]} for r in rows]
    edges = [e if e != float("inf") else None for e in hist_edges()]
    return [_write(out / "features.parquet", flat, FEATURE_COLUMNS, {"histogram_edges": edges}),
            _write(out / "contexts.parquet", contexts, CONTEXT_COLUMNS),
            _write(out / "logit_effects.parquet", logits, LOGIT_COLUMNS)]


def write_delphi(delphi: Any, lm: Any, opts: Any, plan: Any, result: Any) -> list[str]:
    """The splits and config.json (delphi's CacheConfig fields: the corpus as ``dataset_repo``, ``cache_ctx_len``
    the windows' length, ``n_tokens`` the tokens read, ``n_splits``; ``model_name`` the model as given)."""

    hf = lm.tokenizer.hf
    pad = next((t for t in (hf.pad_token_id, hf.eos_token_id) if t is not None), 0)
    config = {"dataset_repo": str(opts.corpus), "dataset_split": "", "dataset_name": "",
              "dataset_column": opts.column, "batch_size": opts.run.batch_size, "cache_ctx_len": plan.ctx,
              "n_tokens": int(result.stats.tokens), "n_splits": N_SPLITS, "model_name": lm.name}
    files = delphi.finish(result.shards, np.asarray(plan.features), pad, config)
    return [str(f) for f in files]


def read_record(root: Path) -> dict[str, Any]:
    """What the dashboard page reads of a features run's JSON record (output/views/features.py ``report``), read
    back from ``features --out DIR``'s tables and manifest: ``features`` (``cooccurring`` as the run counted it:
    ``tokens`` / ``fires``), ``contexts``, ``logit_effects``, ``histogram_edges``, ``logit_convention``,
    ``tokens``, ``windows``, ``ctx``, ``model`` (as given to the run), ``dictionary`` (``path``). UsageError for a
    DIR whose run is not complete (a file or key missing), CheckpointError for one whose files cannot be read."""
    import pyarrow.parquet as pq


    root = Path(root)
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        done, settings = manifest["complete"], manifest["settings"]
        table = pq.read_table(root / "features.parquet")
        meta = json.loads(table.schema.metadata[b"anatomy.features"])
        contexts = pq.read_table(root / "contexts.parquet").to_pylist()
        logits = pq.read_table(root / "logit_effects.parquet").to_pylist()
    except (FileNotFoundError, KeyError) as e:
        raise UsageError(f"{root} holds no complete features run ({type(e).__name__}: {e})") from None
    except (OSError, ValueError, TypeError) as e:  # there, but corrupt: as a corrupt model file (exit 1)
        raise CheckpointError(f"{root}: its files cannot be read ({type(e).__name__}: {e})") from None
    rows = []
    for r in table.to_pylist():
        ids, counts = r.pop("cooccurring_ids") or [], r.pop("cooccurring_tokens") or []
        if settings.get("cooccur"):
            fires = r["fires"]
            r["cooccurring"] = [{"feature": g, "tokens": t, "fraction": t / fires if fires else 0.0}
                                for g, t in zip(ids, counts)]
        rows.append(r)
    return {"model": str(manifest["model"]["model"]), "dictionary": {"path": settings.get("sae")},
            "tokens": done["tokens"], "windows": done["windows"], "ctx": settings["ctx"],
            "logit_convention": LOGIT_CONVENTION, "histogram_edges": meta["histogram_edges"], "features": rows,
            "contexts": contexts, "logit_effects": logits}
