"""Loading a model's config, tokenizer and weights (where it comes from: :mod:`anatomy_cli.models.resolve`; GGUF files:
:mod:`anatomy_cli.engine.load_gguf`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch

from anatomy_cli.engine import load_gguf
from anatomy_cli.engine.model import DTYPES, LoadedModel
from anatomy_cli.engine.wrap import from_model
from anatomy_cli.errors import AnatomyError, CheckpointError, UsageError
from anatomy_cli.models import adapters as _adapters
from anatomy_cli.models import bigmodel, gguf, gguf_tokenizer
from anatomy_cli.models.adapters import Adapter
from anatomy_cli.models.model_files import load_tokenizer, read_config
from anatomy_cli.models.resolve import Source, first_line, label, resolve
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text.tokenization import Tokenizer

BeforeWeights = Callable[[Tokenizer, Any], None]

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


def _dtype(dtype: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DTYPES[str(getattr(dtype, "value", dtype))]
    except KeyError:
        raise UsageError(f"unknown dtype '{dtype}'; use {', '.join(DTYPES)}") from None


def _model_class(adapter: Adapter, config: Any, random: bool = False) -> Any:
    """CausalLM for decoders; for encoders MaskedLM when the checkpoint has that head (or when built
    at random), else the bare model."""
    import transformers

    if adapter.causal:
        return transformers.AutoModelForCausalLM
    if random:
        return transformers.AutoModelForMaskedLM
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModel


def _load_weights(source: Source, name: str, config: Any, adapter: Adapter, dtype: torch.dtype,
                  trust_remote_code: bool, local_only: bool, placement: dict[str, Any]) -> Any:
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


def _quiet_transformers() -> None:
    # Warnings still reach stderr; info-level chatter does not.
    if not os.environ.get("TRANSFORMERS_VERBOSITY"):
        from transformers.utils import logging as hf_logging

        if hf_logging.get_verbosity() < hf_logging.WARNING:
            hf_logging.set_verbosity_warning()


def _wrap_tokenizer(hf_tok: Any, adapter: Adapter, config: Any, before_weights: BeforeWeights | None,
                    add_bos: bool | None = None) -> Tokenizer:
    # The same wrapping from_model applies: encoders keep their [CLS]/[SEP], decoders add only the BOS, as
    # their convention says (``add_bos``: a GGUF file's tokenizer.ggml.add_bos_token; None: the tokenizer's).
    tok = Tokenizer(hf_tok, add_special_tokens=not adapter.causal, add_bos=add_bos)
    if before_weights is not None:
        before_weights(tok, config)
    return tok


def load(spec: ModelSpec | str, *, before_weights: BeforeWeights | None = None, **options: Any) -> LoadedModel:
    """Load a model and its tokenizer, as a :class:`~anatomy_cli.models.spec.ModelSpec` says.

    ``spec`` is a ModelSpec, or a model name with the ModelSpec fields as keywords
    (``load("gpt2", dtype="bf16")``). Its ``model``: a ``.gguf`` file (config from its header, tokenizer converted
    by transformers once and then cached, weights dequantized tensor by tensor to ``dtype``:
    :mod:`anatomy_cli.engine.load_gguf`; ``dequantized_from`` names the file type and the types of its matrices,
    ``Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)``), or a local directory written by ``save_pretrained``;
    else with ``init="random"``
    a built-in preset (random weights, ``torch.manual_seed(0)``, ``untrained=True``); else a
    Hugging Face id (presets map to their canonical id first, e.g. gpt2 ->
    openai-community/gpt2, then the name itself), from the local HF cache first, then the
    Hub unless ``HF_HUB_OFFLINE`` is set. ``device``: auto|cpu|cuda|mps; ``dtype``:
    fp32|bf16|fp16. ``device_map`` (auto|balanced|sequential), ``max_memory`` (a dict or the
    ``--max-memory`` text ``0=20GiB,cpu=60GiB``) and ``offload_folder`` go to
    ``from_pretrained`` (accelerate) and replace ``device``; see :mod:`anatomy_cli.models.bigmodel`.

    ``before_weights(tokenizer, config)``, when given, is called once the config and the
    tokenizer are read and before any weight is loaded or built (every source, also
    ``init="random"``): ``tokenizer`` is the wrapped :class:`Tokenizer` that becomes
    ``LoadedModel.tokenizer``, ``config`` the transformers config. Commands use it to check
    arguments that need only tokens (``--position``, target tokens) before the slow load;
    whatever it raises propagates and no weights are loaded.

    Where a spec comes from is :func:`anatomy_cli.models.resolve.resolve`.

    Raises ModelNotFound, OfflineError (not cached, Hub unreachable), CheckpointError
    (unreadable or partial checkpoint; a truncated GGUF file or one with a tensor type gguf
    cannot dequantize), UnsupportedArchitecture (also a GGUF architecture transformers
    cannot read), AnatomyError (device),
    UsageError (a placement with ``init="random"``, bad placement options, disk offload
    that needs an ``offload_folder``).
    """
    if not isinstance(spec, ModelSpec):
        spec = ModelSpec(str(spec), **options)
    elif options:
        raise TypeError(f"load(ModelSpec, ...) takes no loading keywords; got {', '.join(options)}")
    device, dtype, init, trust_remote_code = spec.device, spec.dtype, spec.init, spec.trust_remote_code
    device_map, max_memory, offload_folder = spec.device_map, spec.max_memory, spec.offload_folder
    spec = spec.model
    torch_dtype = _dtype(dtype)
    init = str(getattr(init, "value", init))
    if init not in ("pretrained", "random"):
        raise UsageError(f"unknown init '{init}'; use pretrained or random")
    placement = bigmodel.placement_kwargs(device_map, max_memory, offload_folder)
    if placement and init == "random":
        raise UsageError("--device-map places a checkpoint's weights as they are read; --init random builds the "
                         "whole model in memory first: use --device, or save the model and load that directory")
    device = str(getattr(device, "value", device))
    target = None if placement else resolve_device(device)
    _quiet_transformers()
    source = resolve(spec, need="weights", init=init)
    header = load_gguf.check_header(source) if source.kind == "gguf" else None

    if header is not None:  # the one parse of the file: config and (cached) tokenizer from its header
        config = gguf.read_config(header, source.spec)
        hf_tok = gguf_tokenizer.load(header, config, source.spec)
    else:
        config = read_config(source, trust_remote_code=trust_remote_code, check_model_type=_adapters.for_model_type)
        hf_tok = load_tokenizer(source, trust_remote_code=trust_remote_code)
    adapter = _adapters.for_config(config)
    add_bos = header.fields.get("tokenizer.ggml.add_bos_token") if header is not None else None
    tok = _wrap_tokenizer(hf_tok, adapter, config, before_weights, add_bos)

    if init == "random":
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = _model_class(adapter, config, random=True).from_config(config, dtype=torch_dtype)
        lm = from_model(model.to(target or "cpu"), tok, name=spec, untrained=True)
        lm.label = label(source, header.fields if header is not None else None)
        return lm
    if header is not None:
        model = load_gguf.load_weights(source, header, config, _model_class(adapter, config), torch_dtype, placement)
    else:
        model = _load_weights(source, spec, config, adapter, torch_dtype, trust_remote_code, source.local_only,
                              placement)
    if target is not None:
        model = model.to(target)
    lm = from_model(model, tok, name=spec, untrained=False)
    lm.label = label(source, header.fields if header is not None else None)
    if header is not None:
        lm.dequantized_from = gguf.quantization_label(header)
    return lm
