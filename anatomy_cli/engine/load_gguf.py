"""Loading a GGUF file's weights (llama.cpp) through transformers' own GGUF support.

``from_pretrained(folder, gguf_file=name)`` reads the config, the tokenizer
(:mod:`anatomy_cli.models.model_files`, as for every source) and the weights from the one file;
the weights are dequantized (by the ``gguf`` package) to the dtype asked for. Before any of
that, the header (:func:`anatomy_cli.models.headers.read_gguf`) is checked so that each failure is
one line: a truncated or corrupt file, an architecture transformers
cannot read from GGUF (the message names those it can), a tensor type ``gguf`` cannot
dequantize.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anatomy_cli.errors import CheckpointError, UnsupportedArchitecture
from anatomy_cli.models.headers import GGUFHeader, read_gguf
from anatomy_cli.models.resolve import Source, first_line


def readable_architectures() -> list[str]:
    """GGUF ``general.architecture`` values transformers can turn into a config."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(GGUF_SUPPORTED_ARCHITECTURES)


def _dequantizable(dtype: str) -> bool:
    import numpy as np
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, dequantize

    kind = GGMLQuantizationType[dtype]
    _, type_size = GGML_QUANT_SIZES[kind]
    try:
        dequantize(np.zeros((1, type_size), dtype=np.uint8), kind)
    except NotImplementedError:
        return False
    return True


def check_header(source: Source) -> GGUFHeader:
    """The header of ``source`` (a ``gguf`` Source), checked for what loading needs.

    Raises CheckpointError (truncated, corrupt, a tensor type gguf cannot dequantize),
    UnsupportedArchitecture (transformers cannot read the architecture from GGUF).
    """
    header = read_gguf(source.ref)
    arch = header.architecture
    readable = readable_architectures()
    if not arch:
        raise CheckpointError(f"{source.spec}: the GGUF header has no general.architecture")
    if arch not in readable and arch.replace("moe", "_moe") not in readable and arch.replace("-", "_") not in readable:
        raise UnsupportedArchitecture(f"{source.spec}: GGUF architecture '{arch}' cannot be read by transformers; "
                                      f"it reads {', '.join(readable)}")
    for dtype in dict.fromkeys(t.dtype for t in header.tensors):
        if not _dequantizable(dtype):
            import gguf.quants

            names = ["F32", "F16"] + sorted(t.name for t in gguf.quants._type_traits)
            raise CheckpointError(f"{source.spec}: tensor type {dtype} cannot be dequantized by the gguf package "
                                  f"(it dequantizes {', '.join(names)})")
    return header


def _where(source: Source) -> tuple[str, str]:
    path = Path(source.ref).resolve()
    return str(path.parent), path.name


def load_weights(source: Source, config: Any, cls: Any, dtype: Any, placement: dict[str, Any]) -> Any:
    """The model, its weights dequantized to ``dtype``."""
    import functools
    import logging
    import sys

    import transformers.modeling_gguf_pytorch_utils as gguf_utils

    folder, name = _where(source)
    bar = gguf_utils.tqdm
    if not sys.stderr.isatty():  # as for transformers' own progress bars: none in a pipeline or a log
        gguf_utils.tqdm = functools.partial(bar, disable=True)
    # Its advice for --dtype bf16/fp16 ("pass dtype=torch.float32 ...") names an API the user never sees.
    quantizer_log = logging.getLogger("transformers.quantizers.quantizer_gguf")
    level = quantizer_log.level
    quantizer_log.setLevel(logging.ERROR)
    # Always dequantized: the hooks and the analyses read dense weights, and the heading says so. Without
    # this, transformers keeps the blocks packed wherever a GGUF matmul kernel (`kernels`) is installed.
    from transformers import GgufConfig

    try:
        return cls.from_pretrained(folder, gguf_file=name, config=config, dtype=dtype, local_files_only=True,
                                   quantization_config=GgufConfig(dequantize=True), **placement)
    except Exception as exc:
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        raise CheckpointError(f"{source.spec}: cannot load the GGUF weights: {first_line(exc)}") from None
    finally:
        gguf_utils.tqdm = bar
        quantizer_log.setLevel(level)
