"""`params`: the exact parameter breakdown of a model, from file headers or from its config.

Rooms, bottom up: :mod:`.rules` (categories, name patterns, dtype bits: the vocabulary),
:mod:`.breakdown` (the result dataclasses and row building), :mod:`.headers` (GGUF and
safetensors headers, no torch), :mod:`.build` (config → model on the meta device), :mod:`.meta`
(counting it), :mod:`.placement` (accelerate's ``--max-memory`` plan), :mod:`.cache` (meta
counts per config) and :mod:`.analyse` (which of them answers). Imports: models, errors.
"""

from __future__ import annotations

from anatomy_cli.analyses.params.analyse import analyse
from anatomy_cli.analyses.params.breakdown import *  # noqa: F403  (the result types and the vocabulary)
from anatomy_cli.analyses.params.breakdown import (
                                                   LayerRow,
                                                   MoEInfo,
                                                   ParamsResult,
                                                   Placement,
                                                   Row,
                                                   compress_names,
                                                   parse_max_memory,
)
from anatomy_cli.analyses.params.build import ResolvedConfig, build_meta_model, resolve_config
from anatomy_cli.analyses.params.meta import count_parameters
from anatomy_cli.analyses.params.placement import plan_placement
from anatomy_cli.analyses.params.rules import (
                                                   ATTENTION,
                                                   BLOCK_CATEGORIES,
                                                   CATEGORIES,
                                                   DTYPE_BITS,
                                                   EMBEDDINGS,
                                                   FAMILIES,
                                                   FFN,
                                                   GENERIC,
                                                   HEAD,
                                                   LABELS,
                                                   LAYER_CATEGORIES,
                                                   NORM,
                                                   POSITION,
                                                   ROUTED,
                                                   ROUTER,
                                                   SHARED,
                                                   TOKEN,
                                                   TOKEN_TYPE,
                                                   Family,
                                                   classify,
                                                   family_for,
                                                   memory_bytes,
)

__all__ = [
    "analyse", "LayerRow", "MoEInfo", "ParamsResult", "Placement", "Row", "compress_names", "parse_max_memory",
    "ResolvedConfig", "build_meta_model", "resolve_config", "count_parameters", "plan_placement",
    "ATTENTION", "BLOCK_CATEGORIES", "CATEGORIES", "DTYPE_BITS", "EMBEDDINGS", "FAMILIES", "FFN", "GENERIC",
    "HEAD", "LABELS", "LAYER_CATEGORIES", "NORM", "POSITION", "ROUTED", "ROUTER", "SHARED", "TOKEN",
    "TOKEN_TYPE", "Family", "classify", "family_for", "memory_bytes",
]
