"""An SAE (or transcoder) on disk, read into numpy arrays: SAELens, EleutherAI sparsify and Gemma Scope.

* SAELens: ``cfg.json`` + ``sae_weights.safetensors`` (``W_enc [d_in, d_sae]``, ``b_enc``, ``W_dec
  [d_sae, d_in]``, ``b_dec``; JumpReLU ``threshold``, or ``log_threshold`` in older saves; TopK's ``k`` in the
  config). The config is SAELens 6's (``architecture``, ``metadata``: ``hook_name``, ``prepend_bos``,
  ``context_size``, ``neuronpedia_id``) or the flat one of older releases. A transcoder states
  ``hook_name_out`` and may carry ``W_skip``.
* sparsify: ``cfg.json`` + ``sae.safetensors`` per hook point (``encoder.weight [d_sae, d_in]``,
  ``encoder.bias``, ``W_dec [d_sae, d_out]``, ``b_dec``, transcoders' ``W_skip [d_out, d_in]``); TopK with
  the config's ``k``; the hook is the config's ``hook_name`` where it has one (fit-sae writes it: a renamed
  folder keeps its hook), else the folder's name (``layers.10``).
* Gemma Scope: ``params.npz`` (``W_enc``, ``W_dec``, ``b_enc``, ``b_dec``, ``threshold``): JumpReLU; the hook
  from the path (names.py ``gemma_scope_hooks``: ``layer_N`` under a ``-res``/``-mlp``/``-att``/``-transcoders``
  release).

``values=False`` reads the headers only (safetensors' header, the npz's member headers; models/sae/arrays.py):
every array is then a zero-strided stand-in of its shape, enough for the checks and a cost estimate.

Every failure is one line: a missing file or tensor, an unknown architecture, a truncated file, shapes
that disagree. No torch.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

import numpy as np

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sae import names
from anatomy_cli.models.sae.arrays import Array
from anatomy_cli.models.sae.arrays import npz_arrays
from anatomy_cli.models.sae.arrays import safetensors_arrays
from anatomy_cli.models.sites import Site

if TYPE_CHECKING:
    from anatomy_cli.models.info import ModelInfo

ARCHITECTURES = ("standard", "jumprelu", "topk")
NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm", "expected_average_only_in")
SAELENS_WEIGHTS, SPARSIFY_WEIGHTS, GEMMA_SCOPE = "sae_weights.safetensors", "sae.safetensors", "params.npz"


@dataclass(frozen=True)
class SAEFile:
    """What the files say. ``W_enc [d_in, d_sae]``, ``b_enc [d_sae]``, ``W_dec [d_sae, d_out]``, ``b_dec
    [d_out]`` (``d_out == d_in`` unless a transcoder), ``threshold [d_sae]`` (JumpReLU), ``k`` (TopK),
    ``W_skip [d_out, d_in]`` (a transcoder's skip connection). ``hook_name``/``hook_name_out``: as the
    library wrote them; ``site``/``site_out``: anatomy's hook points (equal unless a transcoder).
    ``subtract_b_dec``: ``b_dec`` is subtracted from the input before encoding (SAELens'
    ``apply_b_dec_to_input``; sparsify's SAEs, not its transcoders). ``stated_l0``: the L0 the files or
    the path state (TopK: k; Gemma Scope's ``average_l0_N``), else None."""

    path: Path
    format: str
    architecture: str
    W_enc: Array
    b_enc: Array
    W_dec: Array
    b_dec: Array
    threshold: Array | None
    k: int | None
    W_skip: Array | None
    hook_name: str
    hook_name_out: str
    site: str
    site_out: str
    subtract_b_dec: bool
    normalize_activations: str
    prepend_bos: bool | None
    context_size: int | None
    dtype: str
    neuronpedia_id: str | None
    model_name: str | None
    stated_l0: float | None
    centred: bool
    rescale_by_decoder_norm: bool = False
    skipped_positions: int = 0  # each window's first positions the fit left out of its rows (fit-sae writes it)

    @property
    def d_in(self) -> int:
        return int(self.W_enc.shape[0])

    @property
    def d_sae(self) -> int:
        return int(self.W_enc.shape[1])

    @property
    def d_out(self) -> int:
        return int(self.W_dec.shape[1])

    def check_fits(self, info: ModelInfo, name: str) -> None:
        """Raise UsageError unless the model ``info`` describes has the SAE's layers and its sites are ``d_in`` /
        ``d_out`` wide (the MLP's input is ``d_model`` wide), and, for a hook of ``ln2.hook_normalized``
        (:func:`names.before_gain`), its MLP reads a norm (:func:`names.mlp_norm`). Before any weight loads."""
        if names.before_gain(self.hook_name) or names.before_gain(self.hook_name_out):
            names.mlp_norm(info.adapter, name)
        for point, width, what in ((self.site, self.d_in, "d_in"), (self.site_out, self.d_out, "d_out")):
            layer = names.layer_of(point)
            if not 0 <= layer < info.n_layers:
                raise UsageError(f"the SAE reads {point} ({self.hook_name}), but {name} has {info.n_layers} layers")
            site_width = info.n_heads * info.d_head if point.endswith(Site.head.hook) else info.d_model
            if width != site_width:
                raise UsageError(f"the SAE's {what} is {width}, but {point} of {name} is {site_width} wide: "
                                 f"the SAE was trained on another model or site")

    @property
    def transcoder(self) -> bool:
        return self.site != self.site_out

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "format": self.format, "architecture": self.architecture,
                "d_in": self.d_in, "d_sae": self.d_sae, "d_out": self.d_out, "k": self.k,
                "hook_name": self.hook_name, "hook_name_out": self.hook_name_out, "site": self.site,
                "site_out": self.site_out, "transcoder": self.transcoder,
                "apply_b_dec_to_input": self.subtract_b_dec, "normalize_activations": self.normalize_activations,
                "prepend_bos": self.prepend_bos, "context_size": self.context_size, "dtype": self.dtype,
                "neuronpedia_id": self.neuronpedia_id, "model_name": self.model_name,
                "stated_l0": self.stated_l0}


def read(path: str | Path, *, hook: str | None = None, transcoder: bool = False, values: bool = True) -> SAEFile:
    """The SAE at ``path``: a folder (or a file in it) of one of the three formats, or a sparsify checkpoint
    folder holding one folder per hook point (``hook`` picks one; alone, it is taken; fit-sae's ``--layer all``
    folders too). ``hook`` also names the hook point where the files state none (Gemma Scope) or overrides what
    they state. ``transcoder``: the caller reads transcoders, so a Gemma Scope path naming no release is block
    N's MLP transcoder (names.py ``gemma_scope_hooks``). ``values``: False reads the headers only (the module
    docstring). Raises UsageError for a path that holds no SAE, CheckpointError for a file that cannot be read."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"no SAE at {p}: no such file or folder")
    folder = p.parent if p.is_file() else p
    if p.is_file() and p.name == GEMMA_SCOPE or (p.is_dir() and (p / GEMMA_SCOPE).is_file()):
        return _gemma_scope(folder / GEMMA_SCOPE, hook, transcoder, values)
    if (folder / SAELENS_WEIGHTS).is_file():
        return _saelens(folder, hook, values)
    if (folder / SPARSIFY_WEIGHTS).is_file():
        return _sparsify(folder, hook, values)
    points = _dictionaries(folder)
    if points:
        block = [name for name in points if hook is not None and name in (f"layers.{hook}", f"layers.{hook}.mlp")]
        hook = block[0] if len(block) == 1 else hook  # --hook N: block N's dictionary, as for a circuit-tracer set
        if hook is None and len(points) == 1 or hook in points:
            return read(folder / (hook if hook in points else points[0]), values=values)
        shown = ", ".join(points) if len(points) <= 4 else f"{points[0]}, {points[1]} ... {points[-1]}"
        given = "" if hook is None else f"--hook {hook} names none of them; "
        raise UsageError(f"{folder} holds {len(points)} dictionaries, one per hook point ({shown}): {given}pass one "
                         f"of them ({folder / points[0]}) or pick one with --hook NAME ({points[0]}) or a block N")
    kind = circuit_tracer_kind(folder)
    if kind is not None:
        raise UsageError(f"{folder} is circuit-tracer's {kind} (what circuit --transcoders reads): one dictionary is "
                         f"read here, a SAELens or sparsify folder or a Gemma Scope params.npz (features --hook N "
                         f"reads one block of it)")
    raise UsageError(f"no SAE at {p}: expected cfg.json with {SAELENS_WEIGHTS} (SAELens) or "
                     f"{SPARSIFY_WEIGHTS} (sparsify), or {GEMMA_SCOPE} (Gemma Scope)")


def _dictionaries(folder: Path) -> list[str]:
    """The subfolders of ``folder`` holding one SAELens or sparsify dictionary each (``fit-sae --layer all``'s
    ``layers.N.mlp``, a sparsify checkpoint's hook points), in natural order (``layers.2`` before ``layers.10``)."""
    if not folder.is_dir():
        return []
    found = [d.name for d in folder.iterdir() if d.is_dir() and ((d / SPARSIFY_WEIGHTS).is_file() or (
        (d / SAELENS_WEIGHTS).is_file() and (d / "cfg.json").is_file()))]
    return sorted(found, key=lambda name: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)])


def holds_dictionary(path: str | Path) -> bool:
    """True when ``path`` is what :func:`read` reads or names (one dictionary, a folder of them, a Gemma Scope
    file, a circuit-tracer set): checked by its file names only, nothing is read."""
    p = Path(path)
    folder = p.parent if p.is_file() else p
    weights = (GEMMA_SCOPE, SAELENS_WEIGHTS, SPARSIFY_WEIGHTS)
    return any((folder / w).is_file() for w in weights) or bool(_dictionaries(folder)) \
        or circuit_tracer_kind(folder) is not None


def first_hook(path: str | Path) -> str | None:
    """What ``--hook`` picks the first of a folder of dictionaries with (block N for ``layers.N`` /
    ``layers.N.mlp``, else the hook point's name), for a command offered on ``path``; None when ``path`` holds
    fewer than two (no ``--hook`` needed)."""
    points = _dictionaries(Path(path))
    if len(points) < 2:
        return None
    block = re.fullmatch(r"layers\.(\d+)(\.mlp)?", points[0])
    return block.group(1) if block else points[0]


def circuit_tracer_kind(folder: Path) -> str | None:
    """``transcoder_set`` / ``cross_layer_transcoder`` when ``folder`` holds circuit-tracer's config.yaml naming
    one, else None."""
    for name in ("config.yaml", "config.yml"):
        path = folder / name
        if path.is_file():
            found = re.search(r"^model_kind:\s*[\"']?(transcoder_set|cross_layer_transcoder)",
                              path.read_text(encoding="utf-8", errors="replace"), re.M)
            return found.group(1).replace("_", " ") if found else None
    return None


def _config(folder: Path) -> dict[str, Any]:
    cfg_path = folder / "cfg.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder} has no cfg.json beside its weights")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{cfg_path} is not a JSON config ({type(e).__name__}: {e})") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(f"{cfg_path} is not a JSON object")
    return cfg


