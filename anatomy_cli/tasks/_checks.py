"""The options checks that need no model, worded once (``--top takes a whole number of at least 1``)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.errors import UsageError
from anatomy_cli.text import targets

if TYPE_CHECKING:
    from anatomy_cli.tasks.protocol import Opened


def at_least(option: str, value: int | None, least: int = 1) -> None:
    """UsageError unless ``value`` (None: not given, fine) is a whole number ``>= least``."""
    if value is not None and value < least:
        raise UsageError(f"{option} takes a whole number of at least {least}")


def out_path(option: str, path: Path | str, *, folder: bool = False) -> Path:
    """``path`` (``~`` expanded) where a command will write its file (``folder``: its folder, made when missing):
    UsageError, before anything opens, unless the folder it goes in exists and can be written, and unless a file
    ``path`` is not a directory (a folder ``path`` not a file). The command's own checks (exists, ``--overwrite``)
    come after."""
    path = Path(path).expanduser()
    if folder and path.exists() and not path.is_dir():
        raise UsageError(f"{option} {path} is a file; give a folder")
    if not folder and path.is_dir():
        raise UsageError(f"{option} {path} is a directory; give the file to write")
    where = path if folder and path.is_dir() else path.parent
    if not where.is_dir():
        raise UsageError(f"{option} {path}: the folder {where} "
                         f"{'is not a folder' if where.exists() else 'does not exist'}")
    if not writable(where):
        raise UsageError(f"{option} {path}: no permission to write in {where}")
    return path


def writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (created and removed: ``os.access`` says yes to root even on
    read-only mounts)."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".anatomy-check-")
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


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
