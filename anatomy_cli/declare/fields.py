"""A command option declared once: a field of the command's options dataclass that carries its flags, help,
limits and how the CLI shows it (:func:`option`).

The Typer command (``cli/declared.py``) and the API function (``api/_declared.py``) are generated from these
fields, so a default, a limit or a choice is written in one place; :class:`Declared` checks the limits once, in
the options object both front ends build. Messages name an option by its first long flag (``--batch-size``);
the API rewrites them in its own words (:func:`api_words`: ``batch_size=``). Standard library only.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from dataclasses import field
from enum import Enum
from typing import Any

from anatomy_cli.errors import UsageError

KEY = "anatomy.option"


@dataclass(frozen=True)
class Opt:
    """How one field is offered on the command line.

    ``flags``: its spellings, the first long one shown (``("--top", "-k", "--k")``; a boolean pair as
    ``"--lens/--no-lens"``); ``help``; ``metavar``; ``min``/``max``: inclusive limits, checked by
    :class:`Declared` and shown as ``x>=1``; ``show_default``; ``case_sensitive`` (choices); ``late``: shown after
    the model and prompt option groups (the batch size); ``cli``: the CLI's annotation where it differs from the
    field's type (a list for a repeated option whose field is a tuple); ``hidden``; ``extra``: other
    ``typer.Option`` keywords (``file_okay``, ``dir_okay``, ``exists``, ``callback``).
    """

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    min: int | float | None = None
    max: int | float | None = None
    show_default: bool = True
    case_sensitive: bool = False
    late: bool = False
    cli: Any = None
    hidden: bool = False
    extra: tuple[tuple[str, Any], ...] = ()

    @property
    def flag(self) -> str:
        """The spelling messages use: the first long flag (``--top``; ``--lens`` of ``--lens/--no-lens``)."""
        first = next((f for f in self.flags if f.startswith("--")), self.flags[0])
        return first.split("/")[0]


def option(default: object = dataclasses.MISSING, *flags: str, help: str, default_factory: Any = dataclasses.MISSING,
           **how: Any) -> Any:
    """A dataclass field that is also a command-line option: ``k: int = option(10, "--top", "-k", min=1,
    metavar="N", help="...")``. ``how``: the other :class:`Opt` settings (``extra`` as a dict)."""
    extra = tuple(sorted(how.pop("extra", {}).items()))
    meta = {KEY: Opt(tuple(flags), help, extra=extra, **how)}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def declared(cls: type) -> list[tuple[dataclasses.Field[object], Opt]]:
    """The fields of options class ``cls`` that are options, in declaration order, each with its :class:`Opt`."""
    return [(f, f.metadata[KEY]) for f in dataclasses.fields(cls) if KEY in f.metadata]


def opt_of(cls: type, name: str) -> Opt:
    """The :class:`Opt` of field ``name`` of ``cls`` (KeyError when it is no option)."""
    return next(o for f, o in declared(cls) if f.name == name)


def flag(cls: type, name: str) -> str:
    """The flag that names field ``name`` of ``cls`` in messages (``--batch-size``)."""
    return opt_of(cls, name).flag


def _number(value: int | float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _bound(low: int | float | None, high: int | float | None) -> str:
    if low is not None and high is not None:
        return f"from {_number(low)} to {_number(high)}"
    if low is not None:
        return f"of at least {_number(low)}"
    return f"of at most {_number(high)}" if high is not None else ""


def check_limits(obj: object) -> None:
    """UsageError for the first option field of ``obj`` outside its declared ``min``/``max`` (None: not given; a
    list or tuple, a repeated option: each of its items)."""
    for f, o in declared(type(obj)):
        value = getattr(obj, f.name)
        if value is None or isinstance(value, bool) or (o.min is None and o.max is None):
            continue
        whole = "a whole number" if isinstance(o.min if o.min is not None else o.max, int) else "a number"
        for one in value if isinstance(value, (list, tuple)) else (value,):
            if o.min is not None and one < o.min or o.max is not None and one > o.max:
                raise UsageError(f"{o.flag} takes {whole} {_bound(o.min, o.max)}")


@dataclass(frozen=True)
class Declared:
    """Base of an options dataclass whose fields are declared with :func:`option`: ``__post_init__`` checks
    every declared limit (a subclass's own ``__post_init__`` calls ``super().__post_init__()`` first)."""

    def __post_init__(self) -> None:
        check_limits(self)


_FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:(=| )([A-Z][A-Z0-9_.|:\-]*)(?![a-z]))?")


