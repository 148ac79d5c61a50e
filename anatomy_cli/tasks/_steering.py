"""`generate`'s steering options: a vector file (``--steer``) or an SAE feature (``--steer-feature``/``--sae``),
and the coefficient(s) ``--coef``; the vector read and checked against the opened model before weights load."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models.feature_labels import dictionary_labels
from anatomy_cli.tasks import notes

if TYPE_CHECKING:
    from anatomy_cli.engine.steering import SteeringVector
    from anatomy_cli.tasks.protocol import Opened

Coef = str | float | Sequence[float] | None


def parse_coefs(coef: Coef) -> list[float]:
    """``--coef`` as floats: the text ``"-8,-4,0,4,8"``, a number or a list (default ``[1]``). Raises UsageError
    for a malformed or non-finite coefficient."""
    if coef is None:
        return [1.0]
    if isinstance(coef, str):
        text = coef
    else:
        given: Sequence[float] = coef if isinstance(coef, (list, tuple)) else [float(coef)]  # type: ignore[arg-type]
        text = ",".join(repr(float(c)) for c in given)
    parts = [x.strip() for x in text.split(",")]
    try:
        coefs = [float(x) for x in parts]
    except ValueError:
        raise UsageError(f"--coef takes a number or a comma-separated list (-8,-4,0,4,8), got {text!r}") from None
    if not all(math.isfinite(c) for c in coefs):
        raise UsageError(f"--coef takes finite numbers, got {text!r}")
    return coefs


@dataclass(frozen=True)
class SteeringOptions(Declared):
    """``steer``: a vector file (``anatomy steer --out`` or a llama.cpp control vector); ``steer_feature`` with
    ``sae``: an SAE feature's decoder row instead; ``coef``: the coefficient or a sweep (text, number, list);
    ``labels`` / ``features_dir``: where the feature's label comes from (models/feature_labels.py)."""

    steer: Path | str | None = option(
        None, "--steer", metavar="FILE", show_default=False, cli=Path | None,
        help="Add a steering vector (`anatomy steer --out`, or a llama.cpp control vector .gguf) at every position.")
    coef: Coef = option(None, "--coef", metavar="C[,C...]", show_default=False, cli=str | None,
                        help="With --steer: the coefficient (default 1), or a comma-separated sweep such as "
                        "-8,-4,0,4,8.")
    steer_feature: int | None = option(
        None, "--steer-feature", metavar="ID", min=0, show_default=False,
        help="Add C times this SAE feature's decoder row (--sae PATH) at the SAE's hook point.")
    sae: Path | str | None = option(None, "--sae", metavar="PATH", show_default=False, cli=Path | None,
                                    help="With --steer-feature: the SAE (as `anatomy sae`).")
    labels: Path | str | None = shared.labels("With --steer-feature: Neuronpedia's exported explanations, for the "
                                              "feature's label.")
    features_dir: Sequence[str] | None = shared.features_dir()

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.coef is not None and not self.steering:
            raise UsageError("--coef needs --steer FILE (or --steer-feature ID --sae PATH)")
        parse_coefs(self.coef)
        if (self.steer_feature is None) != (self.sae is None):
            raise UsageError("--steer-feature ID and --sae PATH go together")
        if (self.labels is not None or self.features_dir) and self.steer_feature is None:
            raise UsageError("--labels and --features-dir label an SAE feature: they need --steer-feature ID")
        if self.steer is not None and self.steer_feature is not None:
            raise UsageError("--steer FILE and --steer-feature ID both steer: give one")
        if self.steer is not None and not Path(self.steer).is_file():
            raise UsageError(f"steering vector file {self.steer} does not exist")

    @property
    def steering(self) -> bool:
        return self.steer is not None or self.steer_feature is not None

    @property
    def coefs(self) -> list[float]:
        return parse_coefs(self.coef)

    @property
    def file(self) -> str | None:
        """The file the vector comes from (the vector's, or the SAE's)."""
        path = self.steer if self.steer is not None else self.sae
        return None if path is None else str(Path(path))


def vector(opened: Opened, opts: SteeringOptions) -> SteeringVector | None:
    """The steering vector ``opts`` names, read and checked against ``opened`` (an OpenedModel or LoadedModel)
    before any weight loads; warnings go to the notes. None without steering. Raises UsageError for a vector
    that does not fit, an SAE feature out of range or at a site steering has no hook for."""
    if not opts.steering:
        return None
    from anatomy_cli.engine import steering

    if opts.steer is not None:
        found = steering.load(Path(opts.steer))
        warnings = steering.check(found, opened.info, opened.name, str(opts.steer))
    else:
        found, warnings = _feature(opened, opts)
        warnings = steering.check(found, opened.info, opened.name, "the SAE feature") + warnings
    for line in warnings:
        notes.warn(line)
    return found


def _feature(opened: Opened, opts: SteeringOptions) -> tuple[SteeringVector, list[str]]:
    """`--steer-feature ID --sae PATH`: the feature's decoder row at the SAE's output site
    (:func:`anatomy_cli.engine.sae.feature_vector`), checked against the model, and its warnings."""
    from anatomy_cli.engine.sae import feature_vector
    from anatomy_cli.models.sae import read

    assert opts.sae is not None and opts.steer_feature is not None
    sae_file = read.read(Path(opts.sae))
    found = feature_vector(sae_file, opts.steer_feature)
    sae_file.check_fits(opened.info, opened.name)
    warnings = []
    if sae_file.normalize_activations not in ("none", "expected_average_only_in"):
        warnings.append(f"the SAE normalizes its activations ({sae_file.normalize_activations}): the decoder row "
                        f"is added as stored, in the normalized units")
    return found, warnings


def record(opts: SteeringOptions, found: SteeringVector | None) -> dict[str, object] | None:
    """The record's ``steer`` key: the file, site, blocks and coefficients (and the SAE feature's id, its label
    and where the label came from: ``label`` the label or ``top tokens: …``, ``label_source``; ``link``: its panel
    in the features dashboard; all three only where there is one)."""
    if found is None:
        return None
    feature = _feature_record(opts) if opts.steer_feature is not None else {}
    return {"file": opts.file, "site": found.site, "layers": found.layers, "coef": opts.coefs, **feature}


def _feature_record(opts: SteeringOptions) -> dict[str, object]:
    """``feature`` and, where there are, its ``label``, ``label_source`` and ``link`` (read before any weight)."""
    from anatomy_cli.models.sae.read import read

    assert opts.sae is not None and opts.steer_feature is not None
    sae_file = read(Path(opts.sae), values=False)
    labels = dictionary_labels(sae_file.path, sae_file.site, opts.labels, shared.features_dirs(opts.features_dir),
                               sae_file.neuronpedia_id)
    f = opts.steer_feature
    extra = {"label": labels.shown(f), "label_source": labels.source if f in labels.text else None,
             "link": labels.link(f)}
    return {"feature": f, **{k: v for k, v in extra.items() if v}}
