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
from anatomy_cli.cli.options import FormatOpt, model_options, prompt_options
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
    fmt: FormatOpt = None,
) -> None:
    """An SAE or transcoder on PROMPT: its health first (L0, FVE, MSE, relative error, next-token CE and KL
    with the reconstruction spliced in, with and without the error term), then the top features per token.

    Reads SAELens (standard, JumpReLU, TopK; BatchTopK saved as JumpReLU), EleutherAI sparsify (TopK) and
    Gemma Scope (JumpReLU) files offline. CE and KL are in nats. See docs/commands/sae.md.

    Examples:

    \b
        anatomy sae "The cat sat on the mat" --sae ./gpt2-res-jb/blocks.6.hook_resid_post --model gpt2
        anatomy sae "The cat sat" --sae ./sparsify-ckpt --hook layers.6 --model EleutherAI/pythia-70m
        anatomy sae "Paris is" --sae ./layer_12/width_16k/average_l0_82/params.npz --hook blocks.12.hook_resid_post
        anatomy sae "The cat" --sae ./sae --feature 123 --feature 4567 --labels ./explanations --format json
    """
    from anatomy_cli.models.sae import labels as labelling
    from anatomy_cli.models.sae import names, read

    sae_file = read.read(sae_path, hook=hook)
    wanted = list(dict.fromkeys(features or []))
    bad = [f for f in wanted if f >= sae_file.d_sae]
    if bad:
        raise UsageError(f"--feature {bad[0]} is out of range: the SAE has {sae_file.d_sae} features")
    label_map = labelling.read_labels(labels, sae_file.neuronpedia_id) if labels is not None else {}
    opened, encoded = open_prompts(prompt, spec, prompts)
    names.check_fits(opened.info, spec.model, sae_file)
    lm = load_weights(opened)
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine.hooks import check_names

    check_names(lm, [p for p in (sae_file.site, sae_file.site_out) if not p.endswith("mlp.hook_in")])
    dictionary = engine_sae.Dictionary(sae_file, lm.device)
    reports = []
    for enc in encoded:
        with status("running the prompt with the SAE"):
            run = engine_sae.splice_run(lm, list(enc.ids), dictionary)
        reports.append(_report(lm, enc, sae_file, dictionary, run, top=top, wanted=wanted, lens_k=lens_k,
                               labels=label_map, labelled=labels is not None))
    emit_prompts(reports, fmt, from_stdin=prompt == "-")


def _report(lm: Any, enc: Any, sae_file: Any, dictionary: Any, run: Any, *, top: int, wanted: list[int],
            lens_k: int, labels: dict[int, str], labelled: bool) -> Report:
    from anatomy_cli.analyses import sae as analysis
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.models.sae.labels import feature_url

    health = analysis.health(run, enc.ids, sae_file.stated_l0)
    notes = analysis.warnings(health, n_tokens=len(enc), context_size=sae_file.context_size,
                              sae_bos=sae_file.prepend_bos, prompt_bos=enc.bos, centred=sae_file.centred,
                              centred_now=analysis.centring(run.target))
    for note in notes:
        warn(note)
    dec_norms = dictionary.W_dec.float().norm(dim=-1).to(run.features.device)
    pieces = list(enc.pieces)

    def label(fid: int) -> str | None:
        return labels.get(fid) if labelled else None

    top_rows = [{**r, "label": label(r["feature"])}
                for r in analysis.top_features(run.features, dec_norms, pieces, top)]
    follow_rows, summary = analysis.follow(run.features, dec_norms, pieces, wanted)
    summary = [{**s, "label": label(s["feature"]), "url": feature_url(sae_file.neuronpedia_id, s["feature"])}
               for s in summary]
    lens_rows = analysis.logit_lens(engine_sae.decoder_lens(lm, dictionary, wanted), wanted, describe(lm), lens_k) \
        if wanted and lm.has_unembed else []
    health_dict = health.to_dict()
    data = {**prompt_record(lm, enc), "sae": sae_file.to_dict(), "health": health_dict, "warnings": notes,
            "top_features": top_rows, "features": summary, "feature_activations": follow_rows, "logit_lens": lens_rows}
    stats = [{"statistic": key, "value": value, "unit": _UNITS.get(key, "nats" if key.endswith("nats") else "")}
             for key, value in health_dict.items() if key != "l0"]
    sections = [Section(HEALTH, stats, title="health on this prompt"),
                Section(TOKENS, [{"position": i, "token": p, "l0": v}
                                 for i, (p, v) in enumerate(zip(pieces, health.l0))], title="L0 per token"),
                Section(TOP if labelled else TOP[:-1], top_rows, title=f"top {top} features per token")]
    if wanted:
        has_url = sae_file.neuronpedia_id is not None
        cols = [c for c in SUMMARY if (c.key != "label" or labelled) and (c.key != "url" or has_url)]
        sections += [Section(cols, summary, title="followed features"),
                     Section(FOLLOW, follow_rows, title="followed features per token")]
        if lens_rows:
            sections.append(Section(LENS, lens_rows, title="logit lens of the decoder rows"))
    site = sae_file.site if not sae_file.transcoder else f"{sae_file.site} → {sae_file.site_out}"
    heading = [f"sae · {model_label(lm)}",
               f"{sae_file.format} {sae_file.architecture} · d_sae {sae_file.d_sae} · {site}", prompt_line(enc)]
    return Report(data=data, sections=sections, heading=heading)
