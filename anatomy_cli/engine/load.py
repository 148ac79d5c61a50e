"""Loading: where a model comes from (preset, directory, HF cache, Hub), its config, tokenizer and weights."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from anatomy_cli import adapters as _adapters
from anatomy_cli import bigmodel, hub, presets
from anatomy_cli.adapters import Adapter
from anatomy_cli.engine.wrap import from_model
from anatomy_cli.engine.model import DTYPES, LoadedModel
from anatomy_cli.errors import (AnatomyError, CheckpointError, ModelNotFound, OfflineError, UsageError)
from anatomy_cli.tokenization import gpt2_tokenizer, hf_cached_tokenizer

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


def _offline_message(spec: str) -> str:
    random_hint = "try --init random" if spec in presets.PRESETS else \
        f"try a built-in preset with --init random ({', '.join(presets.preset_names())})"
    return (f"{spec} is not in the local Hugging Face cache and the Hub cannot be reached; pass --model PATH "
            f"to a local checkpoint, fetch it once on a connected machine, or {random_hint}")


@dataclass(frozen=True)
class _Source:
    kind: str            # "preset" | "dir" | "hub"
    ref: str             # preset name, directory, or repo id
    local_only: bool     # hub: load from the cache without contacting the Hub


_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                    "spiece.model")


def _in_cache(repo: str, filename: str = "config.json") -> str | None:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return found if isinstance(found, str) else None


def _resolve(spec: str, init: str) -> _Source:
    """Where ``spec`` comes from: a local directory, a preset (random init) or a Hub repo."""
    path = Path(spec).expanduser()
    if path.exists():
        if not path.is_dir():
            raise ModelNotFound(f"{spec} is a file; --model takes a directory written by save_pretrained, "
                                f"a preset or a Hugging Face id")
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{spec} has no config.json; expected a directory written by save_pretrained")
        return _Source("dir", str(path), True)
    if spec.startswith((".", "/", "~")) or spec.endswith("/"):
        raise ModelNotFound(f"no such directory: {spec}")
    if init == "random":
        if spec in presets.PRESETS:
            return _Source("preset", spec, True)
        raise ModelNotFound(f"--init random needs a built-in preset ({', '.join(presets.preset_names())}) "
                            f"or a local directory; got '{spec}'")
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (GatedRepoError, HFValidationError, LocalEntryNotFoundError,
                                        OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)
    from huggingface_hub.utils import validate_repo_id

    candidates = []
    for repo in dict.fromkeys([presets.HUB_IDS.get(spec, spec), spec]):
        try:
            validate_repo_id(repo)
        except HFValidationError:
            continue
        candidates.append(repo)
    if not candidates:
        raise ModelNotFound(f"no model '{spec}': not a preset ({', '.join(presets.preset_names())}), "
                            f"not a local directory, and not a valid Hugging Face id")
    offline = hub.offline()
    for repo in candidates:
        if _in_cache(repo):
            if any(_in_cache(repo, f) for f in _WEIGHT_FILES):
                return _Source("hub", repo, True)
            if offline:  # config cached, weights not
                raise OfflineError(_offline_message(spec))
            return _Source("hub", repo, False)
    if offline:
        raise OfflineError(_offline_message(spec))
    for repo in candidates:
        try:
            hf_hub_download(repo, "config.json")
        except GatedRepoError:
            raise ModelNotFound(f"{repo} is gated on the Hugging Face Hub: accept its license on the Hub and "
                                f"log in (hf auth login)") from None
        except (RepositoryNotFoundError, RevisionNotFoundError):
            continue
        except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError, TimeoutError):
            raise OfflineError(_offline_message(spec)) from None
        except OSError as exc:  # EntryNotFoundError: a repo without config.json, or an HTTP error
            raise ModelNotFound(f"{repo} on the Hugging Face Hub is not a transformers checkpoint: "
                                f"{_first_line(exc)}") from None
        return _Source("hub", repo, False)
    raise ModelNotFound(f"no model '{spec}': not a preset, not a local directory, and not on the Hugging Face "
                        f"Hub (tried {', '.join(candidates)})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _config_file(source: _Source) -> Path:
    if source.kind == "dir":
        return Path(source.ref) / "config.json"
    found = _in_cache(source.ref)
    if found is None:  # the probe in _resolve fetched it; only a racing cache cleanup gets here
        raise CheckpointError(f"{source.ref}: config.json vanished from the Hugging Face cache")
    return Path(found)


def _read_config(source: _Source, name: str, trust_remote_code: bool) -> tuple[Any, Adapter]:
    """The config, after checking the raw file (valid JSON, a supported model_type)."""
    from transformers import AutoConfig

    path = _config_file(source)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{name}: config.json is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{name}: config.json is not a JSON object")
    model_type = raw.get("model_type")
    if model_type is None:
        raise CheckpointError(f"{name}: config.json has no model_type")
    adapter = _adapters.for_model_type(model_type)
    try:
        config = AutoConfig.from_pretrained(str(path.parent) if source.kind == "dir" else source.ref,
                                            local_files_only=True, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{name}: cannot read config.json: {_first_line(exc)}") from None
    return config, adapter


def _load_tokenizer(source: _Source, name: str, trust_remote_code: bool, local_only: bool) -> Any:
    from transformers import AutoTokenizer

    if source.kind == "dir":
        present = any((Path(source.ref) / f).is_file() for f in _TOKENIZER_FILES)
    else:
        present = not local_only or any(_in_cache(source.ref, f) for f in _TOKENIZER_FILES)
    if not present:
        raise CheckpointError(f"{name} has no tokenizer files ({', '.join(_TOKENIZER_FILES[:4])}, ...)")
    try:
        hf = AutoTokenizer.from_pretrained(source.ref, local_files_only=local_only,
                                           trust_remote_code=trust_remote_code)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise CheckpointError(f"{name}: cannot load its tokenizer: {_first_line(exc)}") from None
    if not getattr(hf, "vocab_size", 0):
        raise CheckpointError(f"{name}: its tokenizer files define no vocabulary")
    return hf


def _model_class(adapter: Adapter, config: Any) -> Any:
    """CausalLM for decoders; for encoders MaskedLM when the checkpoint has that head, else the bare model."""
    import transformers

    if adapter.causal:
        return transformers.AutoModelForCausalLM
    archs = getattr(config, "architectures", None) or []
    if any(a.endswith(("ForMaskedLM", "ForPreTraining")) for a in archs):
        return transformers.AutoModelForMaskedLM
    return transformers.AutoModel


def _load_weights(source: _Source, name: str, config: Any, adapter: Adapter, dtype: torch.dtype,
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
        raise CheckpointError(f"{name}: cannot load the weights: {_first_line(exc)}") from None
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


def _preset_tokenizer(spec: str, config: Any) -> Any:
    if config.model_type == "gpt2":
        return gpt2_tokenizer()
    repo = presets.HUB_IDS.get(spec, spec)
    hf = hf_cached_tokenizer((repo,))
    if hf is None:
        raise AnatomyError(f"no tokenizer for the {spec} preset offline: {repo}'s tokenizer is not in the local "
                           f"Hugging Face cache; fetch it once on a connected machine "
                           f"(hf download {repo} --include 'tokenizer*')")
    return hf


def load(spec: str, *, device: str = "auto", dtype: str = "fp32", init: str = "pretrained",
         trust_remote_code: bool = False, device_map: Any = None, max_memory: dict | str | None = None,
         offload_folder: str | None = None) -> LoadedModel:
    """Load a model and its tokenizer.

    ``spec``: a local directory written by ``save_pretrained``; else with ``init="random"``
    a built-in preset (random weights, ``torch.manual_seed(0)``, ``untrained=True``); else a
    Hugging Face id (presets map to their canonical id first, e.g. gpt2 ->
    openai-community/gpt2, then the name itself), from the local HF cache first, then the
    Hub unless ``HF_HUB_OFFLINE`` is set. ``device``: auto|cpu|cuda|mps; ``dtype``:
    fp32|bf16|fp16. ``device_map`` (auto|balanced|sequential), ``max_memory`` (a dict or the
    ``--max-memory`` text ``0=20GiB,cpu=60GiB``) and ``offload_folder`` go to
    ``from_pretrained`` (accelerate) and replace ``device``; see :mod:`anatomy_cli.bigmodel`.

    Raises ModelNotFound, OfflineError (not cached, Hub unreachable), CheckpointError
    (unreadable or partial checkpoint), UnsupportedArchitecture, AnatomyError (device),
    UsageError (a placement with ``init="random"``, bad placement options, disk offload
    that needs an ``offload_folder``).
    """
    spec = str(spec)
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
    source = _resolve(spec, init)

    if init == "random":
        import transformers

        if source.kind == "preset":
            config = presets.preset_config(spec)
            adapter = _adapters.for_config(config)
            hf_tok = _preset_tokenizer(spec, config)
        else:
            config, adapter = _read_config(source, spec, trust_remote_code)
            hf_tok = _load_tokenizer(source, spec, trust_remote_code, True)
        cls = transformers.AutoModelForMaskedLM if not adapter.causal else transformers.AutoModelForCausalLM
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = cls.from_config(config, dtype=torch_dtype)
        return from_model(model.to(target or "cpu"), hf_tok, name=spec, untrained=True)

    config, adapter = _read_config(source, spec, trust_remote_code)
    hf_tok = _load_tokenizer(source, spec, trust_remote_code, source.local_only)
    model = _load_weights(source, spec, config, adapter, torch_dtype, trust_remote_code, source.local_only,
                          placement)
    if target is not None:
        model = model.to(target)
    return from_model(model, hf_tok, name=spec, untrained=False)
