"""`convert`: a GGUF file's dequantized weights, config and tokenizer written as a directory (the command's
options). FILE.gguf is the command's positional argument, ``--dtype`` the model option group's."""

from __future__ import annotations

from dataclasses import MISSING
from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option

COMMAND = "convert"


@dataclass(frozen=True)
class ConvertOptions(Declared):
    """``to``: the directory to write (required); ``overwrite``: write into it even where it has files."""

    to: Path = option(
        MISSING, "--to", metavar="DIR", show_default=False,
        help="The directory to write (created; it must not exist or be empty unless --overwrite).")
    overwrite: bool = option(
        False, "--overwrite", late=True,
        help="Write into DIR even where it has files (files of the same name are replaced).")
