"""`anatomy sae PROMPT --sae PATH`: does a sparse autoencoder fit this model, and which features fire."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from anatomy_cli.cli.app import app, status, warn
from anatomy_cli.cli.commands._common import (
    PromptArg,
    describe,
    emit_prompts,
    load_weights,
    model_label,
    open_prompts,
    prompt_line,
    prompt_record,
)
from anatomy_cli.cli.options import FormatOpt, PlotOpt, model_options, prompt_options
from anatomy_cli.errors import UsageError
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.render import Column, Report, Section
from anatomy_cli.text.options import PromptOptions

HEALTH = (Column("statistic", "statistic"), Column("value", "value", "number"), Column("unit", "unit"))
TOKENS = (Column("position", "pos", "int"), Column("token", "token"), Column("l0", "L0", "int"))
TOP = (Column("position", "pos", "int"), Column("token", "token"), Column("rank", "rank", "int"),
       Column("feature", "feature", "id"), Column("activation", "activation", "float", 3),
       Column("share", "share", "pct", 1), Column("label", "label"))
FOLLOW = (Column("position", "pos", "int"), Column("token", "token"), Column("feature", "feature", "id"),
          Column("activation", "activation", "float", 3), Column("share", "share", "pct", 1))
SUMMARY = (Column("feature", "feature", "id"), Column("max_activation", "max", "float", 3),
           Column("max_position", "at", "int"), Column("max_token", "token"),
           Column("active_tokens", "active", "int"), Column("label", "label"), Column("url", "url"))
LENS = (Column("feature", "feature", "id"), Column("side", "side"), Column("rank", "rank", "int"),
        Column("token", "token"), Column("token_id", "id", "id"), Column("logit", "logit", "float", 3))
_UNITS = {"l0_mean": "features", "stated_l0": "features", "fve": "fraction", "mse": "activation²",
          "error_ratio": "‖x−x̂‖/‖x‖", "norm_ratio": "‖x̂‖/‖x‖", "max_logit_diff_with_error": "logit"}


@app.command("sae")
@model_options()
@prompt_options()
def sae_command(
    prompt: PromptArg,
    sae_path: Annotated[Path, typer.Option(
        "--sae", metavar="PATH", show_default=False,
        help="The SAE: a SAELens folder (cfg.json, sae_weights.safetensors), a sparsify folder (cfg.json, "
        "sae.safetensors; or its checkpoint folder with --hook), or a Gemma Scope params.npz.")],
    hook: Annotated[Optional[str], typer.Option(
        "--hook", metavar="NAME", show_default=False,
        help="The hook point, where the files state none (Gemma Scope) or to pick one of a sparsify "
        "checkpoint's folders (layers.3); TransformerLens names (blocks.3.hook_resid_post) or sparsify's.")] = None,
    top: Annotated[int, typer.Option("--top", "-k", min=1, metavar="N",
                                     help="Features listed per token.")] = 5,
    features: Annotated[Optional[list[int]], typer.Option(
        "--feature", metavar="ID", min=0, show_default=False,
        help="Follow this feature across the prompt, with its summary and logit lens (repeatable).")] = None,
    lens_k: Annotated[int, typer.Option("--lens-top", min=1, metavar="N",
                                        help="Tokens listed at each end of a followed feature's logit lens.")] = 5,
    labels: Annotated[Optional[Path], typer.Option(
        "--labels", metavar="DIR|FILE", show_default=False,
        help="Neuronpedia's exported explanations (explanations/*.jsonl.gz), joined by feature id.")] = None,
    spec: ModelSpec = ModelSpec(),
    prompts: PromptOptions = PromptOptions(),
    plot: PlotOpt = None,
    fmt: FormatOpt = None,
) -> None:
    """An SAE or transcoder on PROMPT: its health first (L0, FVE, MSE, relative error, next-token CE and KL
    with the reconstruction spliced in, with and without the error term), then the top features per token.

    Reads SAELens (standard, JumpReLU, TopK; BatchTopK saved as JumpReLU), EleutherAI sparsify (TopK) and
    Gemma Scope (JumpReLU) files offline. CE and KL are in nats. --plot FILE draws tokens x features (the
    top features over the prompt, activation as colour). See docs/commands/sae.md.

    Examples:

    \b
        anatomy sae "The cat sat on the mat" --sae ./gpt2-res-jb/blocks.6.hook_resid_post --model gpt2
        anatomy sae "The cat sat" --sae ./sparsify-ckpt --hook layers.6 --model EleutherAI/pythia-70m
        anatomy sae "Paris is" --sae ./layer_12/width_16k/average_l0_82/params.npz --hook blocks.12.hook_resid_post
        anatomy sae "The cat" --sae ./sae --feature 123 --feature 4567 --labels ./explanations --format json
        anatomy sae "The cat sat on the mat" --sae ./sae --labels ./explanations --plot features.html
    """
    sae_file, wanted, label_map = prepare(sae_path, hook, features, labels)
    opened, encoded = open_prompts(prompt, spec, prompts)
    from anatomy_cli.models.sae import names

    names.check_fits(opened.info, spec.model, sae_file)
    lm = load_weights(opened)
    dictionary = dictionary_for(lm, sae_file)
    reports = []
    for enc in encoded:
        with status("running the prompt with the SAE"):
            reading = run(lm, enc, sae_file, dictionary, top=top, wanted=wanted, lens_k=lens_k, labels=label_map)
        for note in reading.warnings:
            warn(note)
        reports.append(_report(lm, enc, sae_file, reading))
        if plot:
            from anatomy_cli.output import plots

            plots.draw("sae", plot, len(reports) if prompt == "-" else None, reading, caption(lm, enc, sae_file))
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def prepare(sae_path: Path, hook: str | None, features: list[int] | None, labels: Path | None
            ) -> tuple[Any, list[int], dict[int, str] | None]:
    """The SAE file, the followed feature ids (deduplicated, checked against d_sae) and the labels (None
    without ``labels``). Raises UsageError for a feature out of range, and what the readers raise."""
    from anatomy_cli.models.sae import labels as labelling
    from anatomy_cli.models.sae import read

    sae_file = read.read(sae_path, hook=hook)
    wanted = list(dict.fromkeys(features or []))
    bad = [f for f in wanted if f >= sae_file.d_sae]
    if bad:
        raise UsageError(f"--feature {bad[0]} is out of range: the SAE has {sae_file.d_sae} features")
    return sae_file, wanted, labelling.read_labels(labels, sae_file.neuronpedia_id) if labels is not None else None


def dictionary_for(lm: Any, sae_file: Any) -> Any:
    """The SAE's tensors on ``lm``'s device, once its hook points are checked on the loaded model."""
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine.hooks import check_names

    check_names(lm, [p for p in (sae_file.site, sae_file.site_out) if not p.endswith("mlp.hook_in")])
    return engine_sae.Dictionary(sae_file, lm.device)


def caption(lm: Any, enc: Any, sae_file: Any) -> Any:
    from anatomy_cli.output.plots import Caption

    return Caption.of("sae", lm, enc.text, f"{sae_file.format} {sae_file.architecture} · {_site(sae_file)}")


def _site(sae_file: Any) -> str:
    return sae_file.site if not sae_file.transcoder else f"{sae_file.site} → {sae_file.site_out}"


def run(lm: Any, enc: Any, sae_file: Any, dictionary: Any, *, top: int = 5, wanted: list[int] | None = None,
        lens_k: int = 5, labels: dict[int, str] | None = None) -> Any:
    """One prompt through the SAE as the command computes it (the command and the Python API call this): the
    splice run, its health and warnings, the top features per token and the followed ones. Returns an
    :class:`anatomy_cli.analyses.sae.Reading`."""
    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.models.sae.labels import feature_url

    wanted = list(wanted or [])
    run = engine_sae.splice_run(lm, list(enc.ids), dictionary)
    health = analysis.health(run, enc.ids, sae_file.stated_l0)
    notes = analysis.warnings(health, n_tokens=len(enc), context_size=sae_file.context_size,
                              sae_bos=sae_file.prepend_bos, prompt_bos=enc.bos, centred=sae_file.centred,
                              centred_now=analysis.centring(run.target))
    dec_norms = dictionary.W_dec.float().norm(dim=-1).to(run.features.device)
    pieces = list(enc.pieces)

    def label(fid: int) -> str | None:
        return labels.get(fid) if labels is not None else None

    top_rows = [{**r, "label": label(r["feature"])}
                for r in analysis.top_features(run.features, dec_norms, pieces, top)]
    follow_rows, summary = analysis.follow(run.features, dec_norms, pieces, wanted)
    summary = [{**s, "label": label(s["feature"]), "url": feature_url(sae_file.neuronpedia_id, s["feature"])}
               for s in summary]
    lens_rows = analysis.logit_lens(engine_sae.decoder_lens(lm, dictionary, wanted), wanted, describe(lm), lens_k) \
        if wanted and lm.has_unembed else []
    return analysis.Reading(pieces=tuple(pieces), activations=run.features.detach().float().cpu(), health=health,
                            warnings=tuple(notes), top_rows=tuple(top_rows), follow_rows=tuple(follow_rows),
                            summary=tuple(summary), lens_rows=tuple(lens_rows), followed=tuple(wanted),
                            labels=labels, top=top)


def _report(lm: Any, enc: Any, sae_file: Any, reading: Any) -> Report:
    labelled = reading.labels is not None
    health, pieces = reading.health, reading.pieces
    top_rows, summary = list(reading.top_rows), list(reading.summary)
    health_dict = health.to_dict()
    data = {**prompt_record(lm, enc), "sae": sae_file.to_dict(), "health": health_dict,
            "warnings": list(reading.warnings), "top_features": top_rows, "features": summary,
            "feature_activations": list(reading.follow_rows), "logit_lens": list(reading.lens_rows)}
    stats = [{"statistic": key, "value": value, "unit": _UNITS.get(key, "nats" if key.endswith("nats") else "")}
             for key, value in health_dict.items() if key != "l0"]
    sections = [Section(HEALTH, stats, title="health on this prompt"),
                Section(TOKENS, [{"position": i, "token": p, "l0": v}
                                 for i, (p, v) in enumerate(zip(pieces, health.l0))], title="L0 per token"),
                Section(TOP if labelled else TOP[:-1], top_rows, title=f"top {reading.top} features per token")]
    if reading.followed:
        has_url = sae_file.neuronpedia_id is not None
        cols = [c for c in SUMMARY if (c.key != "label" or labelled) and (c.key != "url" or has_url)]
        sections += [Section(cols, summary, title="followed features"),
                     Section(FOLLOW, list(reading.follow_rows), title="followed features per token")]
        if reading.lens_rows:
            sections.append(Section(LENS, list(reading.lens_rows), title="logit lens of the decoder rows"))
    heading = [f"sae · {model_label(lm)}",
               f"{sae_file.format} {sae_file.architecture} · d_sae {sae_file.d_sae} · {_site(sae_file)}",
               prompt_line(enc)]
    return Report(data=data, sections=sections, heading=heading)


def feature_steering(steer: Path | None, feature: int | None, sae_path: Path | None, opened: Any, model: str
                     ) -> tuple[Any, list[str]]:
    """`generate --steer-feature ID --sae PATH`: the feature's steering vector (its decoder row at the SAE's
    output site, :func:`anatomy_cli.engine.sae.feature_vector`) and warnings; ``(None, [])`` without the
    options. Checked against the opened model before its weights load. Raises UsageError for a missing or
    extra option, an id out of range, a site steering does not support, an SAE of another width."""
    if feature is None and sae_path is None:
        return None, []
    if feature is None or sae_path is None:
        raise UsageError("--steer-feature ID and --sae PATH go together")
    if steer is not None:
        raise UsageError("--steer FILE and --steer-feature ID both steer: give one")
    from anatomy_cli.engine.sae import feature_vector
    from anatomy_cli.models.sae import names, read

    sae_file = read.read(sae_path)
    vector = feature_vector(sae_file, feature)
    names.check_fits(opened.info, model, sae_file)
    notes = []
    if sae_file.normalize_activations not in ("none", "expected_average_only_in"):
        notes.append(f"the SAE normalizes its activations ({sae_file.normalize_activations}): the decoder row "
                     f"is added as stored, in the normalized units")
    return vector, notes
