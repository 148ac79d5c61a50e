"""`anatomy params [MODEL]`: the exact parameter breakdown from the config alone (meta device)."""

from __future__ import annotations

from typing import Annotated

import typer

from anatomy_cli.cli.declared import command
from anatomy_cli.cli.options import Output
from anatomy_cli.cli.options import TrustRemoteCodeOpt
from anatomy_cli.cli.options import output_options
from anatomy_cli.declare.commands import when_run
from anatomy_cli.models.resolve import short_name
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.output.render import resolve_format
from anatomy_cli.tasks import params as task

_SOURCES = {"preset": "built-in preset", "directory": "local directory", "hub": "Hugging Face config.json",
            "gguf": "GGUF file"}
_READ_FROM = {"meta": "counted on the meta device", "gguf_header": "read from the GGUF header",
              "safetensors_header": "read from the safetensors headers"}


@command("params", task.ParamsOptions)
@output_options()
def params_command(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="Preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl, llama-7b, mixtral-8x7b), "
        "a .gguf file or a checkpoint directory (read from their headers), a directory with only "
        "config.json, or a Hugging Face model id (only config.json is fetched).",
    )] = "gpt2",
    opts: task.ParamsOptions = task.ParamsOptions(),
    trust_remote_code: TrustRemoteCodeOpt = False,
    out: Output = Output(),
) -> None:
    """Count a model's parameters exactly, by component, without loading weights.

    A .gguf file or a directory with safetensors files is read from its
    headers (no tensor data, no torch): each row also gives its storage
    types, bytes on disk and bits per weight, and the notes the memory once
    dequantized. Presets and config-only models are built on the meta device
    (no weights downloaded or allocated; cached per config). Tied weights
    count once (a footnote says so), buffers never; rows sum to the total.
    For mixture-of-experts configs an Active column gives the parameters one
    token uses (top-k of n routed experts).

    Examples:

    \b
        anatomy params
        anatomy params gpt2-medium --dtype bf16
        anatomy params mixtral-8x7b --per-layer
        anatomy params ./my-checkpoint --format json
        anatomy params SmolLM2-135M-Instruct.Q4_1.gguf
        anatomy params llama-7b --max-memory 0=8GiB,cpu=16GiB --dtype fp16
    """
    plot, fmt = out.plot, out.fmt
    analysis = when_run("analyses.params")
    plots = when_run("output.plots")

    budget = analysis.parse_max_memory(opts.max_memory) if opts.max_memory is not None else None
    result = analysis.analyse(model, dtype=opts.dtype.value if opts.dtype else None, per_layer=opts.per_layer,
                              trust_remote_code=trust_remote_code, max_memory=budget)
    emit(build_report(result, fmt), fmt)
    if plot:
        plots.draw("params", plot, None, result,
                   plots.Caption("params", short_name(result.model), detail=result.architecture))


def _share_digits(shares: list[float]) -> int:
    """One decimal, or two when a row between 1% and 10% would otherwise show fewer than 3 digits."""
    return 2 if any(0.01 <= s < 0.1 for s in shares) else 1