def _tensor(tensors: dict[str, Array], name: str, path: Path) -> Array:
    if name not in tensors:
        raise CheckpointError(f"{path} has no tensor '{name}' (it holds {', '.join(sorted(tensors)) or 'none'})")
    return np.asarray(tensors[name])


def _architecture(value: object, where: Path) -> str:
    """SAELens' architecture name as anatomy's: transcoders (``transcoder``, ``skip_transcoder``,
    ``jumprelu_transcoder``) as the SAE they encode like."""
    arch = str(value).lower().replace("-", "_")
    arch = {"relu": "standard", "transcoder": "standard", "skip_transcoder": "standard",
            "jumprelu_transcoder": "jumprelu"}.get(arch, arch)
    if arch not in ARCHITECTURES:
        raise UsageError(f"{where}: unknown SAE architecture '{value}' (anatomy reads standard/ReLU, jumprelu, "
                         f"topk, batchtopk saved as jumprelu, and transcoder, skip_transcoder, jumprelu_transcoder)")
    return arch


def _saelens(folder: Path, hook: str | None, values: bool = True) -> SAEFile:
    cfg = _config(folder)
    meta: dict[str, Any] = cfg["metadata"] if isinstance(cfg.get("metadata"), dict) else {}

    def get(key: str, default: object = None) -> Any:
        return cfg[key] if key in cfg else meta.get(key, default)

    arch = _architecture(get("architecture", "standard"), folder / "cfg.json")
    path = folder / SAELENS_WEIGHTS
    tensors = safetensors_arrays(path, values)
    threshold = None
    if arch == "jumprelu":
        threshold = np.exp(_tensor(tensors, "log_threshold", path)) if "threshold" not in tensors \
            and "log_threshold" in tensors else _tensor(tensors, "threshold", path)
    k = get("k") if arch == "topk" else None
    if arch == "topk" and not isinstance(k, int):
        raise CheckpointError(f"{folder / 'cfg.json'}: a TopK SAE with no integer 'k'")
    hook_in = hook or get("hook_name")
    if not hook_in:
        raise UsageError(f"{folder / 'cfg.json'} states no hook_name: name the hook point with --hook NAME")
    hook_out = get("hook_name_out") or hook_in
    kwargs = get("model_from_pretrained_kwargs") or {}
    centred = bool(kwargs.get("center_writing_weights", False)) if isinstance(kwargs, dict) else False
    return _build(folder, "saelens", arch, tensors, path, threshold=threshold, k=k, hook_in=str(hook_in),
                  hook_out=str(hook_out), subtract=bool(get("apply_b_dec_to_input", False)),
                  normalize=str(get("normalize_activations") or "none"), prepend_bos=get("prepend_bos"),
                  context_size=context_size(get("context_size")), dtype=str(get("dtype", "float32")),
                  neuronpedia_id=get("neuronpedia_id"), model_name=get("model_name"),
                  stated_l0=_stated_l0(k, meta), centred=centred,
                  W_enc=_tensor(tensors, "W_enc", path), b_enc=_tensor(tensors, "b_enc", path),
                  rescale_by_decoder_norm=bool(get("rescale_acts_by_decoder_norm", False)),
                  skipped_positions=skipped_positions(get("skipped_positions")))


