"""A command registered from its record and its options dataclass: :func:`command`.

``@command("next", NextOptions)`` on a function whose ``opts`` parameter stands for the options: the record
(``anatomy_cli.declare.commands``) gives the name, and every field declared with
:func:`anatomy_cli.declare.fields.option` becomes a Typer option at ``opts``' place in the signature (a ``late``
one after the model and prompt option groups), with its flags, help, metavar and default. The function
receives one options object, built (and checked) by the options class itself. Typer checks no limit: the options
class does, and ``cli.app.show_limits`` puts the declared ``min``/``max`` on the click parameters so that
``--help`` shows them (``[default: 10; x>=1]``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import sys
import typing
from collections.abc import Callable
from typing import Annotated
from typing import Any
from typing import TypeVar
from typing import cast

import typer

from anatomy_cli.cli.app import DECLARED
from anatomy_cli.cli.app import app
from anatomy_cli.declare.commands import record
from anatomy_cli.declare.fields import Opt
from anatomy_cli.declare.fields import build
from anatomy_cli.declare.fields import every

F = TypeVar("F", bound=Callable[..., object])


# The option groups' parameters (cli/options.py): a late field goes after the last of them.
GROUP_PARAMS = {"model", "device", "dtype", "init", "trust_remote_code", "device_map", "max_memory",
                "offload_folder", "bos", "allow_special", "truncate", "chat"}


def _field_types(cls: type) -> dict[str, object]:
    hints: dict[str, object] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        space = {**vars(typing), **(vars(module) if module else {})}
        for name, text in getattr(klass, "__annotations__", {}).items():
            hints[name] = eval(text, space) if isinstance(text, str) else text  # our own annotations
    return hints


def default_of(f: dataclasses.Field[object]) -> object:
    """A field's default value (its factory called); ``inspect.Parameter.empty`` for a field without one: a
    required option (``convert --to``)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return inspect.Parameter.empty


def parameters(cls: type) -> list[tuple[inspect.Parameter, Opt]]:
    """One Typer parameter per option field of ``cls``, in declaration order (a nested options class's at its
    field's place: ``declare.fields.every``)."""
    out = []
    types: dict[type, dict[str, Any]] = {}
    for owner, f, o in every(cls):
        if owner not in types:
            types[owner] = _field_types(owner)
        kw: dict[str, Any] = dict(o.extra)
        if o.metavar is not None:
            kw["metavar"] = o.metavar
        info = typer.Option(*o.flags, help=o.help, show_default=o.show_default, case_sensitive=o.case_sensitive,
                            hidden=o.hidden, **kw)
        kind = o.cli if o.cli is not None else types[owner][f.name]
        out.append((inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default_of(f),
                                      annotation=Annotated[kind, info]), o))
    return out


def expand(fn: F, cls: type, param: str = "opts", command_name: str | None = None, inputs: tuple[str, ...] = (),
           before: dict[str, str] | None = None) -> F:
    """``fn`` with its ``param`` parameter replaced by the option fields of ``cls``; it receives ``cls(...)``.
    ``inputs``: parameters of ``fn`` (a positional argument) that are also fields of ``cls``, given to both;
    ``before``: ``{parameter of fn: option field}``, a parameter shown just before that field (generate's
    ``--plot`` before ``--target``)."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn, include_extras=True)
    if param not in sig.parameters:
        raise TypeError(f"{fn.__name__} has no parameter '{param}' for its options")
    made = parameters(cls)
    early = [p for p, o in made if not o.late]
    late = [p for p, o in made if o.late]
    kept = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in sig.parameters.values()]
    at = [p.name for p in kept].index(param)
    params = kept[:at] + early + kept[at + 1:]
    groups = [i for i, p in enumerate(params) if p.name in GROUP_PARAMS]
    cut = groups[-1] + 1 if groups else at + len(early)
    params = params[:cut] + late + params[cut:]
    for moved, field_name in (before or {}).items():
        one = next(p for p in params if p.name == moved)
        params.remove(one)
        params.insert([p.name for p in params].index(field_name), one)
    names = [p.name for p, _ in made]
    tuples = {f.name for _, f, _ in every(cls) if isinstance(default_of(f), tuple)}

    @functools.wraps(fn)
    def wrapper(*args: object, **kwargs: object) -> object:
        values = {n: kwargs.pop(n) for n in names if n in kwargs}
        for n in tuples & set(values):
            if isinstance(value := values[n], list):
                values[n] = tuple(value)
        values.update({n: kwargs[n] for n in inputs if n in kwargs})
        kwargs[param] = build(cls, values)
        return fn(*args, **kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    if command_name is not None:
        DECLARED[command_name] = {p.name: o for p, o in made}
    return cast(F, wrapper)


def command(name: str, options: type | None = None, *, param: str = "opts", inputs: tuple[str, ...] = (),
            before: dict[str, str] | None = None, **settings: Any) -> Callable[[F], F]:
    """Register the decorated function as the command of record ``name``; ``options``: its options dataclass,
    whose declared fields take the place of the ``param`` parameter (``inputs``, ``before``: :func:`expand`'s).
    ``settings``: ``app.command``'s own (``cls``, ``context_settings``)."""
    rec = record(name)

    def decorate(fn: F) -> F:
        registered = expand(fn, options, param, rec.name, inputs, before) if options is not None else fn
        return app.command(rec.name, **settings)(registered)

    return decorate
