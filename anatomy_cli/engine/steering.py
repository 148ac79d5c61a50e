"""Steering vectors: the activations they are made from, the hooks that add them, and their file.

A :class:`SteeringVector` holds one direction ``[d_model]`` per layer at one site (``resid_post`` by default:
block l's output, where llama.cpp adds a control vector's ``direction.l``). :func:`site_activations` reads the
activations of a list of prompts at that site (the last position, or the mean over positions);
:meth:`SteeringVector.hooks` gives the :func:`~anatomy_cli.engine.hooks.attach` functions that add ``coef * v``
at every position of every forward.

The file is safetensors: one float32 tensor ``direction.{layer}`` per layer and, in the header's metadata under
``anatomy.steering``, a JSON object (``site``, ``layers``, ``norms``, ``method``, ``reduce``, the model's
identity ``model`` {``name``, ``model_type``, ``n_layers``, ``d_model``}, and the prompts). :func:`load` also
reads a llama.cpp control vector (``.gguf``, :mod:`anatomy_cli.engine.control_vector`). :func:`check` refuses
a vector that does not fit the model.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from anatomy_cli.engine.hooks import HookFn
from anatomy_cli.engine.model import LoadedModel
from anatomy_cli.engine.running import run
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.sites import WRITE_SITES
from anatomy_cli.models.sites import check_block
from anatomy_cli.models.sites import hook_name
from anatomy_cli.models.written import as_user_file
from anatomy_cli.text.tokenization import Encoded

METADATA_KEY = "anatomy.steering"


def site_activations(lm: LoadedModel, encoded: list[Encoded], layers: Sequence[int], site: str, *,
                     reduce: str = "last", batch_size: int = 8) -> torch.Tensor:
    """The activations of each prompt at ``site`` of each layer: ``[prompts, len(layers), d_model]`` float64 on
    the CPU. ``reduce`` ``"last"``: the last token's; ``"mean"``: the mean over the prompt's tokens."""
    names = [hook_name(layer, site) for layer in layers]
    positions = [[-1]] * len(encoded) if reduce == "last" else None
    caches = run(lm, encoded, names, positions=positions, batch_size=batch_size)
    return torch.stack([torch.stack([c[n].to("cpu", torch.float64).mean(0) for n in names]) for c in caches])


@dataclass
class SteeringVector:
    """``directions``: layer -> ``[d_model]`` float32; ``site``; ``meta``: the file's JSON (see the module)."""

    directions: dict[int, torch.Tensor]
    site: str = "resid_post"
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> list[int]:
        return sorted(self.directions)

    def norms(self) -> dict[int, float]:
        return {layer: float(self.directions[layer].double().norm()) for layer in self.layers}

    def hooks(self, coef: float) -> dict[str, HookFn]:
        """``{hook name: fn}`` adding ``coef * direction`` to the activation at every position (in the
        activation's dtype and device)."""
        def add(v: torch.Tensor) -> HookFn:
            return lambda t: t + coef * v.to(device=t.device, dtype=t.dtype)
        return {hook_name(layer, self.site): add(self.directions[layer]) for layer in self.layers}


def model_identity(lm: LoadedModel) -> dict[str, Any]:
    """What a vector file records about the model it was made on."""
    return {"name": lm.display, "model_type": lm.info.model_type, "n_layers": lm.n_layers,
            "d_model": lm.d_model}


def save(vector: SteeringVector, path: Path) -> None:
    """Write ``vector`` as safetensors with its JSON metadata (module docstring). Raises AnatomyError when the
    file cannot be written."""
    from safetensors.torch import save_file

    meta = {**vector.meta, "site": vector.site, "layers": vector.layers,
            "norms": {str(k): v for k, v in vector.norms().items()}}
    tensors = {f"direction.{layer}": vector.directions[layer].float().contiguous().cpu() for layer in vector.layers}
    try:
        save_file(tensors, str(path), metadata={METADATA_KEY: json.dumps(meta)})
        as_user_file(path)
    except OSError as e:
        raise AnatomyError(f"cannot write {path}: {e.strerror or e}") from None


