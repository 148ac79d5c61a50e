"""`sae`'s view: the SAE's health, L0 per token, the top features per token and the followed features as tables;
the record as JSON; the tokens x features picture's caption."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record

if TYPE_CHECKING:
    from anatomy_cli.analyses.sae import Reading
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.models.sae.read import SAEFile
    from anatomy_cli.output.views.protocol import FigureArgs

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
          "error_ratio": "‖x−x̂‖/‖x‖", "norm_ratio": "‖x̂‖/‖x‖", "max_logit_diff_with_error": "logit",
          "skipped_positions": "positions"}
ROWS = "top_features"
_CE = ("ce_clean_nats", "ce_spliced_nats", "ce_with_error_nats")


def with_bits(health: Mapping[str, Any]) -> dict[str, object]:
    """The health record with each cross-entropy in bits beside nats (``ce_clean_bits`` after
    ``ce_clean_nats``, ...: the unit of ``corpus``); the documented nats keys stay."""
    out: dict[str, object] = {}
    for key, value in health.items():
        out[key] = value
        if key in _CE:
            out[key[:-len("nats")] + "bits"] = None if value is None else value / math.log(2.0)
    return out


def _unit(key: str) -> str:
    if key in _UNITS:
        return _UNITS[key]
    return "nats" if key.endswith("nats") else "bits" if key.endswith("bits") else ""


def site(sae_file: SAEFile) -> str:
    return sae_file.site if not sae_file.transcoder else f"{sae_file.site} → {sae_file.site_out}"


def figure(lm: LoadedModel, enc: Encoded, reading: Reading, sae_file: SAEFile) -> FigureArgs:
    """``plots.draw("sae", ...)``'s arguments: the reading and its caption."""
    cap = Caption.of("sae", lm, enc.text, f"{sae_file.format} {sae_file.architecture} · {site(sae_file)}")
    return (reading, cap), {}


def report(lm: LoadedModel, enc: Encoded, reading: Reading, sae_file: SAEFile) -> Report:
    labelled = reading.labels is not None
    health, pieces = reading.health, reading.pieces
    top_rows, summary = list(reading.top_rows), list(reading.summary)
    health_dict = with_bits(health.to_dict())
    data = {**prompt_record(lm, enc), "sae": sae_file.to_dict(), "health": health_dict,
            "warnings": list(reading.warnings), "top_features": top_rows, "features": summary,
            "feature_activations": list(reading.follow_rows), "logit_lens": list(reading.lens_rows)}
    stats = [{"statistic": key, "value": value, "unit": _unit(key)}
             for key, value in health_dict.items() if key != "l0"]
    sections = [Section(HEALTH, stats, title="health on this prompt"),
                Section(TOKENS, [{"position": i, "token": p, "l0": int(v)}  # every position, as the features
                                 for i, (p, v) in enumerate(zip(pieces, (reading.activations > 0).sum(-1)))],
                        title="L0 per token"),
                Section(TOP if labelled else TOP[:-1], top_rows, title=f"top {reading.top} features per token")]
    if reading.followed:
        has_url = sae_file.neuronpedia_id is not None
        cols = [c for c in SUMMARY if (c.key != "label" or labelled) and (c.key != "url" or has_url)]
        sections += [Section(cols, summary, title="followed features"),
                     Section(FOLLOW, list(reading.follow_rows), title="followed features per token")]
        if reading.lens_rows:
            sections.append(Section(LENS, list(reading.lens_rows), title="logit lens of the decoder rows"))
    heading = [f"sae · {model_label(lm)}",
               f"{sae_file.format} {sae_file.architecture} · d_sae {sae_file.d_sae} · {site(sae_file)}",
               prompt_line(enc)]
    notes = []
    if labelled:
        data["label_source"] = reading.label_source
        notes.append(label_note(reading.label_source))
    return Report(data=data, sections=sections, heading=heading, notes=notes)


def label_note(source: str | None) -> str:
    """Where the labels came from, and what "top tokens:" means (models/feature_labels.py)."""
    where = f"labels from {source}" if source is not None else "no labels"
    return (f"{where}; \"top tokens: …\" is no label: the tokens the feature's decoder direction promotes most "
            "(--features-dir)")