def _positive(value: object) -> int | None:
    """A config's count as the readers take it: a positive integer (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def skipped_positions(value: object) -> int:
    """A config's ``skipped_positions`` (each window's first positions fit-sae's rows left out); 0 where absent or
    not a positive integer (every other dictionary)."""
    return _positive(value) or 0


def context_size(value: object) -> int | None:
    """A config's ``context_size`` (SAELens' key: the windows' length it was trained on; fit-sae writes it for
    sparsify's and circuit-tracer's configs too); None where absent or not a positive integer (``0``, ``true``,
    ``"64"``, ``64.0``), for every reader: a warning past it and ``features``' default window read it."""
    return _positive(value)


def _stated_l0(k: object, meta: Mapping[str, object]) -> float | None:
    """TopK's k; a BatchTopK saved as JumpReLU: the k it trained with (``training_architecture_details``)."""
    details = meta.get("training_architecture_details")
    trained_k = details.get("k") if isinstance(details, dict) else None
    value = k if k is not None else trained_k
    return float(value) if isinstance(value, (int, float)) else None


def _sparsify(folder: Path, hook: str | None, values: bool = True) -> SAEFile:
    cfg = _config(folder)
    path = folder / SPARSIFY_WEIGHTS
    tensors = safetensors_arrays(path, values)
    k = cfg.get("k")
    if not isinstance(k, int):
        raise CheckpointError(f"{folder / 'cfg.json'}: a sparsify SAE with no integer 'k'")
    if cfg.get("activation", "topk") != "topk":
        raise UsageError(f"{folder / 'cfg.json'}: unknown SAE architecture '{cfg.get('activation')}' "
                         f"(anatomy reads sparsify's topk)")
    transcode = bool(cfg.get("transcode", False))
    hook_name = hook or (str(cfg["hook_name"]) if cfg.get("hook_name") else folder.name)  # fit-sae records it
    hook_in, hook_out = names.transcoder_hooks(hook_name) if transcode else (hook_name, hook_name)
    return _build(folder, "sparsify", "topk", tensors, path, threshold=None, k=k, hook_in=hook_in,
                  hook_out=hook_out, subtract=not transcode, normalize="none", prepend_bos=None,
                  context_size=context_size(cfg.get("context_size")),
                  dtype="float32", neuronpedia_id=None,
                  model_name=str(cfg["model_name"]) if cfg.get("model_name") else None, stated_l0=float(k),
                  centred=False, W_enc=_tensor(tensors, "encoder.weight", path).T,
                  b_enc=_tensor(tensors, "encoder.bias", path), sparsify_transcoder=transcode,
                  skipped_positions=skipped_positions(cfg.get("skipped_positions")))


