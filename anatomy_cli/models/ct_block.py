"""One block of circuit-tracer's transcoder set or cross-layer transcoder read as a dictionary (an
:class:`~anatomy_cli.models.sae.read.SAEFile`), for ``features`` (:func:`read_dictionary`: what the SAE reader
reads, and such a block): ``DIR --hook N`` (a block number, or any hook name of that block: ``layers.14.mlp``,
``blocks.14.mlp.hook_in``).

The set's files are read by models/transcoders.py (the one reader ``circuit`` uses): block N's ``W_enc [F, d]``,
``b_enc``, ``b_dec``, its JumpReLU threshold (then JumpReLU, whatever the config's ``k`` says, as ``circuit``
encodes) or the config's TopK ``k``, else ReLU; its input at the config's ``feature_input_hook`` (the MLP's input,
or ``ln2.hook_normalized``, read before the norm's gain as everywhere). A cross-layer transcoder's block-N features
write to the MLP outputs of blocks N..L-1 (``W_dec_N [F, L - N, d]``): the dictionary's decoder row is their sum,
the feature's whole direct write to the residual stream, which is what its logit effects read."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from anatomy_cli.errors import UsageError
from anatomy_cli.models import transcoders
from anatomy_cli.models.sae.read import SAEFile
from anatomy_cli.models.sae.read import circuit_tracer_kind
from anatomy_cli.models.sae.read import read
from anatomy_cli.models.sites import Point
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import hook_name
from anatomy_cli.models.sites import name


def read_dictionary(path: str | Path, *, hook: str | None = None, values: bool = True) -> SAEFile:
    """The dictionary at ``path``: one block of a circuit-tracer set (:func:`read_block`, ``hook`` naming it), else
    what models/sae/read.py ``read`` reads."""
    folder = Path(path)
    kind = circuit_tracer_kind(folder) if folder.is_dir() else None
    return read(folder, hook=hook, values=values) if kind is None else read_block(folder, hook, kind, values)


def block_of_hook(hook: str | None, folder: Path, kind: str, n_layers: int) -> int:
    """The block ``--hook`` names (its first number); UsageError naming what to pass when it names none."""
    found = re.search(r"\d+", hook or "")
    layer = int(found.group()) if found else None
    if layer is None or not 0 <= layer < n_layers:
        said = "" if hook is None else f" (--hook {hook} names {'no block' if layer is None else 'none of them'})"
        raise UsageError(f"{folder} is circuit-tracer's {kind} of {n_layers} blocks{said}: pick one block's "
                         f"features with --hook N (0-{n_layers - 1}, e.g. --hook {n_layers // 2}), or pass the "
                         f"whole set to circuit --transcoders")
    return layer


def read_block(folder: Path, hook: str | None, kind: str, values: bool = True) -> SAEFile:
    """Block ``--hook``'s dictionary of the set at ``folder`` (the module docstring); ``values`` False: zero-strided
    stand-ins of the arrays' shapes (models/sae/arrays.py), no weight read."""

    ts = transcoders.describe(folder)
    layer = block_of_hook(hook, folder, kind, ts.n_layers)
    F, d = ts.d_transcoder, ts.d_model
    if values:
        arrays = transcoders.load_layer(ts, layer)
        W_dec = transcoders.read_decoder(ts, layer, range(F)).sum(1) if ts.cross_layer else arrays["W_dec"]
        W_enc, b_enc, b_dec, threshold = arrays["W_enc"].T, arrays["b_enc"], arrays["b_dec"], arrays["threshold"]
        skip = arrays["W_skip"]
    else:
        zero = np.float32(0)
        W_enc, W_dec = np.broadcast_to(zero, (d, F)), np.broadcast_to(zero, (F, d))
        b_enc, b_dec = np.broadcast_to(zero, (F,)), np.broadcast_to(zero, (d,))
        threshold = np.broadcast_to(zero, (F,)) if ts.thresholds else None
        skip = np.broadcast_to(zero, (d, d)) if ts.skip_bytes else None
    arch = "jumprelu" if threshold is not None else "topk" if ts.k is not None else "standard"
    k = ts.k if arch == "topk" else None
    out = hook_name(layer, Site.mlp_out)
    hook_in = name(layer, Point.ln2_normalized) if ts.before_gain else hook_name(layer, Site.mlp_in)
    return SAEFile(path=folder, format="circuit_tracer_clt" if ts.cross_layer else "circuit_tracer_set",
                   architecture=arch, W_enc=np.asarray(W_enc), b_enc=np.asarray(b_enc), W_dec=np.asarray(W_dec),
                   b_dec=np.asarray(b_dec), threshold=None if threshold is None else np.asarray(threshold), k=k,
                   W_skip=None if skip is None else np.asarray(skip), hook_name=hook_in, hook_name_out=out,
                   site=hook_name(layer, Site.mlp_in), site_out=out, subtract_b_dec=False,
                   normalize_activations="none", prepend_bos=None, context_size=ts.context_size, dtype="float32",
                   neuronpedia_id=None, model_name=ts.model_name, stated_l0=None if k is None else float(k),
                   centred=False, skipped_positions=ts.skipped_positions)
