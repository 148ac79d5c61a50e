"""The replacement model of an attribution graph (circuit-tracer's): the model with its attention patterns and
normalisation denominators frozen (detached) at their values on the prompt and each MLP's output detached, so
that what reaches the residual stream from an MLP is a constant the graph splits into transcoder features and an
error node (plus the transcoder's skip path, which stays linear in the MLP's input).

:func:`frozen` installs the rules (a :class:`Freezer` records them on the prompt's forward and replays them after);
:func:`forward` runs the model on ``batch`` copies of the prompt under them and keeps each MLP's input and output,
the final norm's output and the logits (analyses/circuit.py's ``Rows`` takes one backward per batch of targets).

Its transcoders (:func:`open_transcoders`, the classes below), in circuit-tracer's orientation: a per-layer set
(one :class:`Transcoder` per block, its decoder writing to that block's MLP output) or a :class:`CrossLayer`
transcoder (layer l's features read block l's MLP input and write to the MLP outputs of blocks l..L-1). Both answer
the same three questions (:data:`Stack`): ``n_layers``; ``layer(l)``, a :class:`Transcoder` with block l's
encoder, ``b_dec`` and skip path; ``decoder_rows(l, ids) -> [k, n_out, d]``, the decoders of layer l's features
``ids``, row j writing to block ``l + j``. ``--offload``: a layer may be an :class:`Offloaded` one (only
``W_skip`` on the device); ``weights()`` brings the whole layer in for one use
(:func:`anatomy_cli.analyses.circuit.setup` uses each layer once). A cross-layer transcoder's decoders are read
from the file row by row whatever the offload, so only its encoders are offloaded.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any
from typing import Union

import torch

from anatomy_cli.engine.hooks import attach_modules
from anatomy_cli.engine.hooks import mlp_of
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.norm_gain import centred as _centred
from anatomy_cli.engine.norm_gain import eps as _eps
from anatomy_cli.engine.norm_gain import mlp_norm_module
from anatomy_cli.engine.norm_gain import normalized as _normalized
from anatomy_cli.engine.norm_gain import probe as _probe
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models import transcoders as tc_files

# ---------------------------------------------------------------- the transcoders

@dataclass
class Transcoder:
    """One layer's transcoder, circuit-tracer's layout: ``W_enc [F, d]``, ``b_enc [F]``, ``W_dec [F, d]``,
    ``b_dec [d]``, JumpReLU ``threshold [F]`` or None, TopK ``k`` or None, ``W_skip [d, d]`` (skip = x @ W_skip.T).
    A cross-layer transcoder's layer has ``W_dec [F, 0]``: its decoders are read by :class:`CrossLayer`."""

    W_enc: torch.Tensor
    b_enc: torch.Tensor
    W_dec: torch.Tensor
    b_dec: torch.Tensor
    threshold: torch.Tensor | None = None
    k: int | None = None
    W_skip: torch.Tensor | None = None

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., d]`` -> activations ``[..., F]`` (ReLU, JumpReLU ``x * (x > threshold)`` or TopK)."""
        pre = torch.nn.functional.linear(x, self.W_enc, self.b_enc)
        if self.threshold is not None:
            return pre * (pre > self.threshold)
        if self.k is not None:
            top = pre.topk(self.k, dim=-1)
            return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())
        return pre.relu()

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        return skip(self.W_skip, x)

    def decode(self, acts: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return acts @ self.W_dec + self.b_dec + self.skip(x)

    @contextmanager
    def weights(self) -> Iterator[Transcoder]:
        """The whole transcoder for one use (it is here already)."""
        yield self


def skip(w_skip: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """A skip transcoder's linear path ``x @ W_skip.T`` (zero without one)."""
    return x @ w_skip.T if w_skip is not None else torch.zeros_like(x)


@dataclass
class Offloaded:
    """A transcoder kept off the compute device (``--offload``): only ``W_skip`` (every frozen forward uses it)
    stays there; :meth:`weights` brings the whole transcoder (``load()``: from host memory or from its file) for
    one use, and it is dropped after. The attribution uses the encoder and decoder once, in ``setup``."""

    load: Callable[[], Transcoder]
    W_skip: torch.Tensor | None = None

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        return skip(self.W_skip, x)

    @contextmanager
    def weights(self) -> Iterator[Transcoder]:
        tc = self.load()
        try:
            yield tc
        finally:
            del tc


AnyTranscoder = Union[Transcoder, Offloaded]