def build_report(result, fmt=None):
    """The render.Report for a ParamsResult: the summary (or per-layer) table and the placement table."""

    data = result.to_dict()
    machine = resolve_format(fmt) is not Format.table
    moe = result.moe is not None and result.moe.active is not None
    tail = []
    if moe:
        tail.append(Column("active", "Active", "int", priority=2))
    if result.dtype:
        tail.append(Column("memory_bytes", f"Memory ({result.dtype})", "bytes", priority=2))
    on_disk = result.disk_bytes is not None
    if on_disk:
        tail += [Column("dtypes", "Stored as", priority=1), Column("disk_bytes", "On disk", "bytes", priority=1),
                 Column("bits_per_weight", "Bits per weight", "float", 2, priority=1)]
    total_row = {"key": "total", "component": "Total", "parameters": result.total, "share": 1.0,
                 "active": result.moe.active if moe else None, "memory_bytes": result.memory_bytes,
                 **(_disk_cells(data, data["rows"]) if on_disk else {})}
    lead = [Column("key", "key")] if machine else []

    if result.layers is None:
        rows = [{"key": r.key, "component": r.label, "parameters": r.parameters, "share": r.share,
                 "active": r.active, "memory_bytes": r.memory_bytes, **_stored(r)} for r in result.rows] + [total_row]
        columns = [*lead, Column("component", "Component"), Column("parameters", "Parameters", "int", priority=3),
                   Column("share", "Share", "pct", _share_digits([r.share for r in result.rows])),
                   Column("share", "", "bar"), *tail]
        sections = [Section(columns, rows)]
    else:
        sections = [_per_layer_section(result, lead, tail, total_row)]
    if result.placement is not None:
        sections.append(_placement_section(result.placement, machine))
    if result.dequantized_bytes is not None and not machine:
        sections.append(Section([Column("dtype", "Loaded as"), Column("memory_bytes", "Weights", "bytes")],
                                [{"dtype": d, "memory_bytes": b} for d, b in result.dequantized_bytes.items()],
                                title="Memory once loaded (dequantized)"))

    # config.json may name no architecture class (only a model_type): then say just that.
    what = f"{result.architecture} (model_type {result.model_type})" if result.architecture else \
        f"model_type {result.model_type}"
    heading = [f"{short_name(result.model)} · {what} · "
               f"{_SOURCES.get(result.source, result.source)}"
               + (f" {result.location}" if result.source == "directory" else "")
               + f" · {result.n_layers} layers"
               + (f" · {result.quantization}" if result.quantization else "")
               + f" · {_READ_FROM.get(result.read_from, result.read_from)}"]
    if machine:
        # Issue 2: `anatomy params --format tsv | head -1` prints nothing on stderr. The heading and
        # footnotes are in the JSON (`notes`) and under the table.
        return Report(data=data, sections=sections)
    return Report(data=data, sections=sections, heading=heading, notes=list(result.notes))


def _stored(row) -> dict:
    """A Row's or LayerRow's storage cells (empty where the counts did not come from a header)."""
    return {"dtypes": ", ".join(row.dtypes), "disk_bytes": row.disk_bytes, "bits_per_weight": row.bits_per_weight}


def _disk_cells(data, rows) -> dict:
    types = list(dict.fromkeys(t for r in rows for t in r["dtypes"]))
    return {"dtypes": ", ".join(types), "disk_bytes": data["disk_bytes"], "bits_per_weight": data["bits_per_weight"]}


def _per_layer_section(result, lead, tail, total_row):
    rules = when_run("analyses.params")

    present = {c for lr in result.layers for c, n in lr.parameters.items() if n}
    cats = [c for c in rules.LAYER_CATEGORIES if c in present or c in (rules.ATTENTION, rules.NORM)]
    stacks = {lr.name.rsplit(".", 1)[0] for lr in result.layers}
    rows = [{"key": f"layer_{lr.index}" if len(stacks) == 1 else lr.name,
             "component": f"layer {lr.index}" if len(stacks) == 1 else lr.name, **lr.parameters,
             "parameters": lr.total, "share": lr.share, "active": lr.active, "memory_bytes": lr.memory_bytes,
             **_stored(lr)} for lr in result.layers]
    rows += [{"key": r.key, "component": r.label, "parameters": r.parameters, "share": r.share,
              "active": r.active, "memory_bytes": r.memory_bytes, **_stored(r)} for r in result.outside_layers]
    rows.append(total_row)
    shares = [lr.share for lr in result.layers] + [r.share for r in result.outside_layers]
    columns = [*lead, Column("component", "Component"),
               *(Column(c, "Norms + other" if c == rules.NORM else rules.LABELS[c], "int",
                        priority=-1 if c == rules.NORM else 0)
                 for c in cats),
               Column("parameters", "Parameters", "int", priority=3),
               Column("share", "Share", "pct", _share_digits(shares)),
               Column("share", "", "bar"), *tail]
    return Section(columns, rows, title="Per layer")


def _placement_section(placement, machine):

    rows = [{"device": d["device"], "modules": ", ".join(d["modules"]), "parameters": d["parameters"],
             "memory_bytes": d["memory_bytes"], "budget_bytes": d["budget_bytes"]} for d in placement.devices]
    how = "balanced over GPUs, then " if placement.balanced else ""
    title = f"Placement ({how}accelerate infer_auto_device_map, {placement.dtype})"
    columns = [Column("device", "Device"), Column("modules", "Modules"), Column("parameters", "Parameters", "int"),
               Column("memory_bytes", "Memory", "bytes"), Column("budget_bytes", "Budget", "bytes")]
    return Section(columns, rows, title=None if machine else title)
