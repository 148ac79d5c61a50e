"""Where a model comes from: the one resolver behind ``params``, ``tokens`` and the engine.

No torch, no transformers: a path that does not exist fails before either is imported.

A spec is, in this order:

* ``ollama:NAME[:TAG]`` or ``lmstudio:PUBLISHER/REPO[/FILE.gguf]``: the GGUF file that tool keeps
  (:mod:`anatomy_cli.models.local`): kind ``gguf``;
* a ``.gguf`` file (any file that starts with the GGUF magic): kind ``gguf``;
* a local directory (``save_pretrained``; for a tokenizer, any directory): kind ``dir``;
* the short name of a GGUF file an installed Python package carries (``smollm2``, ``gemma3-270m``:
  :mod:`anatomy_cli.models.packaged`): kind ``gguf``;
* a path that does not exist (starts with ``.``, ``/``, ``~``, ends with ``/`` or ``.gguf``):
  :class:`ModelNotFound` at once;
* a built-in preset, when only its config is needed (``need="config"``) or with
  ``init="random"``, or for its tokenizer when the Hub's is neither cached nor reachable: kind ``preset``;
* a Hugging Face id (a preset's canonical id first, e.g. gpt2 -> openai-community/gpt2):
  from the local cache, else the Hub unless offline (``HF_HUB_OFFLINE``, or the Hub's
  name does not resolve): kind ``hub``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import ModelPathNotFound
from anatomy_cli.errors import OfflineError
from anatomy_cli.models import hub
from anatomy_cli.models import local
from anatomy_cli.models import packaged
from anatomy_cli.models import presets
from anatomy_cli.models.headers import GGUF_MAGIC
from anatomy_cli.models.headers import read_gguf

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "vocab.txt", "tokenizer.model",
                   "spiece.model")
NEEDS = ("weights", "config", "tokenizer")


@dataclass(frozen=True)
class Source:
    """A resolved model. ``kind``: ``preset`` | ``dir`` | ``gguf`` | ``hub``; ``ref``: the preset
    name, the directory, the .gguf file, or the repo id; ``local_only``: load from disk or the
    HF cache without contacting the Hub."""

    kind: str
    spec: str
    ref: str
    local_only: bool = True


def _kind_of_path(path: Path) -> str:
    with open(path, "rb") as f:
        return "gguf" if f.read(4) == GGUF_MAGIC else "file"


def _looks_like_path(spec: str) -> bool:
    return (spec.startswith((".", "/", "~")) or spec.endswith(("/", os.sep)) or "\\" in spec
            or spec.lower().endswith(".gguf") or spec.count("/") > 1)


def check_path(spec: str) -> Source | None:
    """The local answer for ``spec``, cheaply: a Source for an existing .gguf file or directory, or an
    Ollama / LM Studio model; None when ``spec`` is not a path (a preset or a Hub id). Imports nothing heavy.

    Raises ModelPathNotFound (a usage error, exit 2) for a path that does not exist, ModelNotFound for a file
    that is not GGUF, and
    CheckpointError for a ``.gguf`` file without the GGUF magic; the errors of
    :func:`anatomy_cli.models.local.resolve`.
    """
    if local.is_named(spec):  # ollama:NAME[:TAG], lmstudio:PUBLISHER/REPO: a GGUF file another tool keeps
        found = local.resolve(spec)
        if _kind_of_path(found) != "gguf":
            raise CheckpointError(f"{spec}: {found} is not a GGUF file (it does not start with 'GGUF')")
        return Source("gguf", spec, str(found))
    path = Path(spec).expanduser()
    if path.is_file():
        if _kind_of_path(path) == "gguf":
            return Source("gguf", spec, str(path))
        if path.suffix.lower() == ".gguf":
            raise CheckpointError(f"{spec}: not a GGUF file (it does not start with 'GGUF')")
        raise ModelNotFound(f"{spec} is a file; a model is a .gguf file, a directory written by "
                            f"save_pretrained, a preset or a Hugging Face id")
    if path.is_dir():
        return Source("dir", spec, str(path))
    if spec not in presets.PRESETS and (found_file := packaged.find(spec)) is not None:
        return Source("gguf", spec, str(found_file))
    if _looks_like_path(spec):
        what = "file" if spec.lower().endswith(".gguf") else "directory"
        raise ModelPathNotFound(f"no such {what}: {spec}")
    return None


def resolve(spec: str, *, need: str = "weights", init: str = "pretrained") -> Source:
    """Where ``spec`` comes from, for ``need`` = ``weights`` (a model), ``config`` (its
    config.json only: ``params``) or ``tokenizer`` (``tokens --model``). See the module docstring.

    Raises ModelNotFound (nothing matches; a gated repo), OfflineError (not cached and the Hub
    cannot be reached), CheckpointError (a directory without config.json; a corrupt .gguf).
    """
    spec = str(spec)
    local = check_path(spec)
    if local is not None:
        if local.kind == "dir" and need != "tokenizer" and not (Path(local.ref) / "config.json").is_file():
            ggufs = sorted(p.name for p in Path(local.ref).glob("*.gguf"))
            hint = f" (it holds {ggufs[0]}: pass that file)" if ggufs else ""
            raise CheckpointError(f"{spec} has no config.json; expected a directory written by save_pretrained{hint}")
        return local
    if spec in presets.PRESETS and (need == "config" or init == "random"):
        return Source("preset", spec, spec)
    if need == "tokenizer" and spec in presets.PRESETS:
        try:  # the real tokenizer when it is cached or reachable, else the preset's (GPT-2's ships with anatomy)
            return _hub(spec, need)
        except OfflineError:
            return Source("preset", spec, spec)
    if init == "random":
        raise ModelNotFound(f"--init random needs a built-in preset ({', '.join(presets.preset_names())}), "
                            f"a local directory or a .gguf file; got '{spec}'")
    return _hub(spec, need)


def offline_error(spec: str, need: str = "weights", option: str = "--model") -> OfflineError:
    """The error for ``spec`` not cached while the Hub cannot be reached, its message :func:`offline_message`'s."""
    return OfflineError(offline_message(spec, need, option), spec, need)


