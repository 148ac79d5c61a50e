"""Where a breakdown comes from: :func:`analyse` picks the cheapest source that answers."""

from __future__ import annotations

from anatomy_cli.analyses.params import cache as params_cache
from anatomy_cli.analyses.params import headers as params_headers
from anatomy_cli.analyses.params.breakdown import ParamsResult
from anatomy_cli.analyses.params.meta import analyse_meta
from anatomy_cli.analyses.params.rules import DTYPE_BITS
from anatomy_cli.analyses.params.shipped import breakdown
from anatomy_cli.errors import UsageError
from anatomy_cli.models.resolve import resolve


def analyse(spec: str, *, dtype: str | None = None, per_layer: bool = False, trust_remote_code: bool = False,
            max_memory: dict[int | str, int] | None = None) -> ParamsResult:
    """The breakdown of ``spec`` from what is on disk, cheapest first.

    A GGUF file: its header (:func:`params_headers.from_gguf`). A directory with safetensors
    files: their headers (:func:`params_headers.from_safetensors`). Otherwise (presets,
    config-only directories, Hub ids, ``max_memory``, ``trust_remote_code``) the model is built
    on the meta device and counted (:func:`count_parameters`); that result is cached per
    config content (:mod:`params_cache`); the built-in presets' counts ship with the package
    (:mod:`.shipped`). With ``max_memory``, also plan the placement (at
    ``dtype``, else the config's dtype, else fp32). Neither torch nor transformers is
    imported for a header or a cache hit.

    Raises ModelNotFound, OfflineError, CheckpointError, UnsupportedArchitecture,
    AnatomyError, UsageError.
    """

    if dtype is not None and dtype not in DTYPE_BITS:
        raise UsageError(f"unknown dtype '{dtype}' (choose from {', '.join(DTYPE_BITS)})")
    source = resolve(spec, need="config")
    if source.kind == "gguf":
        if max_memory is not None:
            raise UsageError("--max-memory plans a transformers checkpoint on the meta device; a GGUF file is "
                             "read from its header: load it with --device-map instead")
        return params_headers.from_gguf(spec, source.ref, dtype=dtype, per_layer=per_layer)
    if max_memory is None and not trust_remote_code:
        if source.kind == "preset":  # fixed shapes: their breakdowns ship with the package (no torch)

            shipped = breakdown(source.ref, dtype=dtype, per_layer=per_layer)
            if shipped is not None:
                return shipped
        if source.kind == "dir":
            result = params_headers.from_safetensors(spec, source.ref, dtype=dtype, per_layer=per_layer)
            if result is not None:
                return result
        key = params_cache.key(source, dtype=dtype, per_layer=per_layer)
        cached = params_cache.get(key) if key else None
        if cached is not None:
            return cached

    result = analyse_meta(spec, source, dtype, per_layer, trust_remote_code, max_memory)
    if max_memory is None and not trust_remote_code and key:
        params_cache.put(key, result)
    return result
