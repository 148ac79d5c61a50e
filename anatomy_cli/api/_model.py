"""The model and prompts an API function is given: :func:`load`, a LoadedModel / ModelSpec / name, prompts
encoded by the commands' own pipeline (:mod:`anatomy_cli.tasks.session`). No torch at import time."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING
from typing import Any
from typing import Union

from anatomy_cli.engine.loader import current_loader
from anatomy_cli.engine.opening import OpenedModel
from anatomy_cli.engine.opening import as_spec
from anatomy_cli.models.defaults import default_model
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.sink import STDERR
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.session import encode as session_encode
from anatomy_cli.tasks.session import load_weights
from anatomy_cli.tasks.session import texts_of as session_texts_of
from anatomy_cli.text import targets
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine.model import LoadedModel

Model = Union["LoadedModel", ModelSpec, str]

# What the tasks say (warnings, notes) reaches a notebook's stderr as it reaches the CLI's, unless a caller hands
# its own Notes with tasks.notes.using_notes (tests/test_api.py).
notes.set_default(STDERR)

__all__ = ["LoadedModel", "ModelSpec", "PromptOptions", "load"]


def __getattr__(name: str) -> Any:
    if name == "LoadedModel":  # torch: only when asked for
        from anatomy_cli.engine.model import LoadedModel

        return LoadedModel
    raise AttributeError(name)


def load(model: ModelSpec | str, **options: Any) -> LoadedModel:
    """The model ``model`` names (a preset, Hub id, directory, ``.gguf`` file, ``ollama:``/``lmstudio:`` name), or
    a ModelSpec; ``options`` are ModelSpec's fields (``device``, ``dtype``, ``init``, ``trust_remote_code``,
    ``device_map``, ``max_memory``, ``offload_folder``), as ``--device`` ... say. Opens, then loads the weights
    through the current loader as a command does (:func:`anatomy_cli.tasks.session.load_weights`: no transformers
    "Loading weights" bar, download bars only on a terminal, a status line on a terminal, the device map's
    placement said). Raises the engine's errors."""
    return weights(opened(as_spec(model, **options)))


def left_out() -> ModelSpec:
    """The spec of a model left out (``model=None``: the default model, models/defaults.py, as the CLI's without
    ``--model``), for a task that opens the model its dictionary records instead (tasks/recorded_model.py)."""
    return ModelSpec(default_model())


def loaded(model: Model) -> LoadedModel:
    """``model`` itself when it is loaded, else :func:`load` of it."""
    return weights(opened(model))


def opened(model: Model, before: Callable[[ModelSpec], None] | None = None) -> OpenedModel | LoadedModel:
    """The first phase, as a command's: ``model`` itself when it is loaded, else its config, tokenizer and
    ModelInfo (an OpenedModel, no weights) through the current loader: what a task's ``check`` reads, so that an
    API call refuses bad input before the weights load, as the command does. :func:`weights` then loads them.
    ``before``: called with the spec before it opens (a task's ``before_open``: what a GGUF file's header refuses,
    without the open's seconds, as the command refuses it)."""
    if isinstance(model, (ModelSpec, str)):
        spec = as_spec(model)
        if before is not None:
            before(spec)
        return current_loader().open(spec)
    return model


def weights(model: OpenedModel | LoadedModel) -> LoadedModel:
    """The second phase: ``model`` (what :func:`opened` returned) itself when it is loaded, else its weights
    (:func:`anatomy_cli.tasks.session.load_weights`)."""
    return load_weights(model) if isinstance(model, OpenedModel) else model


def encode(lm: OpenedModel | LoadedModel, texts: list[str], prompts: PromptOptions, **how: Any) -> list[Encoded]:
    """``texts`` tokenized and length-checked exactly as a command does (:func:`anatomy_cli.tasks.session.encode`;
    its warnings on stderr)."""
    return session_encode(lm, list(texts), prompts, **how)


def texts_of(prompt: str | list[str]) -> tuple[list[str], bool]:
    """``([prompt], True)`` for one text, ``(list, False)`` for several; UsageError for an empty text."""
    return session_texts_of(prompt)


def resolve_token(lm: LoadedModel, target: str | None, target_id: int | None, *, option: str = "--target",
                  first_token: bool = False) -> int | None:
    """The id of ``target`` (text) or ``target_id`` as the command's ``--target``/``--target-id`` resolve it."""
    wanted = targets.choice(target, target_id, option=option, first_token=first_token)
    if wanted is None:
        return None
    return targets.resolve(lm.tokenizer, wanted, model=lm.name, vocab_size=lm.info.lm_head_rows)
