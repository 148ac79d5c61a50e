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
from anatomy_cli.declare.fields import build
from anatomy_cli.declare.fields import every
from anatomy_cli.errors import AnatomyError

F = TypeVar("F", bound=Callable[..., object])

# The prompt options' flags as the API names them: PromptOptions' fields (``prompts=PromptOptions(bos=True)``).
PROMPT_WORDS = {"--bos": "bos", "--no-bos": "bos", "--allow-special": "allow_special", "--truncate": "truncate",
                "--chat": "chat"}


def _default(f: dataclasses.Field[object]) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty  # a required keyword


def keywords(cls: type) -> list[inspect.Parameter]:
    """One keyword-only parameter per option field of ``cls``, in declaration order (a nested options class's at
    its field's place: ``declare.fields.every``)."""
    return [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=_default(f), annotation=f.type)
            for _, f, _ in every(cls)]


def in_api_words(exc: AnatomyError, classes: tuple[type, ...]) -> AnatomyError:
    """``exc`` with its message naming options as the API does."""
    if exc.args and isinstance(exc.args[0], str):
        exc.args = (api_words(exc.args[0], classes, PROMPT_WORDS), *exc.args[1:])
    return exc


def command(cls: type, param: str = "opts", inputs: tuple[str, ...] = ()) -> Callable[[F], F]:
    """Replace ``param`` of the decorated API function by ``cls``' option fields as keywords; the function
    receives ``cls(**those keywords)``. ``inputs``: parameters of the function (a positional one, fit_sae's
    ``corpus``) that are also fields of ``cls``, given to both."""
    made = keywords(cls)
    names = [p.name for p in made]
    required = [p.name for p in made if p.default is inspect.Parameter.empty]
    classes = tuple(dict.fromkeys([cls, *(owner for owner, _, _ in every(cls))]))

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        if param not in sig.parameters:
            raise TypeError(f"{fn.__name__} has no parameter '{param}' for its options")
        before = [p for p in sig.parameters.values() if p.name != param and p.kind is not p.KEYWORD_ONLY]
        after = [p for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
        before = [p for p in before if list(sig.parameters).index(p.name) < list(sig.parameters).index(param)]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            missing = [n for n in required if n not in kwargs]
            if missing:
                raise TypeError(f"{fn.__name__}() missing required keyword argument(s): {', '.join(missing)}")
            values = {n: kwargs.pop(n) for n in names if n in kwargs}
            if inputs:
                given = wrapper.__signature__.bind_partial(*args, **kwargs).arguments  # type: ignore[attr-defined]
                values.update({n: given[n] for n in inputs if n in given})
            try:
                kwargs[param] = build(cls, values)
                return fn(*args, **kwargs)
            except AnatomyError as exc:
                in_api_words(exc, classes)
                raise

        wrapper.__signature__ = sig.replace(parameters=[*before, *made, *after])  # type: ignore[attr-defined]
        return cast(F, wrapper)

    return decorate
