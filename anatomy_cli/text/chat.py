"""``--chat``: each prompt wrapped in the model's chat template, then tokenized (one rule for every command).

The prompt is one user message; the template adds the turn markers and the assistant's opening
(``add_generation_prompt=True``), as ``tokenizer.apply_chat_template`` does. The template's own special
tokens are read as tokens, and so is special-token text in the prompt (as ``apply_chat_template`` reads it);
the BOS token is the template's to add (``--bos`` still adds one where it has none). A GGUF file's template
is its ``tokenizer.chat_template`` metadata, which transformers' GGUF tokenizer carries.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from anatomy_cli.errors import UsageError
from anatomy_cli.text.options import PromptOptions
from anatomy_cli.text.tokenization import Encoded
from anatomy_cli.text.tokenization import Tokenizer

SOURCE = "chat template"  # Encoded.bos_source under --chat when --bos was not given


def render(hf: Any, texts: list[str], model: str) -> list[str]:
    """Each text as the chat template writes one user turn and the assistant's opening. Raises UsageError
    when the tokenizer has no template, or the template fails on the turn."""
    if not getattr(hf, "chat_template", None):
        raise UsageError(f"{model} has no chat template (its tokenizer carries none): drop --chat")
    try:
        return [hf.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
                for t in texts]
    except Exception as exc:  # a jinja error in the model's own template
        if isinstance(exc, (KeyboardInterrupt, MemoryError)):
            raise
        raise UsageError(f"{model}'s chat template fails on the prompt: {exc}") from None


def encode(tokenizer: Tokenizer, texts: list[str], options: PromptOptions, model: str) -> list[Encoded]:
    """``texts`` tokenized as ``options`` say (:meth:`~anatomy_cli.text.tokenization.Tokenizer.encode`),
    wrapped in the chat template first with ``options.chat``."""
    if not options.chat:
        return tokenizer.encode(texts, bos=options.bos, allow_special=options.allow_special)
    encoded = tokenizer.encode(render(tokenizer.hf, texts, model), bos=bool(options.bos), allow_special=True)
    if options.bos is None:
        encoded = [dataclasses.replace(e, bos_source=SOURCE) if e.bos_source else e for e in encoded]
    return encoded