def offline_message(spec: str, need: str = "weights", option: str = "--model") -> str:
    """Why ``spec`` cannot be had offline and what to pass instead: ``option`` (``--model``, or ``--explainer``
    where that option named it) takes a path; ``--init random`` is offered for ``--model`` only."""
    if need == "tokenizer":
        return (f"no tokenizer for '{spec}' in the Hugging Face cache and the Hub cannot be reached (offline); "
                f"pass a local directory or a .gguf file")
    if need == "config":
        return (f"{spec} is not in the local Hugging Face cache and the Hub cannot be reached (HF_HUB_OFFLINE is "
                f"set, or the Hub's name does not resolve); pass a local directory or .gguf file, or a preset "
                f"({', '.join(presets.preset_names())})")
    random_hint = "try --init random" if spec in presets.PRESETS else \
        f"try a built-in preset with --init random ({', '.join(presets.preset_names())})"
    ways = f"fetch it once on a connected machine, or {random_hint}" if option == "--model" else \
        "or fetch it once on a connected machine"
    return (f"{spec} is not in the local Hugging Face cache and the Hub cannot be reached; pass {option} PATH "
            f"to a local checkpoint or .gguf file, {ways}")


def in_cache(repo: str, filename: str = "config.json") -> str | None:
    """The cached path of ``filename`` of ``repo`` in the local HF cache, else None."""
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo, filename)
    return found if isinstance(found, str) else None


def _hub(spec: str, need: str) -> Source:
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    candidates = []
    for repo in dict.fromkeys([presets.HUB_IDS.get(spec, spec), spec]):
        try:
            validate_repo_id(repo)
        except HFValidationError:
            continue
        candidates.append(repo)
    if not candidates:
        raise ModelNotFound(f"no model '{spec}': not a preset ({', '.join(presets.preset_names())}), "
                            f"not a local directory or .gguf file, and not a valid Hugging Face id")
    offline = hub.offline()
    wanted = {"weights": WEIGHT_FILES, "config": ("config.json",), "tokenizer": TOKENIZER_FILES}[need]
    for repo in candidates:
        if need == "tokenizer":
            if any(in_cache(repo, f) for f in wanted):
                return Source("hub", spec, repo, True)
            continue
        if in_cache(repo):
            if any(in_cache(repo, f) for f in wanted):
                return Source("hub", spec, repo, True)
            if offline:  # config cached, weights not
                raise offline_error(spec, need)
            return Source("hub", spec, repo, False)
    if offline:
        raise offline_error(spec, need)
    return _probe_hub(spec, candidates, need)


