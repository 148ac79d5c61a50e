"""Whole corpora: sharded runs with mergeable float64 statistics, Parquet shards, resume, Ray workers.

May import analyses, engine, models, text and errors; never cli or output. Modules: ``sources`` (SOURCE to
documents, its identity), ``windows`` (documents to token windows to shards), ``measure`` (one batch of
windows through the model; its logit lens in ``lens_sums``, ``--experts``' routing counts in
``expert_sums``), ``partial`` (a shard's sums and their Parquet
form), ``summary`` (means and standard errors), ``store`` (``--out DIR``), ``worker``
(:class:`~anatomy_cli.corpus.worker.Worker`: one shard), ``runner`` (plan, in-process runs, merging in shard
order), ``ray_run`` (the same workers as Ray actors), ``activations`` (``--save-activations``: safetensors
shards and their index).
See docs/corpus.md.
"""

from __future__ import annotations
