"""Where accelerate would place a model's blocks for ``params --max-memory`` (on the meta model)."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import TYPE_CHECKING

from anatomy_cli.analyses.params.breakdown import Placement
from anatomy_cli.analyses.params.breakdown import memory_bytes
from anatomy_cli.models.bigmodel import compress_names

if TYPE_CHECKING:
    from transformers import PreTrainedModel
    from transformers.configuration_utils import PreTrainedConfig


def plan_placement(model: PreTrainedModel, max_memory: dict[int | str, int], dtype: str) -> Placement:
    """Where accelerate would put each block for ``max_memory`` at ``dtype``.

    Uses ``accelerate.utils.infer_auto_device_map`` with the model's
    ``_no_split_modules`` (and ``get_balanced_memory`` first when more than one GPU
    is given, as ``device_map="auto"`` does). GPU budgets are taken as given: no GPU
    needs to be present. Modules that fit nowhere go to ``disk``.
    """
    import torch
    from accelerate.utils import CustomDtype
    from accelerate.utils import get_balanced_memory
    from accelerate.utils import infer_auto_device_map

    torch_dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int8": torch.int8,
                   "int4": CustomDtype.INT4}[dtype]
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    budget = dict(max_memory)
    gpus = [k for k in budget if isinstance(k, int)]
    # accelerate warns that absent GPUs are "not available"; for an estimate that is expected.
    acc_logger = logging.getLogger("accelerate.utils.modeling")
    level = acc_logger.level
    acc_logger.setLevel(logging.ERROR)
    try:
        if len(gpus) > 1:
            budget = get_balanced_memory(model, max_memory=dict(budget), no_split_module_classes=no_split,
                                         dtype=torch_dtype, low_zero=False)
        device_map = infer_auto_device_map(model, max_memory=dict(budget), no_split_module_classes=no_split,
                                           dtype=torch_dtype)
    finally:
        acc_logger.setLevel(level)

    keys = sorted(device_map, key=len, reverse=True)
    counts: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        owner = next((k for k in keys if k == "" or name == k or name.startswith(k + ".")), None)
        device = str(device_map[owner]) if owner is not None else "unplaced"
        counts[device] += p.numel()
    order = [str(k) for k in max_memory] + ["disk"]
    devices = []
    for device in dict.fromkeys(order + list(counts)):
        modules = [m for m, d in device_map.items() if str(d) == device]
        if not modules and device not in counts:
            continue
        budget_key: int | str = int(device) if device.isdigit() else device
        # accelerate names the root module "": the whole model went to this one device.
        names = [m or "(whole model)" for m in compress_names(modules)]
        devices.append({"device": device, "modules": names, "parameters": counts.get(device, 0),
                        "memory_bytes": memory_bytes(counts.get(device, 0), dtype),
                        "budget_bytes": max_memory.get(budget_key)})
    return Placement(max_memory={str(k): v for k, v in max_memory.items()}, dtype=dtype, balanced=len(gpus) > 1,
                     device_map={k: str(v) for k, v in device_map.items()}, devices=tuple(devices))


def config_dtype(config: PreTrainedConfig) -> str:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(value).replace("torch.", "") if value is not None else ""
    return {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(name, "fp32")
