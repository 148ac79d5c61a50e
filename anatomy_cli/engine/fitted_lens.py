"""Fitted lenses read from their own files: the Jacobian lens (jlens' ``.pt``) and the tuned lens (tuned-lens'
directory). Each maps a residual-stream reading to the last block's basis before anatomy's unembed (final norm +
LM head, :func:`anatomy_cli.engine.lens.unembed`).

Numbering (docs/commands/lens.md#fitted-lenses): anatomy's residual rows are ``embed`` (row 0) then block N's raw
output (row N + 1), which is transformers' ``hidden_states[N + 1]``.

- Jacobian lens: ``torch.save({"J": {N: Tensor[d_model, d_model]}, "n_prompts", "source_layers", "d_model"})``;
  ``J[N]`` maps block N's raw output to the last block's raw output: row N + 1 reads ``J[N] @ h``. Only the fitted
  blocks (and the last block, as it is) have a reading.
- Tuned lens: ``config.json`` + ``params.pt`` with translators ``i = 0 .. num_hidden_layers - 1``
  (``"{i}.weight"``, ``"{i}.bias"``), translator i applied residually, ``h + A_i h + b_i``, to
  ``hidden_states[i]``: translator 0 reads ``embed``, translator N + 1 block N's output; the last block's output
  has no translator (read as it is).

Every check against the model (width, block count) is made from the header (the config, or the pickle's tensor
shapes through a memory map) before any tensor's values are read.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

import torch

from anatomy_cli.errors import UsageError
from anatomy_cli.models.lens_choice import LensChoice


@dataclass(frozen=True)
class FittedLens:
    """A fitted lens checked against one model. ``rows``: the residual rows it reads (0 = ``embed``, N + 1 =
    block N), in stream order, the last block's row always (as it is); ``weights[row]``: ``(A, b)`` with
    ``A [d_model, d_model]`` and ``b [d_model]`` or None, the row read as ``h @ A.T (+ b)``, plus ``h`` itself
    when ``residual`` (the tuned lens). ``n_prompts``: a Jacobian lens's prompt count."""

    kind: str
    path: Path
    rows: tuple[int, ...]
    weights: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = field(repr=False)
    residual: bool = False
    n_prompts: int | None = None
    unembed_hash: str | None = None
    base_model: str | None = None

    @property
    def name(self) -> str:
        return f"{self.kind} lens"

    def transform(self, resid: torch.Tensor) -> torch.Tensor:
        """``resid [L + 1, pos, d_model]`` (all rows) -> ``[len(rows), pos, d_model]``: each of :attr:`rows`
        mapped into the last block's basis (float32 products on ``resid``'s device, returned in its dtype)."""
        out = []
        for row in self.rows:
            h = resid[row]
            if row not in self.weights:
                out.append(h)
                continue
            a, b = self.weights[row]
            x = h.float()
            y = x @ a.to(x.device, torch.float32).T
            if b is not None:
                y = y + b.to(x.device, torch.float32)
            out.append((x + y if self.residual else y).to(h.dtype))
        return torch.stack(out)

    def read_blocks(self, blocks: torch.Tensor) -> torch.Tensor:
        """``blocks [n_layers, d_model]``: each block's raw output at one position -> the same shape in the last
        block's basis; a block the lens was not fitted at is NaN (the ``embed`` row is not read here)."""
        full = torch.cat([torch.zeros_like(blocks[:1]), blocks])[:, None, :]  # rows 0 (embed) .. n_layers
        mapped = self.transform(full)[:, 0]
        out = torch.full_like(blocks, float("nan"))
        for i, row in enumerate(self.rows):
            if row >= 1:
                out[row - 1] = mapped[i]
        return out


def open_lens(choice: LensChoice, *, d_model: int, n_layers: int) -> FittedLens | None:
    """The lens ``choice`` names, checked against a model of ``d_model`` and ``n_layers`` blocks (None for the
    logit lens). Raises UsageError (one line) for a missing file, a file of another format, a fit checkpoint,
    another width or block count."""
    if choice.kind == "logit" or choice.path is None:
        return None
    if choice.kind == "jacobian":
        return _jacobian(choice.path, d_model, n_layers)
    return _tuned(choice.path, d_model, n_layers)


def _load(path: Path, what: str) -> Any:
    """``torch.load`` with ``weights_only`` and a memory map: the pickle is read, the tensors' data is not
    (until used)."""
    try:
        with open(path, "rb") as f:
            zipped = f.read(4) == b"PK\x03\x04"
    except FileNotFoundError:
        raise UsageError(f"--lens: {path} does not exist") from None
    except OSError as exc:
        raise UsageError(f"--lens: cannot read {path} ({exc.strerror or exc})") from None
    if not zipped:  # torch.save writes a zip archive; torch's own message for anything else speaks of mmap
        raise UsageError(f"--lens: {path} is not a {what} (not a file torch.save wrote)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # a legacy (non-zip) or foreign file
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"--lens: {path} is not a {what} ({first})") from None


