"""The forward engine: load a model, tokenize, run it with hooks, keep what was asked for.

Library layer: no rich, no typer, never prints; errors are :mod:`anatomy_cli.errors`
with one-line messages. See ``docs/engine.md`` for the hook points and the residual
stream's definition.

Hook points (TransformerLens names). In a forward they are ``[batch, pos, d_model]``
(``logits``: ``[batch, pos, vocab]``); a :class:`Cache` holds one prompt, so
``[pos, d_model]``:

* ``hook_embed`` token embedding; ``hook_pos_embed`` learned position embedding (GPT-2, BERT)
* ``blocks.{l}.hook_resid_pre`` block input; ``blocks.{l}.hook_attn_out`` what attention adds;
  ``blocks.{l}.hook_resid_mid`` between attention and MLP (not in parallel-residual blocks);
  ``blocks.{l}.hook_mlp_out`` what the MLP adds; ``blocks.{l}.hook_resid_post`` block output
* ``ln_final.hook_normalized`` the final norm's output (absent for BERT); ``logits``.

Residual stream: row 0 = ``blocks.0.hook_resid_pre`` (the embedding), row l =
``blocks.{l-1}.hook_resid_post``, raw, before the final norm.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from anatomy_cli import adapters as _adapters
from anatomy_cli import bigmodel, hub, presets
from anatomy_cli.adapters import Adapter
from anatomy_cli.errors import (AnatomyError, CheckpointError, ModelNotFound, OfflineError, PromptTooLong,
                                UsageError)
from anatomy_cli.tokenization import Encoded, Tokenizer, gpt2_tokenizer, hf_cached_tokenizer

__all__ = [
    "Cache", "Encoded", "LoadedModel", "Tokenizer", "capture", "check_length", "encode", "final_norm",
    "from_model", "hook_names", "layer_names", "load", "residual_names", "run", "unembed",
]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class LoadedModel:
    """A model ready for :func:`run`. Build with :func:`load` (or :func:`from_model`).

    ``device`` is where inputs go and where every captured tensor is moved (the
    embedding's device, also under a ``device_map``); ``dtype`` the weights' dtype.
    ``untrained`` is True for ``init="random"``: outputs must say so.
    ``n_ctx`` is the longest prompt the model takes (None: no limit known).
    ``points`` maps each hook name to ``(module, "input" | "output")``.
    """

    model: Any = field(repr=False)
    tokenizer: Tokenizer = field(repr=False)
    adapter: Adapter = field(repr=False)
    name: str
    untrained: bool
    device: torch.device
    dtype: torch.dtype
    n_layers: int
    d_model: int
    n_ctx: int | None
    vocab_size: int
    is_causal: bool
    has_unembed: bool
    has_resid_mid: bool
    points: dict[str, tuple[torch.nn.Module, str]] = field(repr=False, default_factory=dict)


# ---------------------------------------------------------------- hook points

def hook_names(lm: LoadedModel) -> list[str]:
    """Every hook point ``lm`` has, in forward order (see the module docstring)."""
    return list(lm.points)


def residual_names(lm: LoadedModel) -> list[str]:
    """The ``n_layers + 1`` names :meth:`Cache.residual_stream` needs, row order."""
    return ["blocks.0.hook_resid_pre"] + layer_names(lm, "resid_post")


def layer_names(lm: LoadedModel, kind: str) -> list[str]:
    """``blocks.{l}.hook_{kind}`` for every layer. Raises UsageError if ``lm`` has no such point."""
    names = [f"blocks.{layer}.hook_{kind}" for layer in range(lm.n_layers)]
    _check_names(lm, names)
    return names


def _check_names(lm: LoadedModel, names: Iterable[str]) -> list[str]:
    names = list(dict.fromkeys(names))
    for name in names:
        if name not in lm.points:
            why = " (parallel residual: attention and MLP both read resid_pre)" \
                if name.endswith("hook_resid_mid") and lm.adapter.resid_mid else ""
            raise UsageError(f"{lm.name} has no hook point '{name}'{why}")
    return names


def _points(model: Any, adapter: Adapter, has_mid: bool, has_unembed: bool) -> dict[str, tuple[Any, str]]:
    base = model.base_model
    points: dict[str, tuple[Any, str]] = {"hook_embed": (base.get_submodule(adapter.embed), "output")}
    if adapter.pos_embed:
        points["hook_pos_embed"] = (base.get_submodule(adapter.pos_embed), "output")
    for layer, block in enumerate(base.get_submodule(adapter.blocks)):
        p = f"blocks.{layer}."
        points[p + "hook_resid_pre"] = (block, "input")
        points[p + "hook_attn_out"] = (block.get_submodule(adapter.attn_out.module), adapter.attn_out.side)
        if has_mid:
            points[p + "hook_resid_mid"] = (block.get_submodule(adapter.resid_mid.module), adapter.resid_mid.side)
        points[p + "hook_mlp_out"] = (block.get_submodule(adapter.mlp_out.module), adapter.mlp_out.side)
        points[p + "hook_resid_post"] = (block, "output")
    if adapter.final_norm:
        points["ln_final.hook_normalized"] = (base.get_submodule(adapter.final_norm), "output")
    if has_unembed:
        points["logits"] = (model.get_submodule(adapter.unembed), "output")
    return points


def _first_tensor(value: Any) -> torch.Tensor:
    """The activation in a module's input or output.

    A plain tensor is the activation itself (a GPT-2 block returns ``[batch, pos, d]``:
    indexing it with ``[0]`` would pick batch item 0); a tuple/list (attention modules
    return ``(output, weights)``) or a ModelOutput holds it first.
    """
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    raise AnatomyError(f"cannot find the activation in a module value of type {type(value).__name__}")


@contextmanager
def capture(lm: LoadedModel, names: Iterable[str], *,
            positions: torch.Tensor | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Hooks for one run: every forward of ``lm.model`` inside the block fills the yielded dict.

    Yields ``{name: tensor [batch, pos, d_model]}`` (``logits``: ``[batch, pos, vocab]``;
    a point computed once for the whole batch, such as a broadcast position embedding,
    may have batch 1), detached and moved to ``lm.device``. ``positions``: LongTensor
    ``[batch, k]`` of position indices; only those are kept (``[batch, k, d_model]``).
    A later forward in the same block overwrites. The hooks are removed on exit, also
    when the forward raises. Raises UsageError for an unknown name. Prefer :func:`run`.
    """
    store: dict[str, torch.Tensor] = {}
    handles = []

    def keep(name: str, value: Any) -> None:
        t = _first_tensor(value).detach()
        if positions is not None:
            if t.shape[0] == 1 and positions.shape[0] > 1:
                t = t.expand(positions.shape[0], *t.shape[1:])
            idx = positions.to(t.device)
            t = t.gather(1, idx[:, :, None].expand(-1, -1, t.shape[-1]))
        store[name] = t.to(lm.device)

    try:
        for name in _check_names(lm, names):
            module, side = lm.points[name]
            if side == "input":
                def pre_hook(_mod, args, kwargs, name=name):
                    keep(name, args[0] if args else kwargs["hidden_states"])
                handles.append(module.register_forward_pre_hook(pre_hook, with_kwargs=True))
            else:
                def hook(_mod, _args, output, name=name):
                    keep(name, output)
                handles.append(module.register_forward_hook(hook))
        yield store
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------- the cache

class Cache:
    """The activations of one prompt, real tokens only.

    Tensors are ``[pos, d_model]`` (``logits``: ``[pos, vocab]``) in the model's dtype on
    ``lm.device``, where pos runs over ``positions`` (the absolute token positions kept,
    all of them unless :func:`run` was given positions). Keys are hook names or
    ``(kind, layer)`` pairs: ``cache["resid_post", -1]`` is ``blocks.{L-1}.hook_resid_post``.
    """

    def __init__(self, tensors: dict[str, torch.Tensor], *, encoded: Encoded, positions: list[int],
                 n_layers: int):
        self._tensors = tensors
        self.encoded = encoded
        self.positions = positions
        self.n_layers = n_layers

    @property
    def names(self) -> list[str]:
        return list(self._tensors)

    def _name(self, key: str | tuple[str, int]) -> str:
        if isinstance(key, tuple):
            kind, layer = key
            if not -self.n_layers <= layer < self.n_layers:
                raise KeyError(f"layer {layer} is out of range for {self.n_layers} layers")
            return f"blocks.{layer % self.n_layers}.hook_{kind}"
        return key

    def __getitem__(self, key: str | tuple[str, int]) -> torch.Tensor:
        name = self._name(key)
        try:
            return self._tensors[name]
        except KeyError:
            raise KeyError(f"'{name}' was not captured (captured: {', '.join(self._tensors) or 'nothing'})") \
                from None

    def __contains__(self, key: object) -> bool:
        return isinstance(key, (str, tuple)) and self._name(key) in self._tensors  # type: ignore[arg-type]

    def get(self, key: str | tuple[str, int], default: Any = None) -> Any:
        return self[key] if key in self else default

    @property
    def logits(self) -> torch.Tensor:
        """``[pos, vocab]``: the model's own logits at the kept positions."""
        return self["logits"]

    def stack(self, kind: str) -> torch.Tensor:
        """``[n_layers, pos, d_model]``: ``blocks.{l}.hook_{kind}`` for l = 0..L-1."""
        return torch.stack([self[kind, layer] for layer in range(self.n_layers)])

    def residual_stream(self) -> torch.Tensor:
        """``[n_layers + 1, pos, d_model]``: row 0 the embedding (``blocks.0.hook_resid_pre``),
        row l the output of block l-1 (raw, before the final norm).
        Needs the names from :func:`residual_names`."""
        return torch.stack([self["resid_pre", 0]] + [self["resid_post", layer] for layer in range(self.n_layers)])


# ---------------------------------------------------------------- running

def encode(lm_or_tokenizer: LoadedModel | Tokenizer | Any, texts: list[str], *, bos: bool = False) -> list[Encoded]:
    """Tokenize ``texts`` (see :mod:`anatomy_cli.tokenization`).

    Decoders get no BOS unless ``bos=True``; encoders (BERT) keep their [CLS]/[SEP].
    Accepts a LoadedModel, a :class:`Tokenizer` or a raw HF fast tokenizer.
    """
    tok = lm_or_tokenizer.tokenizer if isinstance(lm_or_tokenizer, LoadedModel) else lm_or_tokenizer
    if not isinstance(tok, Tokenizer):
        tok = Tokenizer(tok)
    return tok.encode([texts] if isinstance(texts, str) else list(texts), bos=bos)


def check_length(lm: LoadedModel, encoded: list[Encoded], *, truncate: str | None = None,
                 what: str = "prompt", truncate_hint: bool = True) -> list[Encoded]:
    """Check every prompt fits ``lm.n_ctx``.

    ``truncate="left"`` keeps the last ``n_ctx`` tokens (see ``Encoded.dropped``; the caller
    says so on stderr). Raises PromptTooLong "<what> [i] is N tokens; <model> takes at most M",
    followed by a pointer to ``--truncate left`` when ``truncate_hint`` (commands without
    that option pass False).
    """
    if truncate not in (None, "left"):
        raise UsageError(f"unknown truncation '{truncate}'; use 'left'")
    limit = lm.n_ctx
    out = []
    for i, enc in enumerate(encoded):
        if limit is None or len(enc) <= limit:
            out.append(enc)
        elif truncate == "left":
            out.append(enc.keep_last(limit))
        else:
            which = f"{what} {i + 1}" if len(encoded) > 1 else what
            hint = f" (--truncate left keeps the last {limit})" if truncate_hint else ""
            raise PromptTooLong(f"{which} is {len(enc)} tokens; {lm.name} takes at most {limit}{hint}")
    return out


def _positions(enc: Encoded, wanted: list[int] | None) -> list[int]:
    n = len(enc)
    if wanted is None:
        return list(range(n))
    out = []
    for p in wanted:
        q = p + n if p < 0 else p
        if not 0 <= q < n:
            raise UsageError(f"position {p} is out of range for a prompt of {n} tokens")
        out.append(q)
    return out


def run(lm: LoadedModel, encoded: list[Encoded], names: Iterable[str], *,
        positions: list[list[int]] | None = None, batch_size: int = 8) -> list[Cache]:
    """Run the prompts and keep the requested hook points; one :class:`Cache` per prompt, input order.

    Prompts are batched (``batch_size``), right-padded with the pad token (EOS for GPT-2,
    padding only), with an attention mask and explicit position ids, so each prompt's
    results equal a one-prompt run. ``positions[i]`` lists the token positions to keep for
    prompt i (negative counts from the end); default all real tokens. ``logits`` are
    computed for kept positions only. Raises UsageError for an empty prompt, a position out
    of range or an unknown name.
    """
    names = _check_names(lm, names)
    want_logits = "logits" in names
    hooked = [n for n in names if n != "logits"]
    if positions is not None and len(positions) != len(encoded):
        raise UsageError(f"{len(positions)} position lists for {len(encoded)} prompts")
    kept = []
    for i, enc in enumerate(encoded):
        if len(enc) == 0:
            raise UsageError(f"prompt {i + 1} is empty" if len(encoded) > 1 else "empty prompt")
        if max(enc.ids) >= lm.vocab_size:
            raise AnatomyError(f"token id {max(enc.ids)} is outside {lm.name}'s vocabulary ({lm.vocab_size})")
        kept.append(_positions(enc, None if positions is None else positions[i]))

    lm.model.eval()
    base = lm.model.base_model
    head = lm.points["logits"][0] if want_logits else None
    results: list[Cache | None] = [None] * len(encoded)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    for start in range(0, len(order), max(1, batch_size)):
        chunk = order[start:start + max(1, batch_size)]
        width = max(len(encoded[i]) for i in chunk)
        ids = torch.full((len(chunk), width), lm.tokenizer.pad_id, dtype=torch.long)
        mask = torch.zeros((len(chunk), width), dtype=torch.long)
        for row, i in enumerate(chunk):
            ids[row, :len(encoded[i])] = torch.tensor(encoded[i].ids)
            mask[row, :len(encoded[i])] = 1
        pos_ids = torch.arange(width).expand(len(chunk), -1)
        index = None
        if positions is not None:
            k = max(1, max(len(kept[i]) for i in chunk))
            index = torch.tensor([kept[i] + [0] * (k - len(kept[i])) for i in chunk], dtype=torch.long,
                                 device=lm.device)
        logits = {}
        with torch.inference_mode(), capture(lm, hooked, positions=index) as store:
            kwargs = {"use_cache": False} if lm.is_causal else {}
            out = base(input_ids=ids.to(lm.device), attention_mask=mask.to(lm.device),
                       position_ids=pos_ids.to(lm.device), **kwargs)
            if head is not None:
                # The head on the kept rows only: what the LM-head model computes, without
                # a [batch, pos, vocab] tensor for every position. One call for the whole batch:
                # a call per prompt reads the [vocab, d_model] weights once per prompt (3x slower).
                last = _first_tensor(out)
                rows = torch.cat([last[row, torch.tensor(kept[i], dtype=torch.long, device=last.device)]
                                  for row, i in enumerate(chunk)])
                flat = _rowwise(head, rows).to(lm.device)
                logits = dict(zip(chunk, flat.split([len(kept[i]) for i in chunk])))
        # Cloned outside inference mode: inference tensors cannot meet parameters that require
        # grad (e.g. F.layer_norm(h, w) in an analysis); the clone also frees the batch tensor.
        for row, i in enumerate(chunk):
            n_keep = len(kept[i]) if positions is not None else len(encoded[i])
            tensors = {name: store[name][row if store[name].shape[0] > 1 else 0, :n_keep].clone()
                       for name in hooked}
            if head is not None:
                tensors["logits"] = logits[i].clone()
            results[i] = Cache(tensors, encoded=encoded[i], positions=kept[i], n_layers=lm.n_layers)
        del store, out, logits
    return results  # type: ignore[return-value]


# ---------------------------------------------------------------- lens

def _apply(lm: LoadedModel, module: Any, h: torch.Tensor) -> torch.Tensor:
    param = next(module.parameters(), None)
    if param is not None:
        h = h.to(dtype=param.dtype, device=param.device if param.device.type != "meta" else h.device)
    with torch.inference_mode():
        return _rowwise(module, h)


# CPU BLAS multiplies 4-15 rows by a [out, in] weight one row at a time: the logit lens of
# GPT-2 small (13 rows x the [50257, 768] head) takes 60 ms, 16 rows take 25 ms.
_MIN_ROWS = 16


def _rowwise(module: Any, h: torch.Tensor) -> torch.Tensor:
    """``module(h)`` for a module acting on each row alone (a norm, an LM head); ``h [..., d]``.

    On the CPU, 4-15 rows are padded with zero rows to 16 and the result cut back.
    """
    flat = h.reshape(-1, h.shape[-1])
    n = flat.shape[0]
    if flat.device.type == "cpu" and 3 < n < _MIN_ROWS:
        flat = torch.cat([flat, flat.new_zeros(_MIN_ROWS - n, flat.shape[-1])])
    out = _first_tensor(module(flat))[:n]
    return out.reshape(*h.shape[:-1], out.shape[-1])


def final_norm(lm: LoadedModel, h: torch.Tensor) -> torch.Tensor:
    """The final norm applied to ``h [..., d_model]``, its statistics computed from ``h`` itself.

    Returns ``[..., d_model]`` on ``h``'s device. Identity for models without a final
    norm (BERT: post-LN, each block already ends in a LayerNorm).
    """
    if not lm.adapter.final_norm:
        return h
    return _apply(lm, lm.points["ln_final.hook_normalized"][0], h).to(h.device)


def unembed(lm: LoadedModel, h: torch.Tensor) -> torch.Tensor:
    """The logit lens: the LM head applied to ``final_norm(h)``; ``h [..., d_model]`` -> ``[..., vocab]``.

    At the last layer this equals the model's own logits. For BERT the head is the whole
    MLM head (dense, GELU, LayerNorm, decoder). Raises AnatomyError when the model has no
    unembedding (e.g. a bare ``BertModel`` checkpoint).
    """
    if not lm.has_unembed:
        raise AnatomyError(f"{lm.name} has no unembedding (LM head) to read tokens from")
    return _apply(lm, lm.points["logits"][0], final_norm(lm, h)).to(h.device)


# ---------------------------------------------------------------- loading

def _input_device(model: Any) -> torch.device:
    emb = model.get_input_embeddings()
    dev = getattr(getattr(emb, "_hf_hook", None), "execution_device", None)  # accelerate dispatch
    if dev is not None:
        return torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
    return emb.weight.device if emb.weight.device.type != "meta" else torch.device("cpu")


def from_model(model: Any, tokenizer: Any, *, name: str, untrained: bool = False) -> LoadedModel:
    """Wrap an already built ``transformers`` model and its tokenizer (HF fast or :class:`Tokenizer`).

    Puts the model in eval mode. Raises UnsupportedArchitecture when no adapter fits.
    """
    config = model.config
    adapter = _adapters.for_config(config)
    model.eval()
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else Tokenizer(tokenizer, add_special_tokens=not adapter.causal)
    has_mid = _adapters.has_resid_mid(adapter, config)
    has_unembed = bool(adapter.unembed) and model is not model.base_model and _has_module(model, adapter.unembed)
    points = _points(model, adapter, has_mid, has_unembed)
    n_ctx = getattr(config, "max_position_embeddings", None)
    return LoadedModel(
        model=model, tokenizer=tok, adapter=adapter, name=name, untrained=untrained,
        device=_input_device(model), dtype=next(model.parameters()).dtype,
        n_layers=len(model.base_model.get_submodule(adapter.blocks)), d_model=config.hidden_size,
        n_ctx=int(n_ctx) if n_ctx else None, vocab_size=config.vocab_size, is_causal=adapter.causal,
        has_unembed=has_unembed, has_resid_mid=has_mid, points=points,
    )


def _has_module(model: Any, path: str) -> bool:
    try:
        model.get_submodule(path)
    except AttributeError:
        return False
    return True


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