class _Layers:
    """A stack's block-by-block transcoders (``layers``: a per-layer set's, a cross-layer transcoder's encoders) and
    ``before_gain``."""

    def __init__(self, layers: Sequence[AnyTranscoder], before_gain: bool) -> None:
        self.layers = layers
        self.before_gain = before_gain

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def layer(self, layer: int) -> AnyTranscoder:
        return self.layers[layer]


class PerLayer(_Layers):
    """A per-layer set: ``decoder_rows(l, ids)`` is ``W_dec[ids]`` of layer l, writing to block l only
    (``loaded``: layer l's transcoder as ``weights()`` brought it in, so an offloaded one is not read twice).
    ``before_gain``: the transcoders read TransformerLens' ``ln2.hook_normalized``, the pre-MLP norm's vector
    before its gain (the replacement model gives them that, :func:`forward`), not the MLP's input."""

    def __init__(self, transcoders: Sequence[AnyTranscoder], before_gain: bool = False) -> None:
        super().__init__(transcoders, before_gain)

    def decoder_rows(self, layer: int, ids: torch.Tensor, loaded: Transcoder | None = None) -> torch.Tensor:
        if loaded is not None:
            return loaded.W_dec[ids][:, None]
        with self.layers[layer].weights() as full:
            return full.W_dec[ids][:, None]


class CrossLayer(_Layers):
    """circuit-tracer's cross-layer transcoder. ``encoders[l]``: block l's encoder, ``b_dec`` (what the CLT adds
    to block l's MLP output) and skip; ``read_decoder(l, ids) -> [k, L - l, d]``: rows ``ids`` of ``W_dec_l``
    (read when asked: a reader of the file's rows, so only active features' decoders are loaded).
    ``before_gain``: as :class:`PerLayer`'s."""

    def __init__(self, encoders: Sequence[AnyTranscoder],
                 read_decoder: Callable[[int, torch.Tensor], torch.Tensor], before_gain: bool = False) -> None:
        super().__init__(encoders, before_gain)
        self.read_decoder = read_decoder

    @property
    def encoders(self) -> Sequence[AnyTranscoder]:
        return self.layers

    def decoder_rows(self, layer: int, ids: torch.Tensor, loaded: Transcoder | None = None) -> torch.Tensor:
        if len(ids) == 0:
            return self.read_decoder(layer, ids[:0])
        unique, inverse = torch.unique(ids, return_inverse=True)
        rows = self.read_decoder(layer, unique)
        return rows[inverse.to(rows.device)]


Stack = PerLayer | CrossLayer
Transcoders = Sequence[AnyTranscoder] | PerLayer | CrossLayer


def as_stack(transcoders: Transcoders) -> Stack:
    """A list of per-layer transcoders as a :class:`PerLayer`; a stack as itself."""
    return transcoders if isinstance(transcoders, PerLayer | CrossLayer) else PerLayer(transcoders)


def open_transcoders(ts: tc_files.TranscoderSet, device: torch.device, offload: str | None = None) -> Transcoders:
    """Every layer's transcoder of ``ts`` on ``device``, fp32; ``offload``: ``cpu`` keeps them in host memory and
    moves one layer at a time to the device when it is used, ``disk`` reads a layer from its file when it is used
    and drops it after (peak memory: one layer). Either way only ``W_skip`` stays on the device (every frozen
    forward uses it). A cross-layer transcoder: its encoders so (each ``W_dec [F, 0]``), and a reader of the
    decoder rows the active features need, from the file whatever the offload (``W_dec_l`` is never loaded whole).
    Transcoders of ``ln2.hook_normalized`` (``ts.before_gain``) come as a set that says so (``before_gain``): the
    replacement model gives them the pre-MLP norm's vector before its gain, computed from the norm's input
    (engine/replacement.py), a gain of 0 included."""
    out: list[AnyTranscoder] = []
    for layer in range(ts.n_layers):
        if offload == "disk":
            out.append(Offloaded(partial(_layer, ts, layer, device), _skip(ts, layer, device)))
        elif offload == "cpu" and device.type != "cpu":
            host = _layer(ts, layer, torch.device("cpu"))
            out.append(Offloaded(partial(_moved, host, device),
                                 None if host.W_skip is None else host.W_skip.to(device)))
        else:
            out.append(_layer(ts, layer, device))
    if not ts.cross_layer:
        return PerLayer(out, before_gain=True) if ts.before_gain else out
    return CrossLayer(out, lambda layer, ids: torch.as_tensor(tc_files.read_decoder(ts, layer, ids.cpu().numpy()))
                      .to(device, torch.float32), before_gain=ts.before_gain)