def _jacobian(path: Path, d_model: int, n_layers: int) -> FittedLens:
    if path.is_dir():
        raise UsageError(f"--lens jacobian:{path} is a directory; a Jacobian lens is one .pt file "
                         "(a tuned lens directory is tuned:DIR)")
    state = _load(path, "Jacobian lens file")
    if not isinstance(state, dict) or "J" not in state:
        keys = ", ".join(sorted(map(str, state))) if isinstance(state, dict) else type(state).__name__
        hint = " (a fit checkpoint: finish the fit, or write the lens from it)" if isinstance(state, dict) and (
            "jacobian_sum" in state) else ""
        raise UsageError(f"--lens: {path} has no \"J\": not a Jacobian lens file{hint}; it holds {keys}")
    jac = state["J"]
    if not isinstance(jac, dict) or not jac:
        raise UsageError(f"--lens: {path}: \"J\" must map block numbers to [d_model, d_model] tensors")
    width = state.get("d_model")
    if width is not None and int(width) != d_model:
        raise UsageError(f"--lens: {path} was fitted for d_model {int(width)}; this model's is {d_model}")
    weights: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for key, tensor in jac.items():
        block = int(key)
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != (d_model, d_model):
            shape = list(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise UsageError(f"--lens: {path}: J[{block}] is {shape}; this model needs [{d_model}, {d_model}]")
        if not 0 <= block < n_layers:
            raise UsageError(f"--lens: {path} has J for block {block}; this model has blocks 0..{n_layers - 1}")
        weights[block + 1] = (tensor, None)
    rows = tuple(sorted(set(weights) | {n_layers}))
    weights.pop(n_layers, None)  # a J for the last block maps it onto itself: read it as it is
    n = state.get("n_prompts")
    return FittedLens("jacobian", path, rows, weights, n_prompts=None if n is None else int(n))


def _tuned(path: Path, d_model: int, n_layers: int) -> FittedLens:
    config_file, params_file = path / "config.json", path / "params.pt"
    if not path.is_dir():
        raise UsageError(f"--lens tuned:{path}: a tuned lens is a directory with config.json and params.pt")
    for f in (config_file, params_file):
        if not f.is_file():
            raise UsageError(f"--lens tuned:{path}: {f.name} is missing (a tuned lens has config.json and params.pt)")
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"--lens: {config_file} is not JSON ({exc})") from None
    if not isinstance(config, dict) or "d_model" not in config or "num_hidden_layers" not in config:
        raise UsageError(f"--lens: {config_file} has no d_model/num_hidden_layers: not a tuned-lens config")
    if config.get("lens_type", "linear_tuned_lens") != "linear_tuned_lens":
        raise UsageError(f"--lens: {config_file}: lens_type {config['lens_type']!r}; anatomy reads linear_tuned_lens")
    if int(config["d_model"]) != d_model or int(config["num_hidden_layers"]) != n_layers:
        raise UsageError(f"--lens: {path} is a tuned lens for a model of d_model {config['d_model']} and "
                         f"{config['num_hidden_layers']} layers; this model has d_model {d_model} and {n_layers}")
    state = _load(params_file, "tuned-lens params.pt")
    bias = bool(config.get("bias", True))
    weights: dict[int, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for i in range(n_layers):
        a = state.get(f"{i}.weight") if isinstance(state, dict) else None
        if not isinstance(a, torch.Tensor) or tuple(a.shape) != (d_model, d_model):
            raise UsageError(f"--lens: {params_file}: \"{i}.weight\" is missing or not [{d_model}, {d_model}]")
        b = state.get(f"{i}.bias") if bias else None
        if bias and (not isinstance(b, torch.Tensor) or tuple(b.shape) != (d_model,)):
            raise UsageError(f"--lens: {params_file}: \"{i}.bias\" is missing or not [{d_model}]")
        weights[i] = (a, b)
    return FittedLens("tuned", path, tuple(range(n_layers + 1)), weights, residual=True,
                      unembed_hash=config.get("unembed_hash"), base_model=config.get("base_model_name_or_path"))


def unembed_hash(weight: torch.Tensor) -> str:
    """tuned-lens' ``Unembed.unembedding_hash``: sha256 of numpy's ``array_str(W, precision=1)`` of the LM head's
    weight as float32 (numpy summarises a large matrix to its corners, so this reads a few numbers)."""
    import numpy as np

    array = weight.detach().to("cpu", torch.float32).numpy()
    return hashlib.sha256(str.encode(np.array_str(array, precision=1))).hexdigest()
