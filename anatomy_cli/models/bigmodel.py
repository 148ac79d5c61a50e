"""Models larger than one device: the options of accelerate's big-model inference.

``--device-map auto|balanced|sequential``, ``--max-memory 0=20GiB,cpu=60GiB`` and
``--offload-folder DIR`` become the ``device_map``, ``max_memory`` and
``offload_folder`` keyword arguments of ``from_pretrained``, which hands them to
accelerate: it plans which module goes where (``infer_auto_device_map``), keeps the
weights of GPU and CPU modules resident, and reads disk-offloaded modules' weights
at every forward. See ``docs/big-models.md``.

Library layer: no typer, no printing; torch is imported inside functions.
"""

from __future__ import annotations

import re
from collections import defaultdict
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

DEVICE_MAPS = ("auto", "balanced", "sequential")

_DEVICE_RE = re.compile(r"^(\d+|cpu|mps|disk)$")


def parse_max_memory(text: str) -> dict[int | str, int]:
    """Parse ``"0=20GiB,cpu=60GiB"`` into accelerate's ``max_memory`` ({0: bytes, "cpu": bytes}).

    Devices: GPU indices, ``cpu``, ``mps``, ``disk``; sizes as accelerate reads them
    (``20GiB`` binary, ``20GB`` decimal, or plain bytes). Raises UsageError naming the bad part.
    """
    parts = []
    for part in text.split(","):  # the form first: accelerate (which imports torch) only for the sizes
        part = part.strip()
        if not part:
            continue
        device, sep, size = part.partition("=")
        device, size = device.strip().lower(), size.strip()
        if not sep or not _DEVICE_RE.match(device) or not size:
            raise UsageError(f"--max-memory: '{part}' is not DEVICE=SIZE (DEVICE: a GPU index, cpu, mps or disk; "
                             "e.g. 0=20GiB,cpu=60GiB)")
        if size.startswith("-"):
            raise UsageError(f"--max-memory: size for '{device}' must be positive")
        parts.append((device, size))
    if not parts:
        raise UsageError("--max-memory: give at least one DEVICE=SIZE (e.g. 0=20GiB,cpu=60GiB)")
    from accelerate.utils import convert_file_size_to_int

    out: dict[int | str, int] = {}
    for device, size in parts:
        try:
            n = int(size) if size.isdigit() else convert_file_size_to_int(size)
        except ValueError as exc:
            raise UsageError(f"--max-memory: '{size}' is not a size (e.g. 20GiB, 500MB)") from exc
        if n <= 0:
            raise UsageError(f"--max-memory: size for '{device}' must be positive")
        key: int | str = int(device) if device.isdigit() else device
        if key in out:
            raise UsageError(f"--max-memory: device '{device}' given twice")
        out[key] = n
    return out


def compress_names(names: list[str]) -> list[str]:
    """['h.0', 'h.1', 'h.2', 'ln_f'] -> ['h.0-2', 'ln_f'] (consecutive numbered siblings merged)."""
    out: list[str] = []
    run: tuple[str, int, int] | None = None

    def flush() -> None:
        if run:
            prefix, a, b = run
            out.append(f"{prefix}{a}" if a == b else f"{prefix}{a}-{b}")

    for name in names:
        m = re.match(r"^(.*\.)(\d+)$", name)
        if m and run and run[0] == m.group(1) and int(m.group(2)) == run[2] + 1:
            run = (run[0], run[1], int(m.group(2)))
            continue
        flush()
        run = None
        if m:
            run = (m.group(1), int(m.group(2)), int(m.group(2)))
        else:
            out.append(name)
    flush()
    return out