def _layer(ts: tc_files.TranscoderSet, layer: int, device: torch.device) -> Transcoder:
    """Layer ``layer``'s transcoder on ``device``."""
    arrays = tc_files.load_layer(ts, layer)
    t = {k: None if v is None else torch.as_tensor(v).to(device, torch.float32) for k, v in arrays.items()
         if k != "k"}
    w = {k: v for k, v in t.items() if v is not None}
    dec = w["W_enc"].new_zeros(w["W_enc"].shape[0], 0) if ts.cross_layer else w["W_dec"]
    return Transcoder(w["W_enc"], w["b_enc"], dec, w["b_dec"], t["threshold"], arrays.get("k", ts.k), t["W_skip"])


def _skip(ts: tc_files.TranscoderSet, layer: int, device: torch.device) -> torch.Tensor | None:
    """Layer ``layer``'s ``W_skip`` alone."""
    skip = tc_files.load_array(ts, layer, "W_skip")
    return None if skip is None else torch.as_tensor(skip).to(device, torch.float32)


def _moved(tc: Transcoder, device: torch.device) -> Transcoder:
    return dataclasses.replace(tc, **{f.name: getattr(tc, f.name).to(device) for f in dataclasses.fields(tc)
                                      if isinstance(getattr(tc, f.name), torch.Tensor)})


# ---------------------------------------------------------------- the frozen forward

FROZEN_ATTENTION = "anatomy_frozen"


class Freezer:
    """What the prompt's forward fixed: each norm call's denominator, each attention call's pattern and each
    MLP's output less its skip path. ``replay``: later forwards use them (an intervention on the frozen model);
    otherwise a forward records them (and its values equal the real model's). ``normalized``: the last call's
    normalised vector before the gain (``P(x) / s``, linear in ``x``) of each norm :func:`forward` asks it of.
    ``capture`` (None: off): each attention call's ``(query, key, out)`` by module id, as the family's eager
    attention gets them (projected, normed, rotated) and ``out [B, P, heads, d_head]`` (the heads' outputs before
    the output projection); a recording forward with it also keeps each ``out`` (``outs``), and ``hold`` (replaying)
    gives every attention call that recorded output back while ``capture`` gets the output it would have had."""

    def __init__(self) -> None:
        self.scales: dict[int, list[torch.Tensor]] = {}
        self.patterns: dict[int, list[torch.Tensor]] = {}
        self.mlp_const: dict[int, torch.Tensor] = {}
        self.replay = False
        self._calls: dict[int, int] = {}
        self.normalized: dict[int, torch.Tensor | None] = {}
        self.capture: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None
        self.outs: dict[int, torch.Tensor] = {}
        self.hold = False

    def start(self) -> None:
        self._calls = {}

    def take(self, store: dict[int, list[torch.Tensor]], module: torch.nn.Module, value: torch.Tensor
             ) -> torch.Tensor:
        """Record ``value`` for this call of ``module``, or give back the one recorded (replay)."""
        key = id(module)
        i = self._calls.get(key, 0)
        self._calls[key] = i + 1
        if not self.replay:
            store.setdefault(key, []).append(value.detach())
            return value.detach()
        return store[key][i]


_ACTIVE: list[Freezer] = []


