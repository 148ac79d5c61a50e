"""`sae`: does a sparse autoencoder (or transcoder) fit this model, and which features fire (the task).

:class:`SaeOptions` holds the SAE's path and what to list; :func:`before_open` reads the SAE before the model opens;
:func:`check` reads the labels, refuses a feature out of range and an SAE of another model before any weight loads;
:func:`run` gives one :class:`~anatomy_cli.analyses.sae.Reading` per prompt.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.feature_labels import dictionary_labels
from anatomy_cli.models.sae.labels import feature_url
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.session import describe

if TYPE_CHECKING:
    from anatomy_cli.analyses.sae import Reading
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.sae import Dictionary
    from anatomy_cli.models.feature_labels import FeatureLabels
    from anatomy_cli.models.sae.read import SAEFile
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "sae"


@dataclass(frozen=True)
class SaeOptions(Declared):
    """``sae``: a SAELens or sparsify folder or a Gemma Scope params.npz; ``hook``: its hook point where the
    files state none; ``top``: features per token; ``features``: ids followed across the prompt (``--feature``,
    repeatable); ``lens_top``: tokens at each end of a followed feature's logit lens; ``labels``: Neuronpedia's
    explanations (default: ``features_dir``'s explanations.json, else explanations.json beside the SAE; the
    labels' source: feature_labels.py)."""

    sae: Path | str = option(
        dataclasses.MISSING, "--sae", metavar="PATH", show_default=False, cli=Path,
        help="The SAE: a SAELens folder (cfg.json, sae_weights.safetensors), a sparsify folder (cfg.json, "
        "sae.safetensors; or its checkpoint folder with --hook), or a Gemma Scope params.npz.")
    hook: str | None = option(
        None, "--hook", metavar="NAME", show_default=False,
        help="The hook point, where the files state none (Gemma Scope) or to pick one of a sparsify "
        "checkpoint's folders (layers.3); TransformerLens names (blocks.3.hook_resid_post) or sparsify's.")
    top: int = option(5, "--top", "-k", min=1, metavar="N", help="Features listed per token.")
    features: Sequence[int] | None = option(
        None, "--feature", metavar="ID", min=0, show_default=False, cli=list[int] | None,
        help="Follow this feature across the prompt, with its summary and logit lens (repeatable).")
    lens_top: int = option(5, "--lens-top", min=1, metavar="N",
                           help="Tokens listed at each end of a followed feature's logit lens.")
    labels: Path | str | None = shared.labels("Neuronpedia's exported explanations (explanations/*.jsonl.gz), "
                                              "joined by feature id.")
    features_dir: Sequence[str] | None = shared.features_dir()

    @property
    def wanted(self) -> list[int]:
        """The followed feature ids, without repeats."""
        return list(dict.fromkeys(int(f) for f in self.features or ()))


@dataclass(frozen=True)
class SaePlan:
    sae_file: SAEFile
    labels: FeatureLabels


def before_open(opts: SaeOptions) -> SAEFile:
    """The SAE read (its files whole, as :func:`check` takes it) before the model opens: a path that holds none or a
    file that cannot be read is refused at once, not after the open's seconds (it imports torch); its
    ``model_name`` is the model opened when none is given (tasks/recorded_model.py ``chosen``)."""
    from anatomy_cli.models.sae import read

    return read.read(Path(opts.sae), hook=opts.hook)


def check(opened: Opened, opts: SaeOptions, sae_file: SAEFile | None = None) -> SaePlan:
    """The SAE (``sae_file``, :func:`before_open`'s; else read here) and its labels; UsageError for a feature out of
    range or an SAE that does not fit the model ``opened`` (an OpenedModel or a LoadedModel) describes, and what the
    readers raise."""
    sae_file = before_open(opts) if sae_file is None else sae_file
    bad = [f for f in opts.wanted if f >= sae_file.d_sae]
    if bad:
        raise UsageError(f"--feature {bad[0]} is out of range: the SAE has {sae_file.d_sae} features")
    labels = dictionary_labels(sae_file.path, sae_file.site, opts.labels, shared.features_dirs(opts.features_dir),
                               sae_file.neuronpedia_id)
    sae_file.check_fits(opened.info, opened.name)
    return SaePlan(sae_file, labels)


def run(lm: LoadedModel, encoded: list[Encoded], opts: SaeOptions, plan: SaePlan) -> list[Reading]:
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine.hooks import check_names

    sae_file = plan.sae_file
    check_names(lm, [p for p in (sae_file.site, sae_file.site_out) if not sites.is_point(p, sites.Point.mlp_in)])
    dictionary = engine_sae.Dictionary(sae_file, lm.device)
    skip = max((health_skip(sae_file, len(enc)) for enc in encoded), default=0)
    if skip:
        where = "position" if skip == 1 else f"{skip} positions"
        notes.info(f"the health leaves out the prompt's first {where}, as the fit did (its skipped_positions)")
    out = []
    for enc in encoded:
        with notes.status("running the prompt with the SAE"):
            reading = read_one(lm, enc, sae_file, dictionary, opts, plan.labels)
        for line in reading.warnings:
            notes.warn(line)
        out.append(reading)
    return out


def read_one(lm: LoadedModel, enc: Encoded, sae_file: SAEFile, dictionary: Dictionary, opts: SaeOptions,
             labels: FeatureLabels) -> Reading:
    """One prompt through the SAE: the splice run, its health and warnings, the top features per token and the
    followed ones."""
    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae

    wanted = opts.wanted
    ids = list(enc.ids)
    skip = health_skip(sae_file, len(enc))
    # the unmodified forward once, for both splices where the health leaves positions out (was 6 forwards, now 5)
    clean = engine_sae.clean_run(lm, ids, engine_sae.readings(lm, sae_file)) if skip else None
    run = engine_sae.splice_run(lm, ids, dictionary, clean=clean)
    measured = engine_sae.splice_run(lm, ids, dictionary, skip=skip, clean=clean) if skip else run
    health = analysis.health(measured, enc.ids[skip:], sae_file.stated_l0, skipped=skip)
    warnings = analysis.warnings(health, n_tokens=len(enc), context_size=sae_file.context_size,
                                 sae_bos=sae_file.prepend_bos, prompt_bos=enc.bos, centred=sae_file.centred,
                                 centred_now=analysis.centring(run.target))
    dec_norms = dictionary.W_dec.float().norm(dim=-1).to(run.features.device)
    pieces = list(enc.pieces)

    labelled = labels.source is not None or bool(labels.top_tokens)

    def label(fid: int) -> str | None:
        return (labels.shown(fid) or None) if labelled else None

    top_rows = [{**r, "label": label(r["feature"])}
                for r in analysis.top_features(run.features, dec_norms, pieces, opts.top)]
    follow_rows, summary = analysis.follow(run.features, dec_norms, pieces, wanted)
    summary = [{**s, "label": label(s["feature"]), "url": feature_url(sae_file.neuronpedia_id, s["feature"])}
               for s in summary]
    lens_rows = analysis.logit_lens(engine_sae.decoder_lens(lm, dictionary, wanted), wanted, describe(lm),
                                    opts.lens_top) if wanted and lm.has_unembed else []
    return analysis.Reading(pieces=tuple(pieces), activations=run.features.detach().float().cpu(), health=health,
                            warnings=tuple(warnings), top_rows=tuple(top_rows), follow_rows=tuple(follow_rows),
                            summary=tuple(summary), lens_rows=tuple(lens_rows), followed=tuple(wanted),
                            labels=_shown(labels, top_rows, wanted) if labelled else None, top=opts.top,
                            label_source=labels.source)


def health_skip(sae_file: SAEFile, n_tokens: int) -> int:
    """The prompt's first positions the health leaves out: those the fit left out of its rows (fit-sae records
    ``skipped_positions``: the first position's attention-sink activation), where the prompt has more than one
    position after them; 0 for every other dictionary."""
    skip = sae_file.skipped_positions
    return skip if skip and n_tokens > skip + 1 else 0


def _shown(labels: FeatureLabels, top_rows: list[dict[str, Any]], wanted: list[int]) -> dict[int, str]:
    """The label (or marked top tokens) of each feature the reading lists."""
    listed = {*wanted, *(r["feature"] for r in top_rows)}
    return {f: labels.shown(f) for f in listed if labels.shown(f)}
