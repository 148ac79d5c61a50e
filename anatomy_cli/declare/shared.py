"""Option fields several commands share, each declared once: ``target: str | None = target()`` in an options
dataclass. A factory, not a constant: each class gets its own ``dataclasses.field``. A group of options that
commands take together is one options class held whole (:class:`ShardRun`, ``run: ShardRun = shard_run()``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import TypedDict
from typing import TypeVar

from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option

_L = TypeVar("_L", tuple[str, ...], None)

MIN_ROWS = 8
"""The fewest rows a fit's batch has and an FVE is judged on (``engine.sae_fit.epoch_batches``'s
tail rule, ``analyses.sae.too_weak``, ``fit-sae --batch-size``'s least): a batch's loss is its FVU, its error over
the rows' variance around their own mean, which one row does not have and a handful do not measure."""


def target() -> str | None:
    return option(None, "--target", "-t", metavar="TEXT", show_default=False,
                  help="A token to follow: its probability and rank. TEXT must be exactly one token "
                  "(mind the leading space: ' much').")


def target_id() -> int | None:
    return option(None, "--target-id", metavar="N", min=0, show_default=False,
                  help="The target given by its token id instead of text.")


def foil() -> str | None:
    return option(None, "--foil", metavar="TEXT", show_default=False,
                  help="A second token: report logit(target) - logit(foil). One token, like --target.")


def foil_id() -> int | None:
    return option(None, "--foil-id", metavar="N", min=0, show_default=False,
                  help="The foil given by its token id instead of text.")


def first_token(*, foil: bool = False) -> bool:
    """``--first-token``; ``foil``: the wording of the commands that also take ``--foil``."""
    what = "A --target or --foil TEXT" if foil else "A --target TEXT"
    return option(False, "--first-token", help=f"{what} of several tokens stands for its first token (said on "
                  "stderr) instead of being an error.")


def batch_size(default: int = 8, help: str = "Prompts per forward pass when reading several from stdin.") -> int:
    """``--batch-size N`` (at least 1), shown after the model and prompt options."""
    return option(default, "--batch-size", min=1, late=True, help=help)


def estimate(help: str) -> bool:
    """``--estimate`` (circuit, features, fit-sae): the expected cost is the result, and the command stops there;
    ``help`` says what the cost counts and what the command still loads to tell it."""
    return option(False, "--estimate", help=help)


# --- decl-a
LENS_METAVAR = "logit|tuned:DIR|jacobian:FILE"


def lens(help: str) -> str:
    """``--lens`` (trace, lens): one lens, ``logit`` by default; checked by ``anatomy_cli.models.lens_choice``."""
    return option("logit", "--lens", metavar=LENS_METAVAR, help=help)


# --- decl-d
# The Ray options of the commands that run on Ray workers (corpus, fit-lens), in this order.
def ray(what: str) -> bool:
    """``--ray``; ``what``: what runs on the workers (``Run the shards``, ``jacobian: fit the prompts``)."""
    return option(False, "--ray", help=f"{what} on Ray workers: at --ray-address, else RAY_ADDRESS, else a local Ray "
                  "started for the run. Needs Ray (in a clone: pip install -e '.[ray]').")


def ray_address() -> str | None:
    return option(None, "--ray-address", metavar="ADDRESS", show_default=False,
                  help="The Ray cluster for --ray (ray://host:10001, auto).")


def workers() -> int:
    return option(2, "--workers", min=1, help="Ray workers (actors), one model each.")


def gpus_per_worker() -> float:
    return option(0.0, "--gpus-per-worker", min=0.0, help="GPUs per Ray worker.")


def lenses(default: _L, help: str) -> _L:
    """``--lens`` repeated (corpus, lens-eval): the lenses, each ``logit``, ``tuned:DIR`` or ``jacobian:FILE``."""
    return option(default, "--lens", metavar=LENS_METAVAR, show_default=False, cli=list[str] | None, help=help)


# --- the corpus' window options (corpus, features; fit-sae's --ctx), in this order. A command passes its own
# default window explicitly, to the field here and to ModelInfo.window (models/info.py), which applies it.
CORPUS_CTX = 512  # corpus' and features' default window: min(CORPUS_CTX, the model's context)


def ctx(default: int, first: str = "") -> int | None:
    """``--ctx`` (None: min(``default``, the model's context), as ``ModelInfo.window`` reads it); ``first``: what
    comes before that default, in words (features: the dictionary's context size)."""
    return option(None, "--ctx", min=2, show_default=False,
                  help=f"Tokens per window. Default: {first}min({default}, the model's context).")


def bos(default: str) -> bool | None:
    """``--bos/--no-bos``; ``default``: when a window starts with BOS by default, in words."""
    return option(None, "--bos/--no-bos", show_default=False,
                  help=f"Start each window with the BOS token. Default: {default}.")


def max_tokens() -> int | None:
    return option(None, "--max-tokens", min=2, show_default=False, help="Stop after this many tokens (default: all).")


def column() -> str:
    return option("text", "--column", help="The text column of a .jsonl/.csv/.parquet/datasets source.")


def features_dir() -> Sequence[str] | None:
    """``--features-dir DIR`` (repeatable): ``features --out`` folders, for labels, top tokens and dashboard links
    (models/feature_labels.py)."""
    return option(None, "--features-dir", metavar="DIR", show_default=False, cli=list[Path] | None,
                  help="A folder anatomy features --out wrote (repeatable): its explanations.json labels the "
                  "features (--labels wins; default: explanations.json beside the dictionary); where a feature has "
                  "no label, its top promoted tokens are shown as top tokens; DIR/features.html is linked.")


def labels(what: str) -> Path | str | None:
    """``--labels DIR|FILE`` of a command that reads one dictionary (sae, steer's --steer-feature): ``what`` the
    help says before the default."""
    return option(None, "--labels", metavar="DIR|FILE", show_default=False, cli=Path | None,
                  help=f"{what} Default: --features-dir's explanations.json, else explanations.json beside the SAE.")


def features_dirs(value: Sequence[str | Path] | None) -> tuple[str, ...]:
    """``--features-dir``'s value as a tuple of paths (None: none)."""
    return tuple(str(v) for v in value or ())


class OnRay(TypedDict):
    """Where a corpus pass runs on Ray (the runners' ``ray=``, :func:`anatomy_cli.corpus.ray_run.run_on_ray`'s
    keywords): the cluster (None: RAY_ADDRESS, else a local Ray), the workers and the GPUs each takes."""

    address: str | None
    workers: int
    gpus_per_worker: float


@dataclass(frozen=True)
class ShardRun(Declared):
    """How a corpus pass runs (``corpus``, ``features``): windows per shard and per forward pass, and the Ray
    options, in this order. A command holds it whole (``run: ShardRun = shared.shard_run()``); the front ends
    offer its options flat, at that field's place (``--ray``, ``ray=``)."""

    shard_windows: int = option(16, "--shard-windows", min=1, help="Windows per shard.")
    batch_size: int = option(4, "--batch-size", min=1, help="Windows per forward pass.")
    ray: bool = ray("Run the shards")
    ray_address: str | None = ray_address()
    workers: int = workers()
    gpus_per_worker: float = gpus_per_worker()

    def on_ray(self) -> OnRay | None:
        """The runners' ``ray=`` argument with ``--ray``, else None (in-process)."""
        if not self.ray:
            return None
        return OnRay(address=self.ray_address, workers=self.workers, gpus_per_worker=self.gpus_per_worker)


def shard_run() -> ShardRun:
    """A field holding a :class:`ShardRun` (its own instance per options object)."""
    return field(default_factory=ShardRun)
