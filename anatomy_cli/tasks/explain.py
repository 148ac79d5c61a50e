"""`explain`: explanations of a `features` run's features, written by a chat model and scored (the task).

:class:`ExplainOptions` holds the features directory and every option; :func:`read_dir` checks the directory and
reads what the run wrote (the contexts, the statistics, delphi's latent cache), before any model is opened;
:mod:`anatomy_cli.tasks._explain_run` runs the models. See docs/commands/explain.md.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.tasks import _explain_data as _data
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._explain_data import FeatureExamples

COMMAND = "explain"
INPUTS = {"features_dir": None}
EXPORT = "explanations.json"  # the Neuronpedia explanations export, a JSON list (models/sae/labels.py reads it)
RUN = "explain-run.json"  # the settings the export was made with (a rerun of other settings is refused)
NEEDED = ("manifest.json", "features.parquet", "contexts.parquet")


@dataclass(frozen=True)
class ExplainOptions(Declared):
    """``features_dir``: what ``anatomy features --out DIR`` wrote; ``explainer``: the chat model that writes the
    explanations; ``scorer``: the one that scores them (default: the explainer); the rest as their flags say."""

    features_dir: Path | str
    explainer: str = option(dataclasses.MISSING, "--explainer", metavar="MODEL", show_default=False,
                            help="The chat model that writes the explanations: a preset, a Hugging Face id, a "
                            "directory or a .gguf file, as --model takes it. It needs a chat template.")
    scorer: str | None = option(None, "--scorer", metavar="MODEL", show_default=False,
                                help="The chat model that scores them (delphi's detection and fuzzing). Default: "
                                "the explainer.")
    max_features: int | None = option(None, "--max-features", min=1, metavar="N", show_default=False,
                                      help="Explain only the first N features that fire (by id). Default: all.")
    examples: int = option(10, "--examples", min=1, metavar="N",
                           help="Top-activating contexts shown to the explainer per feature.")
    test: int = option(10, "--test", min=1, metavar="N",
                       help="Held-out activating contexts per scorer (the sampled ones; drawn with --seed).")
    non_activating: int = option(10, "--non-activating", min=1, metavar="N",
                                 help="Random contexts where the feature does not fire, per scorer.")
    shown: int = option(5, "--shown", min=1, metavar="N",
                        help="Contexts per scorer prompt (delphi's num_examples_per_scorer_prompt).")
    max_new_tokens: int = option(100, "--max-new-tokens", min=1, metavar="N",
                                 help="Tokens the explainer may write per explanation.")
    temperature: float = option(0.0, "--temperature", min=0.0, metavar="T",
                                help="The explainer's sampling temperature (0: greedy, as delphi's default).")
    seed: int = option(42, "--seed", metavar="N",
                       help="The seed of the drawn contexts, the scorer's shuffle (delphi's 42) and the sampling.")
    delphi: Path | None = option(None, "--delphi", metavar="DIR", show_default=False, extra={"file_okay": False},
                                 help="delphi's latent cache that features --delphi wrote (where the non-activating "
                                 "contexts are checked). Default: the one inside FEATURES_DIR.")
    out: Path | None = option(None, "--out", metavar="DIR", show_default=False, extra={"file_okay": False},
                              help=f"Write {EXPORT} here. Default: FEATURES_DIR. Running again resumes.")
    overwrite: bool = option(False, "--overwrite", help=f"Replace an {EXPORT} made with other settings.")

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "features_dir", Path(self.features_dir))
        for name in ("out", "delphi"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    @property
    def target(self) -> Path:
        return Path(self.out) if self.out is not None else Path(self.features_dir)

    def settings(self) -> dict[str, Any]:
        """What the export depends on: a rerun with other values is refused (``--overwrite``)."""
        return {"explainer": self.explainer, "scorer": self.scorer or self.explainer, "examples": self.examples,
                "test": self.test, "non_activating": self.non_activating, "shown": self.shown,
                "max_new_tokens": self.max_new_tokens, "max_features": self.max_features,
                "temperature": self.temperature, "seed": self.seed,
                "features_dir": str(Path(self.features_dir).resolve())}


@dataclass(frozen=True)
class FeaturesDir:
    """What :func:`read_dir` found: the subject model, the dictionary's ``layer`` id for the export, its hook,
    and the examples of each feature to explain."""

    path: Path
    model: str
    layer: str
    hook: str
    features: tuple[FeatureExamples, ...]
    skipped: tuple[int, ...]  # dead features, or ones without contexts


def read_dir(opts: ExplainOptions) -> FeaturesDir:
    """Check FEATURES_DIR and read it (UsageError for a directory that is no `features --out` output or has no
    latent cache); no model is opened."""
    root = Path(opts.features_dir)
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory: explain reads what {_data.making(root)} writes (run it first)")
    missing = [n for n in NEEDED if not (root / n).is_file()]
    if missing:
        unfinished = "manifest.json" not in missing and _data.unfinished(root)
        why = "an unfinished features run (the same features command again finishes it; it resumes)" if unfinished \
            else _data.not_features(root)
        raise UsageError(f"{root} is {why}: no {', '.join(missing)} in it")
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        settings = manifest["settings"]
        model = str(manifest["model"]["model"])
    except (OSError, ValueError, KeyError, TypeError) as e:  # there, but corrupt: as a corrupt model file (exit 1)
        raise CheckpointError(f"{root}/manifest.json is not a features run's manifest ({type(e).__name__}: "
                              f"{e})") from None
    cache = _data.find_cache(root, opts.delphi)
    hook, active = _data.read_cache(cache)
    layer = _layer_id(settings, hook)
    rows, contexts = _data.read_tables(root)
    features, skipped = _data.examples(rows, contexts, active, opts)
    return FeaturesDir(root, model, layer, hook, features, skipped)


def read_export(root: Path, hook: str, features: list[int] | tuple[int, ...]) -> list[dict[str, Any]] | None:
    """The records of ``root/explanations.json`` when they explain this dictionary's features (each record's
    ``hook`` is ``hook`` and its ``index`` one of ``features``: a features run of other settings left a stale
    export, which is skipped with a warning); None where there is none."""

    path = Path(root) / EXPORT
    if not path.is_file():
        return None
    try:
        records = json.loads(path.read_text(encoding="utf-8"))
        ours = set(features)
        fits = isinstance(records, list) and all(r.get("hook") == hook and int(r["index"]) in ours for r in records)
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        fits = False
    if not fits:
        notes.warn(f"{path} does not explain these features (another run's): the page shows no explanations")
        return None
    return list(records)


def _layer_id(settings: dict[str, Any], hook: str) -> str:
    """The export's ``layer``: the dictionary's Neuronpedia SAE id where its files state one (``6-res-jb``), else
    ``<block>-<folder name>`` (the block first, as circuit --labels reads it)."""
    from anatomy_cli.models.ct_block import read_dictionary as read

    sae_id, site = None, hook
    try:
        header = read(Path(settings["sae"]), hook=settings.get("hook"), values=False)
        site = header.site
        sae_id = header.neuronpedia_id.partition("/")[2] if header.neuronpedia_id else None
    except (AnatomyError, KeyError, OSError):
        pass  # the dictionary moved: its hook from the cache's folder name
    if sae_id:
        return sae_id
    try:
        block = str(sites.block_of(site))
    except ValueError:
        block = "0"
    return f"{block}-{Path(str(settings.get('sae', 'dictionary'))).name}"
