"""The first phase of a load: a model's config, tokenizer and :class:`~anatomy_cli.models.info.ModelInfo`,
without any weight (and without torch where the files allow).

:func:`open_model` answers a :class:`~anatomy_cli.models.spec.ModelSpec` with an :class:`OpenedModel`;
:func:`anatomy_cli.engine.loading.load_weights` turns that into a :class:`~anatomy_cli.engine.model.LoadedModel`.
A command opens, encodes its prompts with ``opened.tokenizer`` and checks them against ``opened.info``, and
only then loads the weights, so a bad prompt or argument fails in a second, not after the load.

Where the files can be read exactly without transformers (a local directory whose tokenizer is its
``tokenizer.json`` unchanged, or a GPT-2 preset with ``--init random``: :mod:`anatomy_cli.models.light`), the
opened model is ``light``: config.json as JSON and the ``tokenizers`` library's tokenizer, no torch;
:func:`~anatomy_cli.engine.loading.load_weights` then reads transformers' own config and tokenizer (the same
ids: ``tests/test_preflight.py``). Everything else (GGUF files, Hub ids, SentencePiece tokenizers) is opened
through transformers.

Who opens and loads is a :class:`~anatomy_cli.engine.loader.Loader` (:mod:`anatomy_cli.engine.loader`).
No torch at import time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models import adapters
from anatomy_cli.models import adapters as _adapters
from anatomy_cli.models import gguf
from anatomy_cli.models import gguf_tokenizer
from anatomy_cli.models import light
from anatomy_cli.models.adapters import Adapter
from anatomy_cli.models.info import FromInfo
from anatomy_cli.models.info import ModelInfo
from anatomy_cli.models.json_config import JsonConfig
from anatomy_cli.models.model_files import load_tokenizer
from anatomy_cli.models.model_files import read_config
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.resolve import label
from anatomy_cli.models.resolve import resolve
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.text.fast import BackendTokenizer
from anatomy_cli.text.tokenization import Tokenizer

if TYPE_CHECKING:
    from transformers.configuration_utils import PreTrainedConfig

    from anatomy_cli.models.headers import GGUFHeader
    from anatomy_cli.models.resolve import Source


@dataclass(frozen=True)
class OpenedModel:
    """A model whose config and tokenizer are read and whose weights are not.

    ``info``: its shape and conventions; ``tokenizer``: the wrapped tokenizer prompts are encoded with;
    ``config``: transformers' config, or (``light``) config.json as a JsonConfig; ``source``: where it comes
    from (None: not resolved yet, ``light``); ``header``: a GGUF file's header, parsed once.
    """

    spec: ModelSpec
    info: ModelInfo
    tokenizer: Tokenizer = field(repr=False)
    config: PreTrainedConfig | JsonConfig = field(repr=False)
    source: Source | None = None
    header: GGUFHeader | None = field(default=None, repr=False)
    light: bool = False

    @property
    def name(self) -> str:
        return self.spec.model

    adapter = FromInfo[Adapter]()
    n_ctx = FromInfo[int | None]()


# ``**options``: ModelSpec's fields, passed on to it (its __post_init__ checks and converts them).
def as_spec(spec: ModelSpec | str, **options: Any) -> ModelSpec:
    """``spec`` itself, or ``ModelSpec(spec, **options)`` for a name. Raises TypeError for a ModelSpec with
    loading keywords beside it, UsageError for bad options."""
    if isinstance(spec, ModelSpec):
        if options:
            raise TypeError(f"a ModelSpec takes no loading keywords beside it; got {', '.join(options)}")
        return spec
    return ModelSpec(str(spec), **options)


def open_model(spec: ModelSpec | str, **options: Any) -> OpenedModel:
    """Open ``spec`` (a ModelSpec, or a name with the ModelSpec fields as keywords): light where the files
    allow, else through transformers (:func:`open_exact`). Raises what :func:`open_exact` raises."""
    spec = as_spec(spec, **options)
    return _open_light(spec) or open_exact(spec)


def _open_light(spec: ModelSpec) -> OpenedModel | None:
    found = light.read(spec.model, spec.init)  # a missing path: ModelNotFound, before anything heavy
    if found is None:
        return None
    config, backend, special = found
    try:
        causal = adapters.for_config(config).causal  # unsupported: the exact open says so
        tokenizer = Tokenizer(BackendTokenizer(backend, special), add_special_tokens=not causal)
        info = described(ModelInfo.from_config(config, tokenizer, random=spec.init == "random"), spec, None)
    except Exception:  # a size config.json leaves to transformers' defaults, an odd tokenizer: read exactly
        return None
    return OpenedModel(spec=spec, info=info, tokenizer=tokenizer, config=config, light=True)


def open_exact(spec: ModelSpec) -> OpenedModel:
    """Open through transformers: the config and tokenizer the weights are built with (imports torch).

    Raises ModelNotFound, OfflineError, CheckpointError (an unreadable config or GGUF header),
    UnsupportedArchitecture.
    """
    _quiet_transformers()
    source = resolve(spec.model, need="weights", init=spec.init)
    header = None
    if source.kind == "gguf":  # the one parse of the file: config and (cached) tokenizer from its header
        from anatomy_cli.engine.load_gguf import check_header

        header = check_header(source)
        config = gguf.read_config(header, source.spec)
        hf_tok = gguf_tokenizer.load(header, config, source.spec)
        add_bos = header.fields.get("tokenizer.ggml.add_bos_token")
    else:
        config = read_config(source, trust_remote_code=spec.trust_remote_code,
                             check_model_type=_adapters.for_model_type)
        hf_tok = load_tokenizer(source, trust_remote_code=spec.trust_remote_code)
        add_bos = None
    adapter = _adapters.for_config(config)
    # Encoders keep their [CLS]/[SEP]; decoders add only the BOS, as their convention says.
    tokenizer = Tokenizer(hf_tok, add_special_tokens=not adapter.causal, add_bos=add_bos)
    info = described(ModelInfo.from_config(config, tokenizer, random=spec.init == "random"), spec, source, header)
    return OpenedModel(spec=spec, info=info, tokenizer=tokenizer, config=config, source=source, header=header)


def described(info: ModelInfo, spec: ModelSpec, source: Source | None, header: GGUFHeader | None = None) -> ModelInfo:
    """``info`` with the facts decided here, once: its label (:func:`anatomy_cli.models.resolve.label`), the file
    or directory behind the spec, and a GGUF file's quantization label (none for ``--init random``)."""


    if source is None:
        source = check_path(spec.model)
    if source is None:
        return replace(info, label=spec.model)
    quant = gguf.quantization_label(header) if header is not None and spec.init != "random" else None
    return replace(info, label=label(source, header.fields if header is not None else None),
                   source=source.ref if source.kind in ("gguf", "dir") else None, quantization=quant)


def _quiet_transformers() -> None:
    # Warnings still reach stderr; info-level chatter does not.
    if not os.environ.get("TRANSFORMERS_VERBOSITY"):
        from transformers.utils import logging as hf_logging

        if hf_logging.get_verbosity() < hf_logging.WARNING:
            hf_logging.set_verbosity_warning()
