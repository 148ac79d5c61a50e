"""A config and the model built from it on PyTorch's meta device (shapes, no storage): what
``params`` counts for presets, config-only directories and Hub ids.

The config is read by :func:`anatomy_cli.models.model_files.read_config` (the engine's own path); the
model is instantiated under ``torch.device("meta")``, so a 70B config costs a few hundred MB of
RSS and a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.model_files import read_config
from anatomy_cli.models.resolve import config_path
from anatomy_cli.models.resolve import resolve

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig

    from anatomy_cli.models.resolve import Source


@dataclass(frozen=True)
class ResolvedConfig:
    """A ``transformers`` config and where it came from.

    ``source`` is ``preset``, ``directory`` or ``hub``; ``location`` is the
    directory or cached config.json path (empty for presets).
    """

    spec: str
    config: PreTrainedConfig
    source: str
    location: str = ""


def resolve_config(spec: str, *, trust_remote_code: bool = False, source: Source | None = None) -> ResolvedConfig:
    """Find the config for ``spec`` (:func:`anatomy_cli.models.resolve.resolve` with ``need="config"``):
    a built-in preset, a local directory with config.json, or a Hugging Face model id (only
    config.json is fetched; the local cache first; ``HF_HUB_OFFLINE`` respected).

    Raises ModelNotFound (nothing matches), OfflineError (offline and not cached),
    CheckpointError (config.json missing or unreadable), UnsupportedArchitecture (unknown model_type).
    """

    source = source or resolve(spec, need="config")
    if source.kind == "gguf":
        raise UsageError(f"{spec} is a GGUF file: its parameters are read from its header (analyse)")
    config = read_config(source, trust_remote_code=trust_remote_code)
    if source.kind == "preset":
        return ResolvedConfig(spec, config, "preset")
    if source.kind == "dir":
        return ResolvedConfig(spec, config, "directory", source.ref)
    return ResolvedConfig(spec, config, "hub", str(config_path(source)))


def _auto_class_for(config: PreTrainedConfig, trust_remote_code: bool):
    """The Auto class whose mapping holds this config's first listed architecture, or a sensible default head."""
    import transformers
    from transformers import AutoModel
    from transformers import AutoModelForCausalLM
    from transformers import AutoModelForMaskedLM
    from transformers import AutoModelForSeq2SeqLM
    from transformers.models.auto import modeling_auto as ma

    heads = (
        (AutoModelForCausalLM, ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES),
        (AutoModelForMaskedLM, ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES),
        (AutoModelForSeq2SeqLM, ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES),
        (AutoModel, ma.MODEL_MAPPING_NAMES),
    )
    model_type = getattr(config, "model_type", "")
    auto_map = getattr(config, "auto_map", None) or {}
    if trust_remote_code and auto_map:
        for auto, _ in heads:
            if auto.__name__ in auto_map:
                return auto, None
    for arch in getattr(config, "architectures", None) or ():
        for auto, mapping in heads:
            names = mapping.get(model_type)
            if arch == names or (isinstance(names, (list, tuple)) and arch in names):
                return auto, None
        cls = getattr(transformers, arch, None)
        if cls is not None and hasattr(cls, "_from_config"):
            return None, cls  # e.g. a classification head: count what the checkpoint holds
    causal = model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    masked = model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES
    if causal and (not masked or getattr(config, "is_decoder", False)):
        return AutoModelForCausalLM, None
    for auto, mapping in heads[1:]:
        if model_type in mapping:
            return auto, None
    return AutoModelForCausalLM, None


def build_meta_model(config: PreTrainedConfig, *, trust_remote_code: bool = False):
    """Instantiate the model for ``config`` on the meta device (no weight memory).

    Uses ``torch.device("meta")``: unlike accelerate's ``init_empty_weights`` in
    transformers 5.x it keeps tied weights tied. Raises AnatomyError when the config
    cannot be built.
    """
    import torch
    from transformers.utils import logging as hf_logging

    auto, cls = _auto_class_for(config, trust_remote_code)
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # construction chatter is not a result
    try:
        with torch.device("meta"):
            if cls is not None:
                model = cls._from_config(config)
            else:
                model = auto.from_config(config, trust_remote_code=trust_remote_code)
    except (ValueError, TypeError, AttributeError, KeyError, RuntimeError, ImportError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise AnatomyError(f"cannot build {type(config).__name__} on the meta device: {first}") from exc
    finally:
        hf_logging.set_verbosity(previous)
    return model
