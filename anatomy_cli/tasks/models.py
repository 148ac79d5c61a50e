"""`models`: the models on this machine, from their headers, and the default ``--model`` (the command's
options). The folders to search are the command's positional arguments."""

from __future__ import annotations

from dataclasses import dataclass

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option

COMMAND = "models"


@dataclass(frozen=True)
class ModelsOptions(Declared):
    """``hf_cache``: also list the Hugging Face cache; ``default``: store this model as every command's default
    instead of listing ('' or 'gpt2': back to the built-in one)."""

    hf_cache: bool = option(True, "--hf-cache/--no-hf-cache", help="Also list the Hugging Face cache.")
    default: str | None = option(
        None, "--default", metavar="NAME", show_default=False,
        help="Set the model every command uses when --model is not given (stored in the user config "
        "directory; $ANATOMY_MODEL overrides it). 'gpt2' or '' goes back to the built-in default.")