def api_words(message: str, classes: tuple[type, ...], extra: dict[str, str] | None = None) -> str:
    """``message`` with each flag of ``classes``' option fields named as the API names it: ``--batch-size`` →
    ``batch_size=``, ``--target TEXT`` → ``target=TEXT``; ``extra``: more ``{flag: keyword}`` (the prompt
    options). Flags of no field are left as they are."""
    words = dict(extra or {})
    values: dict[str, set[str]] = {}
    for cls in classes:
        for f, o in declared(cls):
            for spelling in o.flags:
                for one in spelling.split("/"):
                    if one.startswith("--"):
                        words.setdefault(one, f.name)
                        values.setdefault(one, choices(cls, f.name))

    def rename(match: re.Match[str]) -> str:
        name = words.get(match.group(1))
        if name is None:
            return match.group(0)
        value = match.group(3)
        return f"{name}={value}" if value else f"{name}="

    def choice(match: re.Match[str]) -> str:  # a choice after its flag: --method attribution -> method='attribution'
        flag, value = match.group(1), match.group(2)
        if value in values.get(flag, ()):
            return f"{words[flag]}={value!r}"
        return match.group(0)

    return _FLAG.sub(rename, _CHOICE.sub(choice, message))


_CHOICE = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*) ([a-z][a-z0-9_-]*)\b")


def choices(cls: type, name: str) -> set[str]:
    """The values of field ``name`` of ``cls`` when its type names an Enum (``Method | None``), else empty."""
    text = next(f.type for f in dataclasses.fields(cls) if f.name == name)
    if not isinstance(text, str):
        text = getattr(text, "__name__", "")
    space = vars(sys.modules[cls.__module__])
    for word in re.findall(r"[A-Za-z_][A-Za-z_0-9]*", text):
        kind = space.get(word)
        if isinstance(kind, type) and issubclass(kind, Enum):
            return {str(m.value) for m in kind}
    return set()


# A field that holds a whole options class of its own (generate's ``sampling: SamplingOptions =
# field(default_factory=SamplingOptions)``): the front ends offer its option fields at the field's place and
# build it from them.


def holds(f: dataclasses.Field[object]) -> type | None:
    """The :class:`Declared` options class field ``f`` holds whole (its ``default_factory``), else None."""
    kind = f.default_factory
    if KEY in f.metadata or not isinstance(kind, type) or not issubclass(kind, Declared):
        return None
    return kind


def every(cls: type) -> list[tuple[type, dataclasses.Field[object], Opt]]:
    """Every option field of ``cls`` as ``(the class that declares it, field, Opt)``, in declaration order; those
    of a nested options class (:func:`holds`) at its field's place."""
    out: list[tuple[type, dataclasses.Field[object], Opt]] = []
    for f in dataclasses.fields(cls):
        kind = holds(f)
        if kind is not None:
            out += every(kind)
        elif KEY in f.metadata:
            out.append((cls, f, f.metadata[KEY]))
    names = [f.name for _, f, _ in out]
    if len(names) != len(set(names)):
        raise TypeError(f"{cls.__name__}: an option name given twice among its nested options")
    return out


def build(cls: type, values: dict[str, object]) -> Any:
    """``cls(...)`` from the flat ``values`` the front ends gather (one per option, as :func:`every` names them,
    and any other field of ``cls`` given by name): a nested options class built from its own first."""
    given: dict[str, object] = {}
    for f in dataclasses.fields(cls):
        kind = holds(f)
        if kind is not None:
            given[f.name] = build(kind, values)
        elif f.name in values:
            given[f.name] = values[f.name]
    return cls(**given)
