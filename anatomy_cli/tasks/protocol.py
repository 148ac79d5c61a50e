"""The shapes the task layer's callers rely on: a model session (:class:`Opened`) and a prompt task module
(:class:`PromptTask`, :class:`OptionsTask`). Types only: nothing here runs.

A task's ``check`` takes the model before or after its weights load (the CLI's :class:`OpenedModel`, the API's and
``anatomy serve``'s :class:`LoadedModel`): both have what a check reads, :class:`Opened`. A prompt task module
(``tasks/trace.py``, ``tasks/next_token.py``, ...) is ``COMMAND``, ``check(opened, opts[, encoded]) -> plan`` (every
refusal before the weights load) and ``run(lm, encoded, opts, plan)`` (one result per prompt); a module is one of
these protocols as it stands (mypy checks a module against a protocol).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from typing import Protocol
from typing import TypeVar

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.text.tokenization import Tokenizer

OptsT = TypeVar("OptsT", contravariant=True)
PlanT = TypeVar("PlanT")
ResultT = TypeVar("ResultT", covariant=True)


class Opened(Protocol):
    """A model a task's ``check`` reads: its :class:`ModelInfo` (capabilities, shape), its tokenizer (target
    tokens) and its name (messages). An ``OpenedModel`` (no weights) and a ``LoadedModel`` are both one."""

    @property
    def info(self) -> ModelInfo: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def name(self) -> str: ...


class OptionsTask(Protocol[OptsT, PlanT, ResultT]):
    """A prompt task whose ``check`` reads the model and the options (``next``, ``route``, ``circuit``)."""

    COMMAND: str

    def check(self, opened: Opened, opts: OptsT, /) -> PlanT: ...

    def run(self, lm: LoadedModel, encoded: list[Encoded], opts: OptsT, plan: PlanT, /) -> Sequence[ResultT]: ...


class PromptTask(Protocol[OptsT, PlanT, ResultT]):
    """A prompt task whose ``check`` reads the encoded prompts too (``trace``'s ``--position``, ``dla``,
    ``ablate``)."""

    COMMAND: str

    def check(self, opened: Opened, opts: OptsT, encoded: list[Encoded], /) -> PlanT: ...

    def run(self, lm: LoadedModel, encoded: list[Encoded], opts: OptsT, plan: PlanT, /) -> Sequence[ResultT]: ...
