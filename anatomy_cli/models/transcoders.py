"""A transcoder set on disk, read before any model weight: circuit-tracer's ``transcoder_set`` folder (a
``config.yaml`` with ``model_kind``, ``feature_input_hook``, ``feature_output_hook``, ``scan`` and ``transcoders:``
one safetensors path per layer: ``W_enc [F, d]``, ``W_dec [F, d]``, ``b_enc``, ``b_dec``, optional
``activation_function.threshold`` (JumpReLU) or ``threshold``, ``W_skip [d, d]``) and Gemma Scope 2's per-layer
safetensors (``w_enc [d, F]``, ``w_dec [F, d]``, ``b_enc``, ``b_dec``, ``threshold``, ``affine_skip_connection``).

:func:`describe` reads the config and the tensors' shapes only (no values): every refusal comes from it.
:func:`load_layer` reads one layer's arrays (numpy, circuit-tracer's orientation).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.errors import UsageError
from anatomy_cli.models.sae.names import hook_point
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import hook_name

KINDS = ("transcoder_set",)


@dataclass(frozen=True)
class TranscoderSet:
    """``paths[l]``: layer l's file; ``d_model``, ``d_transcoder`` from the shapes; ``input_site`` /
    ``output_site``: anatomy's sites (``mlp_in`` / ``mlp_out``); ``scan``: the config's; ``gemma_scope_2``: the
    files use Gemma Scope 2's names; ``layer_bytes``: one layer's arrays in float32 (the first file's shapes),
    ``skip_bytes`` its ``W_skip``'s (0: none)."""

    root: Path
    paths: tuple[Path, ...]
    d_model: int
    d_transcoder: int
    input_site: Site
    output_site: Site
    scan: str | list[str] | None
    gemma_scope_2: bool
    k: int | None
    layer_bytes: int = 0
    skip_bytes: int = 0

    @property
    def n_layers(self) -> int:
        return len(self.paths)


def _site(name: str, what: str) -> Site:
    """``blocks.L.ln2.hook_normalized`` / ``mlp.hook_in`` -> mlp_in; ``hook_mlp_out`` / ``mlp.hook_out`` ->
    mlp_out (the layer number is the config's template, ignored)."""
    name = re.sub(r"^blocks\.\d+\.|^model\.layers\.\d+\.|^layers\.\d+\.", "", name)
    if name in ("mlp.hook_in", "ln2.hook_normalized", "hook_mlp_in", "mlp.input"):
        return Site.mlp_in
    if name in ("mlp.hook_out", "hook_mlp_out", "mlp.output", "mlp"):
        return Site.mlp_out
    try:
        return Site(hook_point(f"blocks.0.{name}").split(".", 2)[2].replace("hook_", ""))
    except (UsageError, ValueError):
        raise UsageError(f"the transcoders' {what} '{name}' has no anatomy site: circuit tracing reads the MLP's "
                         f"input (mlp.hook_in, ln2.hook_normalized) and writes its output (hook_mlp_out)") from None


def _config(root: Path) -> dict[str, Any]:
    for name in ("config.yaml", "config.yml"):
        if (root / name).is_file():
            import yaml  # type: ignore[import-untyped]  # transformers' dependency

            try:
                data = yaml.safe_load((root / name).read_text())
            except yaml.YAMLError as e:
                raise UsageError(f"{root / name} is not valid YAML: {str(e).splitlines()[0]}") from None
            if not isinstance(data, dict):
                raise UsageError(f"{root / name} is not a mapping")
            return data
    if (root / "config.json").is_file():
        return dict(json.loads((root / "config.json").read_text()))
    raise UsageError(f"--transcoders {root}: no config.yaml there (circuit-tracer's transcoder_set layout: "
                     f"model_kind, feature_input_hook, feature_output_hook, transcoders: one file per layer)")


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:
        raise UsageError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from None


def describe(root: str | Path) -> TranscoderSet:
    """The set's description from its config and headers. Raises UsageError (one line) for a missing folder,
    an unknown kind, a missing file or tensor, or shapes that disagree."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"--transcoders {root}: no such directory")
    cfg = _config(root)
    kind = cfg.get("model_kind", "transcoder_set")
    if kind not in KINDS:
        raise UsageError(f"--transcoders {root}: model_kind '{kind}' is not read yet (anatomy reads "
                         f"{', '.join(KINDS)})")
    files = cfg.get("transcoders")
    if not isinstance(files, list) or not files:
        raise UsageError(f"{root}/config.yaml: 'transcoders' must list one file per layer")
    paths = tuple((root / p) if not Path(p).is_absolute() else Path(p) for p in map(str, files))
    for p in paths:
        if not p.is_file():
            raise UsageError(f"{root}/config.yaml names {p}, which does not exist")
    first = _shapes(paths[0])
    gs2 = "w_enc" in first
    enc = "w_enc" if gs2 else "W_enc"
    if enc not in first:
        raise UsageError(f"{paths[0]}: no W_enc (or Gemma Scope 2's w_enc) tensor")
    d_tc, d_model = (first[enc][1], first[enc][0]) if gs2 else first[enc]
    for p in paths[1:]:
        shape = _shapes(p).get(enc)
        if shape is None or sorted(shape) != sorted((d_tc, d_model)):
            raise UsageError(f"{p}: {enc} is {shape}, but layer 0's is {first[enc]}")
    return TranscoderSet(root, paths, int(d_model), int(d_tc),
                         _site(str(cfg.get("feature_input_hook", "mlp.hook_in")), "feature_input_hook"),
                         _site(str(cfg.get("feature_output_hook", "hook_mlp_out")), "feature_output_hook"),
                         cfg.get("scan"), gs2, cfg.get("k"), 4 * sum(math.prod(v) for v in first.values()),
                         4 * math.prod(first.get("affine_skip_connection" if gs2 else "W_skip", (0,))))


def check_fits(ts: TranscoderSet, n_layers: int, d_model: int, label: str) -> None:
    if ts.n_layers != n_layers:
        raise UsageError(f"--transcoders has {ts.n_layers} layers, but {label} has {n_layers} blocks")
    if ts.d_model != d_model:
        raise UsageError(f"the transcoders are {ts.d_model} wide, but {label}'s residual stream is {d_model}: "
                         f"they were trained on another model")
    if ts.input_site is not Site.mlp_in or ts.output_site is not Site.mlp_out:
        raise UsageError(f"the transcoders read {hook_name(0, ts.input_site)} and write "
                         f"{hook_name(0, ts.output_site)}; circuit tracing needs mlp.hook_in -> hook_mlp_out")


def load_layer(ts: TranscoderSet, layer: int) -> dict[str, Any]:
    """Layer ``layer``'s arrays in circuit-tracer's orientation: ``W_enc [F, d]``, ``W_dec [F, d]``, ``b_enc``,
    ``b_dec``, ``threshold`` or None, ``W_skip [d, d]`` or None."""
    from safetensors.numpy import load_file

    t = load_file(str(ts.paths[layer]))
    if ts.gemma_scope_2:
        skip = t.get("affine_skip_connection")
        return {"W_enc": t["w_enc"].T, "W_dec": t["w_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"],
                "threshold": t.get("threshold"), "W_skip": None if skip is None else skip.T}
    return {"W_enc": t["W_enc"], "W_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"],
            "threshold": t.get("activation_function.threshold", t.get("threshold")), "W_skip": t.get("W_skip")}


def load_array(ts: TranscoderSet, layer: int, name: str) -> Any:
    """One array of layer ``layer`` (circuit-tracer's name and orientation: ``W_skip`` is ``[d, d]``), read
    alone from the file (the others are not read), or None when the file has none."""
    from safetensors import safe_open

    names = {"W_skip": "affine_skip_connection"} if ts.gemma_scope_2 else {}
    key = names.get(name, name)
    with safe_open(str(ts.paths[layer]), framework="numpy") as f:
        if key not in f.keys():
            return None
        value = f.get_tensor(key)
    return value.T if ts.gemma_scope_2 and name == "W_skip" else value
