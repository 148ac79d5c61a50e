"""Option fields several commands share, each declared once: ``target: str | None = target()`` in an options
dataclass. A factory, not a constant: each class gets its own ``dataclasses.field``."""

from __future__ import annotations

from typing import Any

from anatomy_cli.declare.fields import option


def target() -> Any:
    return option(None, "--target", "-t", metavar="TEXT", show_default=False,
                  help="A token to follow: its probability and rank. TEXT must be exactly one token "
                  "(mind the leading space: ' much').")


def target_id() -> Any:
    return option(None, "--target-id", metavar="N", min=0, show_default=False,
                  help="The target given by its token id instead of text.")


def foil() -> Any:
    return option(None, "--foil", metavar="TEXT", show_default=False,
                  help="A second token: report logit(target) - logit(foil). One token, like --target.")


def foil_id() -> Any:
    return option(None, "--foil-id", metavar="N", min=0, show_default=False,
                  help="The foil given by its token id instead of text.")


def first_token(*, foil: bool = False) -> Any:
    """``--first-token``; ``foil``: the wording of the commands that also take ``--foil``."""
    what = "A --target or --foil TEXT" if foil else "A --target TEXT"
    return option(False, "--first-token", help=f"{what} of several tokens stands for its first token (said on "
                  "stderr) instead of being an error.")


def batch_size(default: int = 8, help: str = "Prompts per forward pass when reading several from stdin.") -> Any:
    """``--batch-size N`` (at least 1), shown after the model and prompt options."""
    return option(default, "--batch-size", min=1, late=True, help=help)


# --- decl-a
LENS_METAVAR = "logit|tuned:DIR|jacobian:FILE"


def lens(help: str) -> Any:
    """``--lens`` (trace, lens): one lens, ``logit`` by default; checked by ``anatomy_cli.models.lens_choice``."""
    return option("logit", "--lens", metavar=LENS_METAVAR, help=help)