def _frozen_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, *args: object, **kwargs: object
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """The family's own eager attention, then its output again from the detached (or recorded) pattern:
    gradients reach the values only."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    _, weights = eager(module, query, key, value, attention_mask, *args, **kwargs)
    weights = _ACTIVE[-1].take(_ACTIVE[-1].patterns, module, weights)
    if weights.shape[0] != value.shape[0]:  # a replay of B copies with one copy's recorded pattern
        weights = weights.expand(value.shape[0], *weights.shape[1:])
    b, n_heads, q_len, k_len = weights.shape
    kv_heads = value.shape[1]  # grouped-query: head h reads kv head h // (n_heads / kv_heads), so the group's
    w = weights.to(value.dtype).reshape(b, kv_heads, n_heads // kv_heads * q_len, k_len)  # queries stack up
    out = torch.matmul(w, value).reshape(b, n_heads, q_len, -1).transpose(1, 2).contiguous()
    freezer = _ACTIVE[-1]
    if freezer.capture is not None:
        freezer.capture[id(module)] = (query, key, out)
        if not freezer.replay:
            freezer.outs[id(module)] = out.detach()
        elif freezer.hold:
            held = freezer.outs[id(module)]
            out = held.expand(out.shape[0], *held.shape[1:]) if held.shape[0] != out.shape[0] else held
    return out, weights


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.masking_utils import eager_mask

    AttentionInterface.register(FROZEN_ATTENTION, _frozen_attention)
    AttentionMaskInterface.register(FROZEN_ATTENTION, eager_mask)


def _norm_hook(module: torch.nn.Module, args: tuple[object, ...], out: object) -> torch.Tensor | None:
    """A LayerNorm / RMSNorm's output with its denominator frozen: equal in value (recording), gradient
    ``gain / s``; replaying, ``gain * P(x) / s + beta`` with the recorded ``s``."""
    if not isinstance(out, torch.Tensor) or not args or not isinstance(args[0], torch.Tensor):
        return None
    x = args[0]
    freezer = _ACTIVE[-1]
    xf = x.float()
    gain, beta, centred = _gain(module, x)
    xd = xf.detach()
    if centred:
        s = (xd.var(-1, unbiased=False, keepdim=True) + _eps(module)).sqrt()
    else:
        s = (xd.pow(2).mean(-1, keepdim=True) + _eps(module)).sqrt()
    s = freezer.take(freezer.scales, module, s)
    if id(module) in freezer.normalized:  # ln2.hook_normalized, as engine/norm_gain.py computes it, s frozen
        freezer.normalized[id(module)] = _normalized(x, centred, _eps(module), s)
    if freezer.replay:
        px = xf - xf.mean(-1, keepdim=True) if centred else xf
        return (gain * px / s + beta).to(out.dtype)
    delta = xf - xd
    if centred:
        delta = delta - delta.mean(-1, keepdim=True)
    return out.detach() + (delta * (gain / s)).to(out.dtype)  # one multiply in the backward


def _gain(module: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The norm's per-channel gain and bias, read by probing it with 0 and ±1 (mean 0, RMS 1): Llama's
    ``weight``, Gemma's ``1 + weight``, LayerNorm's ``weight`` and ``bias``; and whether it subtracts the mean
    (engine/norm_gain.py ``centred``)."""
    cached = getattr(module, "_anatomy_gain", None)
    if cached is not None:
        return cached  # type: ignore[no-any-return]
    gain, beta = _probe(module, x.shape[-1], x.device, x.dtype)
    found = (gain, beta, _centred(module, x.shape[-1], x.device, x.dtype))
    object.__setattr__(module, "_anatomy_gain", found)
    return found


def _norm_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if "norm" in type(m).__name__.lower() and not list(m.children())]


@contextmanager
def frozen(lm: LoadedModel, freezer: Freezer | None = None) -> Iterator[Freezer]:
    """The model with frozen attention patterns and norm denominators; parameters need no gradient. Yields the
    :class:`Freezer` (a new one, recording, unless one is given)."""
    _register()
    freezer = freezer or Freezer()
    model = lm.model
    configs = list({id(m.config): m.config for m in model.modules() if hasattr(m, "config")}.values())
    saved = [(c, getattr(c, "_attn_implementation", None)) for c in configs]
    grads = [(p, p.requires_grad) for p in model.parameters()]
    norms = _norm_modules(model)
    for m in norms:
        if hasattr(m, "_anatomy_gain"):
            object.__delattr__(m, "_anatomy_gain")
    handles = [m.register_forward_hook(_norm_hook) for m in norms]
    _ACTIVE.append(freezer)
    try:
        for c, _ in saved:
            c._attn_implementation = FROZEN_ATTENTION
        for p, _ in grads:
            p.requires_grad_(False)
        with torch.enable_grad():
            yield freezer
    finally:
        _ACTIVE.pop()
        for h in handles:
            h.remove()
        for m in norms:  # the gains read for this run: nothing stays on the model (a served one is shared)
            if hasattr(m, "_anatomy_gain"):
                object.__delattr__(m, "_anatomy_gain")
        for c, impl in saved:
            c._attn_implementation = impl
        for p, g in grads:
            p.requires_grad_(g)


def mlp_module(lm: LoadedModel, layer: int) -> torch.nn.Module:
    """The feed-forward module of block ``layer`` (its input is the transcoder's input, ``mlp.hook_in``:
    engine/hooks.py ``mlp_of``, the one rule). UsageError where the family's MLP input is not a hook point."""
    module = mlp_of(lm.model.base_model.get_submodule(lm.adapter.blocks)[layer], lm.adapter)
    if module is None:  # OPT: its MLP sees [batch * pos, d]
        raise UsageError(f"{lm.name}'s MLP input is not a hook point anatomy can read ({lm.adapter.name})")
    return module


@dataclass
class Forward:
    """One frozen forward (batch ``B`` copies of the prompt): ``mlp_in[l] [B, P, d]``, ``mlp_out[l]`` (what
    reaches the residual: skip + detached rest), ``embed [B, P, d]`` (a leaf), ``final [B, P, d]`` (the final
    norm's output) and ``logits [B, P, V]``."""

    mlp_in: list[torch.Tensor]
    mlp_out: list[torch.Tensor]
    embed: torch.Tensor
    final: torch.Tensor
    logits: torch.Tensor