def placement_kwargs(device_map: str | Enum | dict[str, int | str] | None = None,
                     max_memory: str | dict[int | str, int] | None = None,
                     offload_folder: str | Path | None = None) -> dict[str, object]:
    """The validated ``from_pretrained`` keywords for a placement; ``{}`` without ``device_map``.

    ``device_map``: auto | balanced | sequential (an Enum's value is taken), or an explicit
    ``{module: device}`` dict passed through. ``max_memory``: the ``--max-memory`` text or an
    already parsed dict. Raises UsageError for an unknown device map, ``max_memory`` or
    ``offload_folder`` without a device map, bad ``--max-memory`` syntax, an offload folder
    that is a file; AnatomyError for a GPU index or ``mps`` this machine does not have.
    """
    if isinstance(device_map, Enum):
        device_map = device_map.value
    if device_map is None:
        given = [opt for opt, v in (("--max-memory", max_memory), ("--offload-folder", offload_folder))
                 if v is not None]
        if given:
            raise UsageError(f"{' and '.join(given)} need{'s' if len(given) == 1 else ''} --device-map "
                             f"({', '.join(DEVICE_MAPS)})")
        return {}
    if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
        raise UsageError(f"unknown --device-map '{device_map}'; use {', '.join(DEVICE_MAPS)}")
    out: dict[str, object] = {"device_map": device_map}
    if max_memory is not None:
        budget = parse_max_memory(max_memory) if isinstance(max_memory, str) else dict(max_memory)
        _check_devices(budget)
        out["max_memory"] = budget
    if offload_folder is not None:
        folder = Path(offload_folder).expanduser()
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"--offload-folder {offload_folder} is a file, not a directory")
        out["offload_folder"] = str(folder)
    return out


def _check_devices(budget: dict[int | str, int]) -> None:
    # accelerate only warns about a missing GPU and then fails deep inside dispatch.
    import torch

    gpus = sorted(k for k in budget if isinstance(k, int))
    count = torch.cuda.device_count()
    missing = [g for g in gpus if g >= count]
    if missing:
        have = f"{count} CUDA GPU{'s' if count > 1 else ''} (0..{count - 1})" if count else "no CUDA GPU"
        raise AnatomyError(f"--max-memory names GPU {', '.join(map(str, missing))} but this machine has {have}; "
                           f"budget cpu=SIZE (and disk) instead")
    if "mps" in budget and not torch.backends.mps.is_available():
        raise AnatomyError("--max-memory names mps but MPS is not available on this machine")


def device_summary(model: nn.Module, device_map: dict[str, int | str] | None = None) -> list[dict[str, Any]]:
    """Where ``device_map`` (default: the model's ``hf_device_map``) puts the weights, per device.

    Returns ``[{"device": "0" | "mps" | "cpu" | "disk", "modules": [names in model order,
    numbered runs merged, modules without parameters left out; "" is the whole model],
    "parameters": int, "bytes": int}]``, GPUs first, then mps, cpu, disk; bytes at the
    parameters' own dtype; tied weights count once; devices that hold no parameter are
    left out. Works on a meta model. A model without a device map (everything on one
    device) gives one entry for that device.
    """
    device_map = device_map or getattr(model, "hf_device_map", None)
    if not device_map:
        first = next(model.parameters()).device
        device_map = {"": (first.index or 0) if first.type == "cuda" else first.type}
    keys = sorted(device_map, key=len, reverse=True)
    params: dict[str, int] = defaultdict(int)
    size: dict[str, int] = defaultdict(int)
    holders: dict[str | None, None] = {}
    for name, p in model.named_parameters():
        owner = next((k for k in keys if k == "" or name == k or name.startswith(k + ".")), None)
        device = str(device_map[owner]) if owner is not None else "unplaced"
        params[device] += p.numel()
        size[device] += p.numel() * p.element_size()
        holders.setdefault(owner, None)
    order = list(dict.fromkeys(n for n, _ in model.named_modules(remove_duplicate=False)))
    rank = {n: i for i, n in enumerate(order)}
    return [{"device": d,
             "modules": compress_names(sorted((m for m in holders if m is not None and str(device_map[m]) == d),
                                              key=lambda m: rank.get(m, len(rank)))),
             "parameters": params[d], "bytes": size[d]}
            for d in sorted(params, key=_device_rank)]


def _device_rank(device: str) -> tuple[int, int]:
    if device.isdigit():
        return (0, int(device))
    return ({"mps": 1, "cpu": 2, "disk": 3}.get(device, 4), 0)
