"""`tokens`: how a tokenizer splits text (the command's options). TEXT is the command's positional argument;
``--allow-special`` and ``--bos/--no-bos`` are the prompt option group's."""

from __future__ import annotations

from dataclasses import dataclass

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError

COMMAND = "tokens"


@dataclass(frozen=True)
class TokensOptions(Declared):
    """``encoding``: a tiktoken encoding (None: gpt2); ``model``: a model whose own tokenizer splits the text
    instead (loads transformers). One or the other."""

    encoding: str | None = option(
        None, "--encoding", "-e", show_default=False,
        help="tiktoken encoding: gpt2 (default), r50k_base, p50k_base, cl100k_base, o200k_base, ...")
    model: str | None = option(
        None, "--model", "-m", show_default=False,
        help="Use this model's tokenizer instead of tiktoken (a .gguf file, a local directory or a Hub id in "
        "the HF cache; loads transformers).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.model is not None and self.encoding is not None:
            raise UsageError("give either --encoding (tiktoken) or --model (Hugging Face tokenizer), not both")
