"""SAELens / sparsify / Gemma Scope transcoders as a per-layer set: a folder holding one transcoder folder per block
(SAELens' ``cfg.json`` + ``sae_weights.safetensors`` with ``hook_name`` / ``hook_name_out``, or sparsify's
``layers.N.mlp`` folders with ``transcode: true``), or Gemma Scope's ``params.npz`` files anywhere below it
(``layer_{l}/width_16k/average_l0_{N}/params.npz``, as google/gemma-scope-2b-pt-transcoders lays them out: the block
from the ``layer_{l}`` folder, ``ln2.hook_normalized`` -> ``hook_mlp_out``); what ``anatomy sae`` reads, through
the same reader, models/sae/read.py, turned to circuit-tracer's orientation (``W_enc [F, d]``, ``W_dec [F, d]``,
``W_skip [d, d]`` with skip = x @ W_skip.T).

A block with several transcoders (Gemma Scope's ``average_l0_N`` variants of one ``layer_N``) is refused, naming
them: the folder must hold one per block (a folder of ``layer_N`` links to the chosen variants will do).

:func:`describe` reads every layer's headers once to check it (one line per refusal; no weights) and keeps the
folders and shapes only; ``load_layer`` reads a layer's arrays when the weights are wanted.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from anatomy_cli.errors import UsageError
from anatomy_cli.models.sae import names
from anatomy_cli.models.sae.read import GEMMA_SCOPE
from anatomy_cli.models.sae.read import SAEFile
from anatomy_cli.models.sae.read import read
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import hook_name


def folders(root: Path) -> list[Path]:
    """The folders that hold one transcoder each (empty: not this layout): ``root``'s subfolders with a
    ``cfg.json``, and every folder below ``root`` (links followed) holding a Gemma Scope ``params.npz``."""
    found = {d for d in root.iterdir() if d.is_dir() and (d / "cfg.json").is_file()}
    found |= {Path(d) for d, _, files in os.walk(root, followlinks=True) if GEMMA_SCOPE in files}
    return sorted(found)


def _check(f: SAEFile) -> int:
    """The block a transcoder belongs to: it reads block L's MLP input and writes its output; refused otherwise,
    and where its input is normalised or rescaled (circuit tracing takes the plain affine encoder)."""
    if not f.transcoder:
        raise UsageError(f"{f.path}: an SAE at {f.hook_name}, not a transcoder (circuit needs MLP in -> MLP out)")
    layer = names.layer_of(f.site)
    if (f.site, f.site_out) != (hook_name(layer, Site.mlp_in), hook_name(layer, Site.mlp_out)):
        raise UsageError(f"{f.path}: a transcoder from {f.site} to {f.site_out}; circuit tracing needs block "
                         f"{layer}'s mlp.hook_in -> hook_mlp_out")
    if f.normalize_activations != "none" or f.rescale_by_decoder_norm or f.subtract_b_dec:
        raise UsageError(f"{f.path}: normalize_activations '{f.normalize_activations}' (or a rescaled or "
                         f"b_dec-centred input) is not read by circuit: it takes the plain encoder W_enc x + b_enc")
    return layer


def describe(root: Path) -> dict[str, Any]:
    """The fields of a TranscoderSet for ``root``'s transcoder folders: at most one per block, equal shapes;
    ``present``: their blocks, in order (a block missing is refused by ``transcoders.check_fits``, which knows the
    model's blocks 0..L-1 and names every one missing); ``k``: the largest TopK ``k`` when every block is TopK
    (sparsify), else None (each block's own ``k`` is what ``load_layer`` gives the run; this one bounds the
    estimate); ``model_name``: the first block's (fit-sae's)."""
    found: dict[int, list[SAEFile]] = {}
    for d in folders(root):
        f = read(d, transcoder=True, values=False)
        found.setdefault(_check(f), []).append(f)
    for layer, fs in sorted(found.items()):
        if len(fs) > 1:
            raise UsageError(f"--transcoders {root}: block {layer} has {len(fs)} transcoders "
                             f"({', '.join(_shown(root, f.path) for f in fs)}); point --transcoders at a folder "
                             f"holding one per block (links to the chosen ones will do)")
    by_layer = {layer: found[layer][0] for layer in sorted(found)}  # a block missing: check_fits, with the model's
    first = next(iter(by_layer.values()))
    for f in by_layer.values():
        if (f.d_in, f.d_sae) != (first.d_in, first.d_sae):
            raise UsageError(f"{f.path}: {f.d_sae} features of width {f.d_in}, unlike the other blocks' "
                             f"transcoders")
    skip = 0 if first.W_skip is None else 4 * first.d_in * first.d_in
    gains = {names.before_gain(f.hook_name) for f in by_layer.values()}
    if len(gains) > 1:
        raise UsageError(f"--transcoders {root}: some blocks' transcoders read ln2.hook_normalized (before the "
                         f"norm's gain) and others the MLP's input; one set reads one of the two")
    ks = [f.k for f in by_layer.values()]
    k = None if None in ks else max(k for k in ks if k is not None)  # TopK in every block: the largest k
    return {"paths": tuple(f.path for f in by_layer.values()), "present": tuple(by_layer), "d_model": first.d_in,
            "d_transcoder": first.d_sae, "sae_format": first.format, "skip_bytes": skip, "k": k,
            "layer_bytes": 4 * (2 * first.d_sae * first.d_in + 2 * first.d_sae + first.d_in) + skip,
            "thresholds": any(f.threshold is not None for f in by_layer.values()), "before_gain": gains == {True},
            "model_name": first.model_name}


def _shown(root: Path, path: Path) -> str:
    """``path`` as the refusal names it: below ``root`` when it is."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def load_layer(path: Path) -> dict[str, Any]:
    """One block's arrays in circuit-tracer's orientation (+ its TopK ``k``)."""
    f = read(path, transcoder=True)
    return {"W_enc": f.W_enc.T, "W_dec": f.W_dec, "b_enc": f.b_enc, "b_dec": f.b_dec, "threshold": f.threshold,
            "W_skip": f.W_skip, "k": f.k}
