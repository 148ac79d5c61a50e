"""What a prompt-driven command reads besides its options, declared once in its task module (``TAKES``): its
arguments and how its texts are tokenized (:class:`Inputs`; ``Inputs.fields()`` gives the parity test's
``INPUTS``). The CLI's ``cli/driver.py`` makes each
:class:`Arg` a positional argument (or, with ``flags``, an option shown before the declared ones: drift's
``--context``), the API's ``api/_driven.py`` a positional parameter of the function, in the same order, under the
same name. A task without ``TAKES`` reads :data:`PROMPTS`: one PROMPT, one result per prompt. Standard library
only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIRED = ...  # an argument with no default


@dataclass(frozen=True)
class Arg:
    """One input of a command.

    ``name``: the parameter's name on both sides; ``metavar`` and ``help``: how ``--help`` shows it; ``api``: the
    API's annotation, as text (``"str | list[str]"``); ``cli``: the CLI's type (``Optional[list[str]]`` for a
    repeated option); ``default``: :data:`REQUIRED` or the value both sides take when it is left out; ``flags``:
    an option's spellings (empty: a positional argument); ``prompts``: one prompt or several (the CLI's ``-``
    reads one per stdin line, the API takes a list): the task receives the list of texts, ``[]`` when an optional
    one is left out."""

    name: str
    metavar: str
    help: str
    api: str = "str"
    cli: Any = str
    default: Any = REQUIRED
    flags: tuple[str, ...] = ()
    prompts: bool = False


@dataclass(frozen=True)
class Inputs:
    """A command's arguments, in order, and its texts: ``what`` names them in messages (``"context"``);
    ``truncate``: ``--truncate`` is offered (and a too-long text's message suggests it); ``whole``: one result of
    all the texts together (patch's pair, drift's contexts), which the view reports once, instead of one result
    per prompt."""

    arguments: tuple[Arg, ...]
    what: str = "prompt"
    truncate: bool = True
    whole: bool = False

    def fields(self) -> dict[str, str | None]:
        """``{argument: the option that reads it on the command line, without dashes (None: positional)}``: the
        task's ``INPUTS``, the options-class fields that are inputs, not options (tests/test_task_parity.py)."""
        return {a.name: a.flags[0].lstrip("-") if a.flags else None for a in self.arguments}

    @property
    def many(self) -> bool:
        """True when an argument reads one prompt or several: the result is one per prompt, a list for a list."""
        return any(a.prompts for a in self.arguments)


PROMPT = Arg("prompt", "PROMPT", "The prompt text, or '-' to read one prompt per non-empty line of stdin.",
             api="str | list[str]", prompts=True)
PROMPTS = Inputs((PROMPT,))
