"""Loading a model's config, tokenizer and weights (where it comes from: :mod:`anatomy_cli.models.resolve`; GGUF files:
:mod:`anatomy_cli.engine.load_gguf`)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from anatomy_cli.engine import load_gguf
from anatomy_cli.engine.load_gguf import ModelClass
from anatomy_cli.engine.model import DTYPES
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.opening import OpenedModel
from anatomy_cli.engine.opening import open_exact
from anatomy_cli.engine.opening import open_model
from anatomy_cli.engine.wrap import from_model
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import bigmodel
from anatomy_cli.models.adapters import Adapter
from anatomy_cli.models.info import has_lm_head
from anatomy_cli.models.json_config import JsonConfig
from anatomy_cli.models.resolve import Source
from anatomy_cli.models.resolve import first_line
from anatomy_cli.models.spec import ModelSpec

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.configuration_utils import PreTrainedConfig


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda, else mps, else cpu. Raises AnatomyError for an unavailable device."""
    device = str(device)
    if device == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    kind = device.split(":")[0]
    if kind == "cuda" and not torch.cuda.is_available():
        raise AnatomyError("CUDA is not available on this machine; use --device cpu")
    if kind == "mps" and not torch.backends.mps.is_available():
        raise AnatomyError("MPS is not available on this machine; use --device cpu")
    if kind not in ("cpu", "cuda", "mps"):
        raise UsageError(f"unknown device '{device}'; use auto, cpu, cuda or mps")
    return torch.device(device)


def _model_class(adapter: Adapter, config: PreTrainedConfig, random: bool = False) -> ModelClass:
    """CausalLM for decoders; for encoders MaskedLM when the checkpoint has that head (or when built
    at random), else the bare model."""
    import transformers


    cls: ModelClass = transformers.AutoModel
    if adapter.causal:
        cls = transformers.AutoModelForCausalLM
    elif has_lm_head(adapter, config, random):  # the rule ModelInfo.has_lm_head states before the load
        cls = transformers.AutoModelForMaskedLM
    return cls


def _load_weights(source: Source, name: str, config: PreTrainedConfig, adapter: Adapter, dtype: torch.dtype,
                  trust_remote_code: bool, local_only: bool, placement: dict[str, object]) -> PreTrainedModel:
    cls = _model_class(adapter, config)
    # accelerate warns that offloaded parameters sit on the meta device: expected, and the
    # command says what is where (bigmodel.device_summary).
    dispatch_log = logging.getLogger("accelerate.big_modeling")
    level = dispatch_log.level
    if placement:
        dispatch_log.setLevel(logging.ERROR)
    try:
        model, info = cls.from_pretrained(source.ref, config=config, dtype=dtype, local_files_only=local_only,
                                          trust_remote_code=trust_remote_code, output_loading_info=True,
                                          **placement)
    except Exception as exc:  # safetensors, torch.load, size mismatches: all mean an unreadable checkpoint
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        if placement and "offload_folder" in str(exc):
            # transformers re-saves offloaded weights it cannot read in place from safetensors files
            # (.bin checkpoints; weights converted while loading, as MoE experts are).
            raise UsageError(f"{name}: weights that do not fit --max-memory must be re-saved for disk offload "
                             f"(not safetensors, or converted while loading, as MoE experts are): pass "
                             f"--offload-folder DIR") from None
        raise CheckpointError(f"{name}: cannot load the weights: {first_line(exc)}") from None
    finally:
        dispatch_log.setLevel(level)
    missing = sorted(info.get("missing_keys") or []) + sorted(info.get("mismatched_keys") or [])
    if missing:
        raise CheckpointError(f"{name}: the checkpoint lacks {len(missing)} weight(s) the model needs "
                              f"(e.g. {', '.join(map(str, missing[:3]))}); it is partial or of another architecture")
    return model


def load(spec: ModelSpec | str, **options: object) -> LoadedModel:
    """``load_weights(open_model(spec))``: a model and its tokenizer, as a
    :class:`~anatomy_cli.models.spec.ModelSpec` says (or a name with the ModelSpec fields as keywords:
    ``load("gpt2", dtype="bf16")``). Commands open first and check their input before the weights load
    (:func:`anatomy_cli.engine.opening.open_model`, :func:`load_weights`)."""
    return load_weights(open_model(spec, **options))


def load_weights(opened: OpenedModel) -> LoadedModel:
    """The second phase: the weights of an opened model, as its spec says.

    Its ``model``: a ``.gguf`` file (weights dequantized tensor by tensor to ``dtype``:
    :mod:`anatomy_cli.engine.load_gguf`; ``dequantized_from`` names the file type and the types of its matrices,
    ``Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)``), or a local directory written by ``save_pretrained``; else with
    ``init="random"`` a built-in preset (random weights, ``torch.manual_seed(0)``, ``untrained=True``); else a
    Hugging Face id (presets map to their canonical id first, e.g. gpt2 -> openai-community/gpt2, then the name
    itself), from the local HF cache first, then the Hub unless ``HF_HUB_OFFLINE`` is set. ``device``:
    auto|cpu|cuda|mps; ``dtype``: fp32|bf16|fp16. ``device_map`` (auto|balanced|sequential), ``max_memory``
    and ``offload_folder`` go to ``from_pretrained`` (accelerate) and replace ``device``; see
    :mod:`anatomy_cli.models.bigmodel`. A ``light`` opened model (config.json read without transformers) is
    first opened again through transformers: the weights are built from transformers' own config.

    Raises ModelNotFound, OfflineError (not cached, Hub unreachable), CheckpointError (unreadable or partial
    checkpoint; a truncated GGUF file or one with a tensor type gguf cannot dequantize),
    UnsupportedArchitecture, AnatomyError (device; a GPU a budget names that this machine lacks), UsageError
    (disk offload that needs an ``offload_folder``).
    """
    if opened.light:
        opened = open_exact(opened.spec)
    spec, source, header, config = opened.spec, opened.source, opened.header, opened.config
    assert source is not None and not isinstance(config, JsonConfig)  # an exact open: resolved, transformers' config
    torch_dtype = DTYPES[spec.dtype]
    placement = bigmodel.placement_kwargs(spec.device_map, spec.max_memory, spec.offload_folder)
    target = None if placement else resolve_device(spec.device)
    adapter = opened.adapter
    if spec.init == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = _model_class(adapter, config, random=True).from_config(config, dtype=torch_dtype)
        model = model.to(target or "cpu")
    elif header is not None:
        model = load_gguf.load_weights(source, header, config, _model_class(adapter, config), torch_dtype, placement)
    else:
        model = _load_weights(source, spec.model, config, adapter, torch_dtype, spec.trust_remote_code,
                              source.local_only, placement)
    if target is not None and spec.init != "random":
        model = model.to(target)
    lm = from_model(model, opened.tokenizer, name=spec.model, untrained=spec.init == "random", info=opened.info)
    lm.label = opened.info.label  # decided once, by engine.open
    lm.dequantized_from = opened.info.quantization
    return lm
