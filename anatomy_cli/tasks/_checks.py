"""The options checks that need no model, worded once (``--top takes a whole number of at least 1``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.errors import UsageError
from anatomy_cli.text import targets

if TYPE_CHECKING:
    from anatomy_cli.tasks.protocol import Opened


def at_least(option: str, value: int | None, least: int = 1) -> None:
    """UsageError unless ``value`` (None: not given, fine) is a whole number ``>= least``."""
    if value is not None and value < least:
        raise UsageError(f"{option} takes a whole number of at least {least}")


class TargetFields:
    """What an options class with the fields ``target`` (TEXT), ``target_id`` and ``first_token`` (declared with
    :mod:`anatomy_cli.declare.shared`'s factories) can do with them: one token a command follows."""

    target: str | None
    target_id: int | None
    first_token: bool

    @property
    def wanted(self) -> targets.TokenChoice | None:
        """The token as given (checked: not both, not empty, not negative); None when none was given."""
        return targets.choice(self.target, self.target_id, first_token=self.first_token)

    def check_target(self) -> None:
        """UsageError for ``--first-token`` without a TEXT to apply it to."""
        targets.check_first_token(self.first_token, self.wanted)

    def target_id_in(self, opened: Opened) -> int | None:
        """The target's id in ``opened``'s tokenizer (an OpenedModel or LoadedModel), bounded by its LM head."""
        wanted = self.wanted
        return None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=opened.name,
                                                           vocab_size=opened.info.lm_head_rows)