def _shared(mlp: torch.nn.Module, batch: int) -> list[Any]:
    """Hooks that run ``mlp`` on the first of ``batch`` copies and repeat its output over the batch."""
    def first(value: torch.Tensor) -> torch.Tensor | None:
        return value[:1] if batch > 1 and value.shape[0] == batch else None

    def repeat(value: torch.Tensor) -> torch.Tensor | None:
        return value.expand(batch, *value.shape[1:]).contiguous() if batch > 1 and value.shape[0] == 1 else None

    return [(mlp, "input", first), (mlp, "output", repeat)]


def forward(lm: LoadedModel, ids: torch.Tensor, transcoders: Transcoders, batch: int,
            edit: Callable[[int, torch.Tensor], torch.Tensor] | None = None, last_logits: bool = False,
            shared_mlp: bool = False) -> Forward:
    """Run the frozen model on ``ids [P]`` repeated ``batch`` times, inside :func:`frozen`.
    ``edit(layer, value) -> value`` changes what an MLP writes (layer -1: the embedding) (interventions, with
    the freezer replaying). ``last_logits``: ``logits [B, 1, V]``, the last position's only, where the model's
    forward takes ``logits_to_keep`` (the attribution's batch forward reads no logits). ``shared_mlp``: each MLP
    runs on the first copy only and its output is repeated over the batch (every copy is the same prompt, and
    the replacement model reads an MLP's output as a constant: no gradient goes through it). Transcoders of
    ``ln2.hook_normalized`` (``before_gain``) read, as ``mlp_in``, the pre-MLP norm's vector before its gain,
    ``P(x) / s`` of the norm's input ``x`` with its frozen denominator ``s``: linear in ``x``, a gain of 0 or not."""
    n = lm.n_layers
    stack = as_stack(transcoders)
    norms = [mlp_norm_module(lm, layer) for layer in range(n)] if stack.before_gain else []
    normalized = _ACTIVE[-1].normalized
    normalized.clear()
    normalized.update({id(m): None for m in norms})
    mlp_in: list[Any] = [None] * n
    mlp_out: list[Any] = [None] * n
    got: dict[str, torch.Tensor] = {}

    def take_in(layer: int, value: object) -> None:
        if norms:
            mlp_in[layer] = normalized[id(norms[layer])]
        else:
            mlp_in[layer] = value if isinstance(value, torch.Tensor) else value[0]  # type: ignore[index]
        return None

    def put_out(layer: int, value: torch.Tensor) -> torch.Tensor:
        skip = stack.layer(layer).skip(mlp_in[layer]).to(value.dtype)
        freezer = _ACTIVE[-1]
        if freezer.replay:
            const = freezer.mlp_const[layer]
        else:
            const = freezer.mlp_const[layer] = (value - skip).detach()
        out = skip + const
        if not out.requires_grad and torch.is_grad_enabled():
            out.requires_grad_(True)
        if edit is not None:
            out = edit(layer, out)
        mlp_out[layer] = out
        return out

    def embed(value: torch.Tensor) -> torch.Tensor:
        if edit is not None:
            value = edit(-1, value)
        got["embed"] = value.detach().requires_grad_(torch.is_grad_enabled())
        return got["embed"]

    hooks: list[Any] = [(lm.points[sites.Whole.embed][0], "output", embed)]
    for layer in range(n):
        mlp = mlp_module(lm, layer)
        hooks.append((mlp, "input", lambda v, layer=layer: take_in(layer, v)))
        if shared_mlp:
            hooks += _shared(mlp, batch)
        module, side = lm.points[sites.name(layer, sites.Point.mlp_out)]
        hooks.append((module, side, lambda v, layer=layer: put_out(layer, v)))
    if sites.Whole.ln_final in lm.points:
        hooks.append((lm.points[sites.Whole.ln_final][0], "output", lambda v: got.__setitem__("final", v)))
    _ACTIVE[-1].start()
    extra = {"logits_to_keep": 1} if last_logits and _keeps_logits(lm.model) else {}
    try:
        with attach_modules(hooks):
            out = lm.model(input_ids=ids.to(lm.device)[None].expand(batch, -1), use_cache=False, **extra)
    finally:
        normalized.clear()
    return Forward(mlp_in, mlp_out, got["embed"], got.get("final", got["embed"]), out.logits)


def _keeps_logits(model: torch.nn.Module) -> bool:
    """Whether ``model.forward`` takes transformers' ``logits_to_keep``."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters
