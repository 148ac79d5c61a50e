"""An API function whose keywords are the command's declared options: :func:`command`.

``@command(NextOptions)`` on ``def next_token(model, prompt, opts, *, prompts=PromptOptions())``: the ``opts``
parameter is replaced by one keyword per option field (its name, annotation and default come from the field,
so they are the CLI's), the function receives the options object, and ``help(anatomy.next_token)`` and IDEs
show the real signature. Every AnatomyError raised inside names options as the API does (``batch_size=``, not
``--batch-size``: :func:`anatomy_cli.declare.fields.api_words`). No torch at import time; nothing from cli/.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from typing import Any
from typing import TypeVar
from typing import cast

from anatomy_cli.declare.fields import api_words
from anatomy_cli.declare.fields import declared
from anatomy_cli.errors import AnatomyError

F = TypeVar("F", bound=Callable[..., Any])

# The prompt options' flags as the API names them: PromptOptions' fields (``prompts=PromptOptions(bos=True)``).
PROMPT_WORDS = {"--bos": "bos", "--no-bos": "bos", "--allow-special": "allow_special", "--truncate": "truncate",
                "--chat": "chat"}


def _default(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory()  # type: ignore[misc]


def keywords(cls: type) -> list[inspect.Parameter]:
    """One keyword-only parameter per option field of ``cls``, in declaration order."""
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f), annotation=f.type)
            for f, _ in declared(cls)]


def in_api_words(exc: AnatomyError, classes: tuple[type, ...]) -> AnatomyError:
    """``exc`` with its message naming options as the API does."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (api_words(exc.args[0], classes, PROMPT_WORDS), *exc.args[1:])
    return exc


def command(cls: type, param: str = "opts") -> Callable[[F], F]:
    """Replace ``param`` of the decorated API function by ``cls``' option fields as keywords; the function
    receives ``cls(**those keywords)``."""
    made = keywords(cls)
    names = [p.name for p in made]

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        if param not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no parameter '{param}' for its options")
        before = [p for p in sig.parameters.values() if p.name != param and p.kind is not p.KEYWORD_ONLY]
        after = [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
        before = [p for p in before if list(sig.parameters).index(p.name) < list(sig.parameters).index(param)]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            values = {n: kwargs.pop(n) for n in names if n in kwargs}
            try:
                kwargs[param] = cls(**values)
                return fn(*args, **kwargs)
            except AnatomyError as exc:
                in_api_words(exc, (cls,))
                raise

        wrapper.__signature__ = sig.replace(parameters=[*before, *made, *after])  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate
