"""Prompt-level usage errors before torch is imported.

A command's checks (:func:`anatomy_cli.cli.commands._common.load_texts`' ``before_weights``: prompt
lengths, ``--position``, target tokens, ``--layer``) need only the tokenizer and the config, yet
transformers' classes for both import torch, which costs seconds. :func:`before_torch` runs the same
checks first on what :mod:`anatomy_cli.models.light` reads without torch (config.json as JSON, tokenizer.json
through the ``tokenizers`` library): a usage error (exit 2) then comes before any slow import. Everything
else (a source it cannot read, any other error) is left to the full load, which runs the checks again
with transformers' own tokenizer; stderr notes of this first pass are dropped, the second pass prints them.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable
from contextlib import redirect_stderr
from typing import Any

from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec


def before_torch(spec: ModelSpec, before_weights: Callable[[Any, Any], None]) -> None:
    """Run ``before_weights(tokenizer, config)`` without torch when the model's files allow it.

    Does nothing once torch is imported (in the server, or a test process: nothing to save). Raises
    what ``before_weights`` raises if it is a UsageError; swallows everything else.
    """
    if "torch" in sys.modules:
        return
    try:
        from anatomy_cli.models import adapters, light
        from anatomy_cli.text.fast import BackendTokenizer
        from anatomy_cli.text.tokenization import Tokenizer

        found = light.read(spec.model, str(getattr(spec.init, "value", spec.init)))
        if found is None:
            return
        config, backend, special = found
        adapter = adapters.for_config(config)  # an unsupported architecture: the full load says so first
        tokenizer = Tokenizer(BackendTokenizer(backend, special), add_special_tokens=not adapter.causal)
    except Exception:
        return
    try:
        with redirect_stderr(io.StringIO()):
            before_weights(tokenizer, config)
    except UsageError:
        raise
    except Exception:
        return