def _gemma_scope(path: Path, hook: str | None, transcoder: bool = False, values: bool = True) -> SAEFile:
    tensors = npz_arrays(path, values)
    hooks = (hook, hook) if hook else names.gemma_scope_hooks(str(path.resolve()), transcoder=transcoder)
    if hooks is None:
        raise UsageError(f"{path}'s path names no layer and site (layer_N under a -res/-mlp/-att/-transcoders "
                         f"release): name the hook point with --hook NAME")
    return _build(path.parent, "gemma_scope", "jumprelu", tensors, path, threshold=_tensor(tensors, "threshold", path),
                  k=None, hook_in=hooks[0], hook_out=hooks[1], subtract=False, normalize="none",
                  prepend_bos=True, context_size=1024, dtype="float32", neuronpedia_id=None, model_name=None,
                  stated_l0=names.gemma_scope_l0(str(path.resolve())), centred=False,
                  W_enc=_tensor(tensors, "W_enc", path), b_enc=_tensor(tensors, "b_enc", path))


def _build(folder: Path, fmt: str, arch: str, tensors: dict[str, Array], path: Path, *, hook_in: str,
           hook_out: str, W_enc: Array, b_enc: Array, threshold: Array | None, k: int | None,
           sparsify_transcoder: bool = False, **rest: Any) -> SAEFile:
    W_dec, b_dec = _tensor(tensors, "W_dec", path), _tensor(tensors, "b_dec", path)
    skip = tensors.get("W_skip")
    transcoder = hook_out != hook_in or sparsify_transcoder
    site = names.hook_point(hook_in, transcoder_input=transcoder)
    site_out = names.hook_point(hook_out) if transcoder else site
    if sparsify_transcoder and site == site_out:
        raise UsageError(f"{folder}: a transcoder at '{hook_in}': anatomy reads transcoders of an MLP only, from its "
                         f"input (layers.N.mlp, blocks.N.mlp.hook_in or blocks.N.ln2.hook_normalized) to its output")
    if rest["normalize"] not in NORMALIZATIONS:
        raise UsageError(f"{folder}: unknown normalize_activations '{rest['normalize']}' "
                         f"(anatomy reads {', '.join(NORMALIZATIONS)})")
    _check_shapes(path, W_enc, b_enc, W_dec, b_dec, threshold, skip, k)
    return SAEFile(path=folder, format=fmt, architecture=arch, W_enc=W_enc, b_enc=b_enc, W_dec=W_dec, b_dec=b_dec,
                   threshold=threshold, k=k, W_skip=None if skip is None else np.asarray(skip),
                   hook_name=hook_in, hook_name_out=hook_out, site=site, site_out=site_out,
                   subtract_b_dec=rest.pop("subtract") and not transcoder,
                   normalize_activations=rest.pop("normalize"), **rest)


def _check_shapes(path: Path, W_enc: Array, b_enc: Array, W_dec: Array, b_dec: Array, threshold: Array | None,
                  skip: Array | None, k: int | None) -> None:
    if W_enc.ndim != 2 or W_dec.ndim != 2:
        raise CheckpointError(f"{path}: W_enc {W_enc.shape} and W_dec {W_dec.shape} must be matrices")
    d_in, d_sae = W_enc.shape
    d_out = W_dec.shape[1]
    wrong = [(name, tuple(t.shape), want) for name, t, want in
             (("b_enc", b_enc, (d_sae,)), ("W_dec", W_dec, (d_sae, d_out)), ("b_dec", b_dec, (d_out,)),
              ("threshold", threshold, (d_sae,)), ("W_skip", skip, (d_out, d_in))) if t is not None
             and tuple(t.shape) != want]
    if wrong:
        name, got, want = wrong[0]
        raise CheckpointError(f"{path}: {name} is {got}, expected {want} for d_in {d_in}, d_sae {d_sae}")
    if k is not None and not 0 < k <= d_sae:
        raise CheckpointError(f"{path}: k = {k} is outside 1..d_sae ({d_sae})")
