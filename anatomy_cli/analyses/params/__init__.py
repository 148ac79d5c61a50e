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
from anatomy_cli.analyses.params.breakdown import LayerRow
from anatomy_cli.analyses.params.breakdown import MoEInfo
from anatomy_cli.analyses.params.breakdown import ParamsResult
from anatomy_cli.analyses.params.breakdown import Placement
from anatomy_cli.analyses.params.breakdown import Row
from anatomy_cli.analyses.params.breakdown import compress_names
from anatomy_cli.analyses.params.breakdown import parse_max_memory
from anatomy_cli.analyses.params.build import ResolvedConfig
from anatomy_cli.analyses.params.build import build_meta_model
from anatomy_cli.analyses.params.build import resolve_config
from anatomy_cli.analyses.params.meta import count_parameters
from anatomy_cli.analyses.params.placement import plan_placement
from anatomy_cli.analyses.params.rules import ATTENTION
from anatomy_cli.analyses.params.rules import BLOCK_CATEGORIES
from anatomy_cli.analyses.params.rules import CATEGORIES
from anatomy_cli.analyses.params.rules import DTYPE_BITS
from anatomy_cli.analyses.params.rules import EMBEDDINGS
from anatomy_cli.analyses.params.rules import FAMILIES
from anatomy_cli.analyses.params.rules import FFN
from anatomy_cli.analyses.params.rules import GENERIC
from anatomy_cli.analyses.params.rules import HEAD
from anatomy_cli.analyses.params.rules import LABELS
from anatomy_cli.analyses.params.rules import LAYER_CATEGORIES
from anatomy_cli.analyses.params.rules import NORM
from anatomy_cli.analyses.params.rules import POSITION
from anatomy_cli.analyses.params.rules import ROUTED
from anatomy_cli.analyses.params.rules import ROUTER
from anatomy_cli.analyses.params.rules import SHARED
from anatomy_cli.analyses.params.rules import TOKEN
from anatomy_cli.analyses.params.rules import TOKEN_TYPE
from anatomy_cli.analyses.params.rules import Family
from anatomy_cli.analyses.params.rules import classify
from anatomy_cli.analyses.params.rules import family_for
from anatomy_cli.analyses.params.rules import memory_bytes

__all__ = [
    "analyse", "LayerRow", "MoEInfo", "ParamsResult", "Placement", "Row", "compress_names", "parse_max_memory",
    "ResolvedConfig", "build_meta_model", "resolve_config", "count_parameters", "plan_placement",
    "ATTENTION", "BLOCK_CATEGORIES", "CATEGORIES", "DTYPE_BITS", "EMBEDDINGS", "FAMILIES", "FFN", "GENERIC",
    "HEAD", "LABELS", "LAYER_CATEGORIES", "NORM", "POSITION", "ROUTED", "ROUTER", "SHARED", "TOKEN",
    "TOKEN_TYPE", "Family", "classify", "family_for", "memory_bytes",
]
