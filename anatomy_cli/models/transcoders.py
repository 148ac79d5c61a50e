"""A transcoder set on disk, read before any model weight: circuit-tracer's ``transcoder_set`` folder (a
``config.yaml`` with ``model_kind``, ``feature_input_hook``, ``feature_output_hook``, ``scan`` and ``transcoders:``
one safetensors path per layer: ``W_enc [F, d]``, ``W_dec [F, d]``, ``b_enc``, ``b_dec``, optional
``activation_function.threshold`` (JumpReLU) or ``threshold``, ``W_skip [d, d]``) and Gemma Scope 2's per-layer
safetensors (``w_enc [d, F]``, ``w_dec [F, d]``, ``b_enc``, ``b_dec``, ``threshold``, ``affine_skip_connection``);
and circuit-tracer's ``cross_layer_transcoder`` folder (its ``load_clt`` layout: the config beside
``W_enc_{l}.safetensors`` with ``W_enc_{l} [F, d]``, ``b_enc_{l}``, ``b_dec_{l}``, optional ``threshold_{l}``
(JumpReLU) and ``W_skip_{l} [d, d]`` (skip = x @ W_skip_l), and ``W_dec_{l}.safetensors`` with
``W_dec_{l} [F, L - l, d]``: layer l's features write to the MLP outputs of blocks l..L-1); or, with no config,
SAELens / sparsify transcoder folders or Gemma Scope ``params.npz`` files, one per block
(models/transcoder_sae.py).

:func:`describe` reads the config and the tensors' shapes only (no values): every refusal comes from it.
:func:`load_layer` reads one layer's arrays (numpy, circuit-tracer's orientation); :func:`read_decoder` reads a
cross-layer transcoder's decoder rows for the features asked (the lazy read: ``W_dec_{l}`` is never loaded whole).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from safetensors import safe_open

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sae.names import before_gain
from anatomy_cli.models.sites import CT_MLP_OUT
from anatomy_cli.models.sites import TL_MLP_IN
from anatomy_cli.models.sites import Point
from anatomy_cli.models.sites import Site
from anatomy_cli.models.sites import block_spans
from anatomy_cli.models.sites import hook_name

if TYPE_CHECKING:
    from collections.abc import Iterable

    import numpy as np

KINDS = ("transcoder_set", "cross_layer_transcoder")


@dataclass(frozen=True)
class TranscoderSet:
    """``paths[l]``: layer l's file; ``d_model``, ``d_transcoder`` from the shapes; ``input_site`` /
    ``output_site``: anatomy's sites (``mlp_in`` / ``mlp_out``); ``scan``: the config's; ``gemma_scope_2``: the
    files use Gemma Scope 2's names; ``layer_bytes``: one layer's arrays in float32 (the first file's shapes; a
    cross-layer transcoder's: its encoder file, the decoders read row by row), ``skip_bytes`` its ``W_skip``'s
    (0: none); ``cross_layer``: a cross-layer transcoder, ``paths`` its ``W_enc_{l}`` files and ``decoders`` its
    ``W_dec_{l}`` files; ``sae_format``: SAELens / sparsify folders or Gemma Scope params.npz files, ``paths`` one
    per block; ``thresholds``: some block carries a JumpReLU threshold, which wins over ``k`` in the run's encode
    (engine/replacement.py), so that block is not TopK whatever ``k`` says; ``before_gain``: the input hook is
    TransformerLens' ``ln2.hook_normalized``, the pre-MLP norm's output before its gain (names.py ``before_gain``:
    the replacement model computes it from the norm's input)."""

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
    cross_layer: bool = False
    decoders: tuple[Path, ...] = ()
    sae_format: str | None = None
    thresholds: bool = False
    before_gain: bool = False
    model_name: str | None = None  # the config's (fit-sae --clt writes it: models/resolve.py ``recorded``)
    context_size: int | None = None  # the config's: the windows' length it was fitted on (fit-sae --clt writes it)
    skipped_positions: int = 0  # the config's: each window's first positions the fit left out (fit-sae --clt)
    present: tuple[int, ...] = ()  # the blocks of ``paths``, where a folder per block says (empty: 0..len - 1)

    @property
    def n_layers(self) -> int:
        return len(self.paths)

    @property
    def blocks(self) -> tuple[int, ...]:
        """The blocks the set has a transcoder for, in the order of ``paths`` (:func:`check_fits` refuses a set
        whose blocks are not the model's 0..L-1: until then a folder per block may lack some)."""
        return self.present or tuple(range(len(self.paths)))

    @property
    def topk(self) -> int | None:
        """Active features per block and position when every block is TopK: ``min(k, F)``; None when some block
        is not (no ``k``, or a JumpReLU threshold: any number of its features can be active)."""
        return None if self.k is None or self.thresholds else min(self.k, self.d_transcoder)


def _site(name: str, what: str) -> Site:
    """``blocks.L.ln2.hook_normalized`` / ``mlp.hook_in`` -> mlp_in; ``hook_mlp_out`` / ``mlp.hook_out`` ->
    mlp_out (the layer number is the config's template, ignored)."""
    name = re.sub(r"^blocks\.\d+\.|^model\.layers\.\d+\.|^layers\.\d+\.", "", name)
    if name in (Point.mlp_in, Point.ln2_normalized, TL_MLP_IN, "mlp.input"):
        return Site.mlp_in
    if name in (CT_MLP_OUT, Point.mlp_out, "mlp.output", "mlp"):  # circuit-tracer's and sparsify's names
        return Site.mlp_out
    site = next((s for s in Site if s.hook == name and not s.per_head), None)
    if site is None:
        raise UsageError(f"the transcoders' {what} '{name}' has no anatomy site: circuit tracing reads the MLP's "
                         f"input (mlp.hook_in, ln2.hook_normalized) and writes its output (hook_mlp_out)")
    return site


def _config(root: Path) -> dict[str, Any]:
    for name in ("config.yaml", "config.yml"):
        if (root / name).is_file():
            import yaml  # type: ignore[import-untyped]  # transformers' dependency

            try:
                data = yaml.safe_load((root / name).read_text())
            except yaml.YAMLError as e:
                raise CheckpointError(f"{root / name} is not valid YAML: {str(e).splitlines()[0]}") from None
            if not isinstance(data, dict):
                raise CheckpointError(f"{root / name} is not a mapping")
            return data
    if (root / "config.json").is_file():
        try:
            data = json.loads((root / "config.json").read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{root / 'config.json'} is not JSON ({e})") from None
        if not isinstance(data, dict):
            raise CheckpointError(f"{root / 'config.json'} is not a JSON object")
        return data
    from anatomy_cli.models import transcoder_sae

    if transcoder_sae.folders(root):
        return {"model_kind": "sae_folders"}
    raise UsageError(f"--transcoders {root}: no config.yaml there (circuit-tracer's transcoder_set layout: "
                     f"model_kind, feature_input_hook, feature_output_hook, transcoders: one file per layer), "
                     f"nor SAELens / sparsify transcoder folders (cfg.json) or Gemma Scope params.npz files, one "
                     f"per block")


def _recorded(cfg: dict[str, Any]) -> dict[str, Any]:
    """What the config records of the fit: ``model_name`` (circuit-tracer's key; None where it names none) and
    ``context_size`` (SAELens' key, which circuit-tracer does not read: fit-sae --clt's windows; None where absent),
    ``skipped_positions`` (each window's first positions the fit left out; 0 where absent)."""
    from anatomy_cli.models.sae.read import context_size
    from anatomy_cli.models.sae.read import skipped_positions

    name = cfg.get("model_name")
    return {"model_name": str(name) if name else None, "context_size": context_size(cfg.get("context_size")),
            "skipped_positions": skipped_positions(cfg.get("skipped_positions"))}


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    try:
        with safe_open(str(path), framework="numpy") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:
        raise CheckpointError(f"{path}: not a readable safetensors file ({str(e).splitlines()[0]})") from None


def describe(root: str | Path) -> TranscoderSet:
    """The set's description from its config and headers. Raises UsageError (one line) for a missing folder,
    an unknown kind, a missing file or tensor, or shapes that disagree."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"--transcoders {root}: no such directory")
    cfg = _config(root)
    kind = cfg.get("model_kind", "transcoder_set")
    if kind == "sae_folders":  # SAELens / sparsify transcoders, one folder per block
        from anatomy_cli.models import transcoder_sae

        return TranscoderSet(root, input_site=Site.mlp_in, output_site=Site.mlp_out, scan=None, gemma_scope_2=False,
                             **transcoder_sae.describe(root))
    if kind not in KINDS:
        raise UsageError(f"--transcoders {root}: model_kind '{kind}' is not read yet (anatomy reads "
                         f"{', '.join(KINDS)})")
    if kind == "cross_layer_transcoder":
        return _describe_clt(root, cfg)
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
    thresholds = _threshold(first)
    for p in paths[1:]:
        shapes = _shapes(p)
        shape = shapes.get(enc)
        if shape is None or sorted(shape) != sorted((d_tc, d_model)):
            raise UsageError(f"{p}: {enc} is {shape}, but layer 0's is {first[enc]}")
        thresholds = thresholds or _threshold(shapes)
    return TranscoderSet(root, paths, int(d_model), int(d_tc),
                         _site(str(cfg.get("feature_input_hook", Point.mlp_in.value)), "feature_input_hook"),
                         _site(str(cfg.get("feature_output_hook", Point.mlp_out.value)), "feature_output_hook"),
                         cfg.get("scan"), gs2, _k(cfg),
                         *_bytes(first, "affine_skip_connection" if gs2 else "W_skip"), thresholds=thresholds,
                         before_gain=before_gain(str(cfg.get("feature_input_hook", ""))), **_recorded(cfg))


def _threshold(shapes: dict[str, tuple[int, ...]]) -> bool:
    """A file's tensors include a JumpReLU threshold (the names :func:`load_layer` reads it under)."""
    return any(name in ("activation_function.threshold", "threshold") or name.startswith("threshold_")
               for name in shapes)


def _k(cfg: Mapping[str, object]) -> int | None:
    """The config's TopK ``k`` (None: not TopK); refused unless a whole number of at least 1."""
    k = cfg.get("k")
    if k is None:
        return None
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise UsageError(f"the transcoders' config.yaml k: {k!r}: TopK takes a whole number of at least 1")
    return k


def _bytes(shapes: dict[str, tuple[int, ...]], skip: str) -> tuple[int, int]:
    """(layer_bytes, skip_bytes) in float32 from one file's shapes."""
    return 4 * sum(math.prod(v) for v in shapes.values()), 4 * math.prod(shapes.get(skip, (0,)))


def _describe_clt(root: Path, cfg: dict[str, Any]) -> TranscoderSet:
    """A cross-layer transcoder: ``W_enc_{l}`` / ``W_dec_{l}`` files for l = 0..L-1 beside the config, their
    shapes ``[F, d]`` and ``[F, L - l, d]``."""
    n = len(list(root.glob("W_enc_*.safetensors")))
    if n == 0:
        raise UsageError(f"--transcoders {root}: a cross_layer_transcoder folder holds W_enc_0.safetensors .. "
                         f"and W_dec_0.safetensors .. (circuit-tracer's load_clt layout); none there")
    enc = tuple(root / f"W_enc_{l}.safetensors" for l in range(n))
    dec = tuple(root / f"W_dec_{l}.safetensors" for l in range(n))
    for p in enc + dec:
        if not p.is_file():
            raise UsageError(f"--transcoders {root}: {p.name} is missing (layers 0..{n - 1} need W_enc_l and W_dec_l)")
    first = _shapes(enc[0]).get("W_enc_0")
    if first is None or len(first) != 2:
        raise UsageError(f"{enc[0]}: no W_enc_0 [F, d] tensor")
    d_tc, d_model = first
    thresholds = False
    for layer in range(n):
        shapes = _shapes(enc[layer])
        got = (shapes.get(f"W_enc_{layer}"), _shapes(dec[layer]).get(f"W_dec_{layer}"))
        want = ((d_tc, d_model), (d_tc, n - layer, d_model))
        if got != want:
            raise UsageError(f"{root}: layer {layer}'s W_enc_{layer}, W_dec_{layer} are {got[0]}, {got[1]}; "
                             f"expected {want[0]}, {want[1]}")
        thresholds = thresholds or _threshold(shapes)
    return TranscoderSet(root, enc, int(d_model), int(d_tc),
                         _site(str(cfg.get("feature_input_hook", Point.mlp_in.value)), "feature_input_hook"),
                         _site(str(cfg.get("feature_output_hook", Point.mlp_out.value)), "feature_output_hook"),
                         cfg.get("scan"), False, _k(cfg), *_bytes(_shapes(enc[0]), "W_skip_0"), True, dec,
                         thresholds=thresholds, before_gain=before_gain(str(cfg.get("feature_input_hook", ""))),
                         **_recorded(cfg))


def check_fits(ts: TranscoderSet, n_layers: int, d_model: int, label: str) -> None:
    """UsageError unless ``ts`` fits the model ``label`` (``n_layers`` blocks of width ``d_model``): one transcoder
    for every block 0..L-1 (the refusal names every block missing, below and above those present, and those the
    model lacks), the width, the MLP's input and output."""
    missing = [b for b in range(n_layers) if b not in ts.blocks]
    extra = [b for b in ts.blocks if b >= n_layers]
    if missing or extra:
        what = "; ".join([f"none for {block_spans(missing)}"] * bool(missing) +
                         [f"the model has no {block_spans(extra)}"] * bool(extra))
        each = " (one folder per block, every block 0..L-1)" if ts.sae_format is not None and missing else ""
        raise UsageError(f"--transcoders has transcoders for {block_spans(ts.blocks)}, but {label} "
                         f"has {n_layers} blocks (0-{n_layers - 1}): {what}{each}")
    if ts.d_model != d_model:
        raise UsageError(f"the transcoders are {ts.d_model} wide, but {label}'s residual stream is {d_model}: "
                         f"they were trained on another model")
    if ts.input_site is not Site.mlp_in or ts.output_site is not Site.mlp_out:
        raise UsageError(f"the transcoders read {hook_name(0, ts.input_site)} and write "
                         f"{hook_name(0, ts.output_site)}; circuit tracing needs mlp.hook_in -> hook_mlp_out")


def load_layer(ts: TranscoderSet, layer: int) -> dict[str, Any]:
    """Layer ``layer``'s arrays in circuit-tracer's orientation: ``W_enc [F, d]``, ``W_dec [F, d]``, ``b_enc``,
    ``b_dec``, ``threshold`` or None, ``W_skip [d, d]`` or None (skip = x @ W_skip.T); a cross-layer transcoder's
    ``W_dec`` is None (:func:`read_decoder`)."""
    from safetensors.numpy import load_file

    if ts.sae_format is not None:
        from anatomy_cli.models import transcoder_sae

        return transcoder_sae.load_layer(ts.paths[layer])
    t = load_file(str(ts.paths[layer]))
    if ts.cross_layer:  # W_dec is read_decoder's; the skip turned to x @ W_skip.T as the per-layer sets have it
        skip = t.get(f"W_skip_{layer}")
        return {"W_enc": t[f"W_enc_{layer}"], "W_dec": None, "b_enc": t[f"b_enc_{layer}"],
                "b_dec": t[f"b_dec_{layer}"], "threshold": t.get(f"threshold_{layer}"),
                "W_skip": None if skip is None else skip.T}
    if ts.gemma_scope_2:
        skip = t.get("affine_skip_connection")
        return {"W_enc": t["w_enc"].T, "W_dec": t["w_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"],
                "threshold": t.get("threshold"), "W_skip": None if skip is None else skip.T}
    return {"W_enc": t["W_enc"], "W_dec": t["W_dec"], "b_enc": t["b_enc"], "b_dec": t["b_dec"],
            "threshold": t.get("activation_function.threshold", t.get("threshold")), "W_skip": t.get("W_skip")}


def load_array(ts: TranscoderSet, layer: int, name: str) -> np.ndarray | None:
    """One array of layer ``layer`` (circuit-tracer's name and orientation: ``W_skip`` is ``[d, d]``), read
    alone from the file (the others are not read), or None when the file has none. SAELens / sparsify folders:
    read through their own reader (the whole layer, once)."""
    if ts.sae_format is not None:  # read whole by its reader; a set without a skip needs no read for W_skip
        if name == "W_skip" and not ts.skip_bytes:
            return None
        whole: np.ndarray | None = load_layer(ts, layer)[name]
        return whole
    transposed = ts.gemma_scope_2 or ts.cross_layer  # both store the skip as x @ W
    key = {"W_skip": "affine_skip_connection"}.get(name, name) if ts.gemma_scope_2 else \
        f"{name}_{layer}" if ts.cross_layer else name
    with safe_open(str(ts.paths[layer]), framework="numpy") as f:
        if key not in f.keys():
            return None
        value: np.ndarray = f.get_tensor(key)
    return value.T if transposed and name == "W_skip" else value


def read_decoder(ts: TranscoderSet, layer: int, ids: Iterable[int]) -> np.ndarray:
    """Rows ``ids`` (sorted, distinct) of a cross-layer transcoder's ``W_dec_{layer}``: ``[k, L - layer, d]``
    (numpy), each run of consecutive ids one slice of the file."""
    import numpy as np

    rows = [int(i) for i in ids]
    with safe_open(str(ts.decoders[layer]), framework="numpy") as f:
        sl = f.get_slice(f"W_dec_{layer}")
        parts, start = [], 0
        for j in range(1, len(rows) + 1):
            if j == len(rows) or rows[j] != rows[j - 1] + 1:
                parts.append(sl[rows[start]:rows[j - 1] + 1])
                start = j
    if not parts:
        return np.zeros((0, ts.n_layers - layer, ts.d_model), dtype=np.float32)
    return np.concatenate(parts)