def _probe_hub(spec: str, candidates: list[str], need: str) -> Source:
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import GatedRepoError
    from huggingface_hub.errors import LocalEntryNotFoundError
    from huggingface_hub.errors import OfflineModeIsEnabled
    from huggingface_hub.errors import RepositoryNotFoundError
    from huggingface_hub.errors import RevisionNotFoundError

    probe = "tokenizer_config.json" if need == "tokenizer" else "config.json"
    for repo in candidates:
        try:
            hf_hub_download(repo, probe)
        except GatedRepoError:
            raise ModelNotFound(f"{repo} is gated on the Hugging Face Hub: accept its license on the Hub and "
                                f"log in (hf auth login)") from None
        except (RepositoryNotFoundError, RevisionNotFoundError):
            continue
        except (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError, TimeoutError):
            raise offline_error(spec, need) from None
        except OSError as exc:  # EntryNotFoundError: a repo without the file, or an HTTP error
            raise ModelNotFound(f"{repo} on the Hugging Face Hub is not a transformers checkpoint: "
                                f"{first_line(exc)}") from None
        return Source("hub", spec, repo, False)
    raise ModelNotFound(f"no model '{spec}': not a preset, not a local directory, and not on the Hugging Face "
                        f"Hub (tried {', '.join(candidates)})")


def config_path(source: Source) -> Path:
    """config.json of a ``dir`` or ``hub`` source (the cached file)."""
    if source.kind == "dir":
        return Path(source.ref) / "config.json"
    found = in_cache(source.ref)
    if found is None:  # resolve() fetched it; only a racing cache cleanup gets here
        raise CheckpointError(f"{source.ref}: config.json vanished from the Hugging Face cache")
    return Path(found)


def label(source: Source, fields: Mapping[str, object] | None = None) -> str:
    """The model's one short name, for headings, plot titles, pictures and messages (JSON keeps the spec as given).

    A file: its stem (``SmolLM2-135M-Instruct.Q4_1``), or its ``general.name`` (``fields``: its header's metadata,
    else the header is read) when the stem names nothing, as an Ollama blob's ``sha256-<hex>`` does; a directory:
    its own name; a preset or a Hub id: itself.
    """
    if source.kind == "gguf":
        stem = Path(source.ref).name.removesuffix(".gguf")
        if not _BLOB.fullmatch(stem):
            return stem
        if fields is None:

            try:
                fields = read_gguf(source.ref).fields
            except CheckpointError:
                fields = {}
        return str(fields.get("general.name") or "").strip() or stem
    if source.kind == "dir":
        return Path(source.ref).expanduser().resolve().name or source.spec
    return source.spec


_BLOB = re.compile(r"(sha256[-:])?[0-9a-fA-F]{32,}")


def recorded(spec: str) -> str:
    """``spec`` as a file written now names its model (the ``model_name`` of every dictionary ``fit-sae`` writes),
    so that :func:`resolve` finds the same model again from any working directory: a local file or directory as
    its absolute path; a packaged GGUF's short name (``smollm2``), an ``ollama:``/``lmstudio:`` name, a preset or
    a Hugging Face id as given. Not :func:`label`: ``SmolLM2-135M-Instruct.Q4_1`` names no model here."""
    path = Path(spec).expanduser()
    if not local.is_named(spec) and path.exists():
        return str(path.resolve())
    return spec


def short_name(spec: str) -> str:
    """:func:`label` of ``spec`` without loading anything: a local file's or directory's short name, else ``spec``."""
    source = check_path(spec)
    return label(source) if source is not None else spec


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextmanager
def checkpoint_errors(what: str) -> Iterator[None]:
    """Inside the block any error (a CheckpointError and MemoryError aside) is an unreadable checkpoint:
    ``CheckpointError(f"{what}: {its first line}")``, whatever library raised it."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as exc:
        if isinstance(exc, MemoryError):
            raise
        raise CheckpointError(f"{what}: {first_line(exc)}") from None
