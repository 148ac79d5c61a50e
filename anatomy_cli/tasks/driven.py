"""What the prompt driver reads of a command's task module (the CLI's ``cli/driver.py``, the API's
``api/_driven.py``): a command whose record names a ``view`` is run from its task module and that view, with no
CLI or API function of its own. The task module declares, once:

* ``COMMAND``: the record's name; ``OPTIONS``: its options dataclass (a ``Declared``);
* ``HELP``: the command's ``--help`` text (a docstring: summary line, blank line, body, examples);
  ``API_HELP``: the API function's docstring (``help(anatomy.<function>)``);
* ``check(opened, opts[, encoded]) -> plan``: every refusal before the weights load (``encoded``, the prompts,
  for a check with three parameters); ``run(lm, encoded, opts, plan)``: one result per prompt;
* optionally a ``warned`` parameter of ``run``: the warnings said while the model opened and the texts were
  encoded (circuit's JSON ``warnings``);
* optionally ``carried(result)``: the object the API's ``Result`` carries where the task's result wraps it (dla's
  ``shown``); without it, the result itself;
* optionally ``TAKES``: its arguments and texts (:class:`~anatomy_cli.declare.inputs.Inputs`; without it
  :data:`~anatomy_cli.declare.inputs.PROMPTS`: one PROMPT), with ``texts(opts, **arguments) -> (opts, texts)``
  where the texts to tokenize are not just the prompts (patch's CLEAN and CORRUPT, drift's contexts, which also
  go into its options); ``run`` returns one result per prompt, or for ``TAKES.whole`` one result of all the
  texts, which the view gets with the list of encoded texts; ``units(encoded, results)``, where the results
  carry their own encoded text (heads: the random sequence when there is no prompt), pairs them otherwise.

No torch at import time; nothing from cli/ or output/.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare.inputs import PROMPTS
from anatomy_cli.declare.inputs import Inputs

if TYPE_CHECKING:
    from collections.abc import Sequence

    from anatomy_cli.declare.commands import Command
    from anatomy_cli.engine import Encoded
    from anatomy_cli.tasks.protocol import Opened


def task_of(rec: Command) -> ModuleType:
    """The task module of record ``rec`` (``anatomy_cli/tasks/<module>.py``)."""
    return importlib.import_module(f"anatomy_cli.tasks.{rec.module}")


def reads_prompts(task: ModuleType) -> bool:
    """True when the task's ``check`` reads the encoded prompts too (a third parameter)."""
    return len(inspect.signature(task.check).parameters) >= 3


def check(task: ModuleType, opened: Opened, opts: object, encoded: list[Encoded]) -> object:
    """``task.check``, with the encoded prompts where it reads them: the plan, or the refusal."""
    return task.check(opened, opts, encoded) if reads_prompts(task) else task.check(opened, opts)


def run(task: ModuleType, lm: Any, encoded: list[Encoded], opts: object, plan: object, warned: Sequence[str],
        **kwargs: object) -> Any:
    """``task.run``, given ``warned`` (what opening the model and encoding the texts warned of) where it takes a
    ``warned`` parameter (circuit: its JSON's ``warnings`` start with them)."""
    if "warned" in inspect.signature(task.run).parameters:
        kwargs["warned"] = tuple(warned)
    return task.run(lm, encoded, opts, plan, **kwargs)


def carried(task: ModuleType, result: object) -> object:
    """What the API's Result carries of one prompt's ``result`` (the task's ``carried`` hook, else ``result``)."""
    unwrap = getattr(task, "carried", None)
    return unwrap(result) if unwrap is not None else result


def takes(task: ModuleType) -> Inputs:
    """The task's arguments and texts (``TAKES``; one PROMPT without it)."""
    declared: Inputs = getattr(task, "TAKES", PROMPTS)
    return declared


def texts(task: ModuleType, opts: object, given: dict[str, Any]) -> tuple[object, list[str]]:
    """The options with their inputs and the texts to tokenize, from the arguments ``given`` (a prompts argument
    as its list of texts): the task's ``texts`` hook, else the prompts; its refusals before anything opens."""
    hook = getattr(task, "texts", None)
    if hook is not None:
        made: tuple[object, list[str]] = hook(opts, **given)
        return made
    return opts, [t for a in takes(task).arguments if a.prompts for t in given[a.name]]


def units(task: ModuleType, encoded: list[Encoded], results: Any) -> list[tuple[Any, object]]:
    """``(encoded, result)`` pairs, one per report: each prompt with its result; for ``TAKES.whole`` the list of
    texts with the one result; the task's ``units`` hook where its results carry their own."""
    hook = getattr(task, "units", None)
    if hook is not None:
        return list(hook(encoded, results))
    if takes(task).whole:
        return [(encoded, results)]
    return list(zip(encoded, results, strict=True))
