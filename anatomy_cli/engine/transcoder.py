"""The transcoders of a replacement model, in circuit-tracer's orientation: a per-layer set (one
:class:`Transcoder` per block, its decoder writing to that block's MLP output) or a :class:`CrossLayer`
transcoder (layer l's features read block l's MLP input and write to the MLP outputs of blocks l..L-1).

Both answer the same three questions (:data:`Stack`): ``n_layers``; ``layer(l)``, a :class:`Transcoder` with
block l's encoder, ``b_dec`` and skip path; ``decoder_rows(l, ids) -> [k, n_out, d]``, the decoders of layer
l's features ``ids``, row j writing to block ``l + j``.

:func:`open_transcoders` opens a set from its files (models/transcoders.py reads them) on the model's device.
``--offload``: a layer may be an :class:`Offloaded` one (only ``W_skip`` on the device); ``weights()`` brings the
whole layer in for one use (:func:`anatomy_cli.analyses.circuit.setup` uses each layer once). A cross-layer
transcoder's decoders are read from the file row by row whatever the offload, so only its encoders are offloaded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from collections.abc import Iterator
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Union

import torch

from anatomy_cli.models import transcoders as tc_files


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


class PerLayer:
    """A per-layer set: ``decoder_rows(l, ids)`` is ``W_dec[ids]`` of layer l, writing to block l only
    (``loaded``: layer l's transcoder as ``weights()`` brought it in, so an offloaded one is not read twice).
    ``before_gain``: the transcoders read TransformerLens' ``ln2.hook_normalized``, the pre-MLP norm's vector
    before its gain (the replacement model gives them that, engine/replacement.py), not the MLP's input."""

    def __init__(self, transcoders: Sequence[AnyTranscoder], before_gain: bool = False) -> None:
        self.transcoders = transcoders
        self.before_gain = before_gain

    @property
    def n_layers(self) -> int:
        return len(self.transcoders)

    def layer(self, layer: int) -> AnyTranscoder:
        return self.transcoders[layer]

    def decoder_rows(self, layer: int, ids: torch.Tensor, loaded: Transcoder | None = None) -> torch.Tensor:
        if loaded is not None:
            return loaded.W_dec[ids][:, None]
        with self.transcoders[layer].weights() as full:
            return full.W_dec[ids][:, None]


class CrossLayer:
    """circuit-tracer's cross-layer transcoder. ``encoders[l]``: block l's encoder, ``b_dec`` (what the CLT adds
    to block l's MLP output) and skip; ``read_decoder(l, ids) -> [k, L - l, d]``: rows ``ids`` of ``W_dec_l``
    (read when asked: a reader of the file's rows, so only active features' decoders are loaded).
    ``before_gain``: as :class:`PerLayer`'s."""

    def __init__(self, encoders: Sequence[AnyTranscoder],
                 read_decoder: Callable[[int, torch.Tensor], torch.Tensor], before_gain: bool = False) -> None:
        self.encoders = encoders
        self.read_decoder = read_decoder
        self.before_gain = before_gain

    @property
    def n_layers(self) -> int:
        return len(self.encoders)

    def layer(self, layer: int) -> AnyTranscoder:
        return self.encoders[layer]

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