def load(path: Path) -> SteeringVector:
    """Read a vector file: anatomy's safetensors, or a llama.cpp control vector (``.gguf``, ``direction.N`` ->
    block N's ``resid_post``; a ``direction.0`` is refused, as llama.cpp refuses it). Raises UsageError for a
    missing or unreadable file, or one without directions."""
    if not path.is_file():
        raise UsageError(f"steering vector file {path} does not exist")
    if path.suffix.lower() == ".gguf":
        from anatomy_cli.engine.control_vector import read

        arrays, hint = read(path)
        if 0 in arrays:  # llama.cpp itself refuses such a file, and `steer --save-control-vector` never writes one
            raise UsageError(f"{path} has a direction.0: llama.cpp has no control vector for layer 0 (its "
                             f"directions start at 1), so the file is not one llama.cpp would apply")
        return SteeringVector({k: torch.from_numpy(v) for k, v in arrays.items()}, site="resid_post",
                              meta={"model": {"model_type": hint} if hint else {}, "source": "gguf"})

    try:
        with safe_open(str(path), framework="pt") as f:
            raw = (f.metadata() or {}).get(METADATA_KEY)
            directions = {int(k.split(".", 1)[1]): f.get_tensor(k) for k in f.keys() if k.startswith("direction.")}
    except Exception as e:  # safetensors raises its own error types for a file that is not safetensors
        raise UsageError(f"{path} is not a steering vector file (safetensors): {str(e).splitlines()[0]}") from None
    if not directions:
        raise UsageError(f"{path} has no direction.N tensors: not a steering vector file")
    try:
        meta = json.loads(raw) if raw else {}
    except json.JSONDecodeError:
        raise UsageError(f"{path}: its {METADATA_KEY} metadata is not JSON") from None
    return SteeringVector(directions={k: v.float() for k, v in directions.items()},
                          site=str(meta.get("site", "resid_post")), meta=meta)


def check(vector: SteeringVector, info: ModelInfo, name: str, source: str) -> list[str]:
    """Refuse (UsageError) a vector that does not fit the model ``info`` describes (``name``: its spec): another
    d_model, a layer past the model, a NaN or infinite value, a site the model has no hook point for, or a file
    made for another model type. Returns warnings (made on a model with another name, a direction of zeros)."""
    display = info.label or name
    sites = [s.value for s in WRITE_SITES]
    if vector.site not in sites:
        raise UsageError(f"{source}: unknown site {vector.site!r} (one of {', '.join(sites)})")
    made = vector.meta.get("model") or {}
    hint = made.get("model_type")
    if hint and hint != info.model_type:
        raise UsageError(f"{source} was made for a {hint} model ({made.get('name', '?')}), "
                         f"not {display} ({info.model_type})")
    for layer, v in sorted(vector.directions.items()):
        if v.dim() != 1 or v.shape[0] != info.d_model:
            raise UsageError(f"{source}: direction.{layer} has shape {tuple(v.shape)}; "
                             f"{display} has d_model {info.d_model}")
        check_block(layer, info.n_layers, f"{source}: layer", negative=False)
        if not bool(torch.isfinite(v).all()):
            raise UsageError(f"{source}: direction.{layer} has NaN or infinite values")
    if vector.site == "resid_mid" and not info.has_resid_mid:
        raise UsageError(f"{source}: site resid_mid, but {display} has parallel attention and MLP")
    warnings = [f"{source}: direction.{layer} is all zeros: it steers nothing"
                for layer, v in sorted(vector.directions.items()) if not bool(v.any())]
    made_on = made.get("name")
    if made_on and made_on != display:
        warnings.insert(0, f"{source} was made on {made_on}; applying it to {display} (same type and width)")
    return warnings
