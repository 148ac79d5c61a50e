"""`circuit`'s view: the strongest paths to the target logit as a table, the graph's summary as JSON."""

from __future__ import annotations

from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.output.plots import Caption
from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.tasks._circuit_estimate import CircuitEstimate
from anatomy_cli.tasks.records import model_record
from anatomy_cli.tasks.records import spec_record
from anatomy_cli.tasks.session import model_label
from anatomy_cli.tasks.session import prompt_line
from anatomy_cli.tasks.session import prompt_record
from anatomy_cli.units import counted
from anatomy_cli.units import human_bytes
from anatomy_cli.units import human_seconds

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.output.views.protocol import FigureArgs
    from anatomy_cli.tasks.circuit import CircuitResult

COLUMNS = (
    Column("node", "node"),
    Column("kind", "kind"),
    Column("layer", "layer"),
    Column("position", "pos", "int"),
    Column("token", "token"),
    Column("weight", "weight", "float", 4),
    Column("influence", "cum. influence", "float", 3),
    Column("via", "strongest source"),
    Column("via_weight", "its weight", "float", 4),
)
LABEL = Column("label", "label")  # shown when the run has labels or top tokens (models/feature_labels.py)
HEAD_COLUMNS = (Column("head", "first head"), Column("head_part", "its part", "float", 4))  # --heads
QK_NOTES = 3  # --heads: QK-attributed heads summed up under the table
ROWS = "paths"
ESTIMATE_ROWS = "quantities"  # an estimate's rows: one per quantity (the table --estimate prints)
KINDS = {"cross layer transcoder": "feature", "mlp reconstruction error": "error", "embedding": "token",
         "logit": "logit"}


INPUTS = ("mlp reconstruction error", "embedding")  # the graph's inputs: circuit-tracer computes no edge into them


def report(lm: Any, enc: Encoded, result: CircuitResult | CircuitEstimate) -> Report:
    if isinstance(result, CircuitEstimate):
        return estimate_report(lm, enc, result)
    data = {**prompt_record(lm, enc), **result.to_dict()}
    rows = [{**r, "kind": KINDS.get(r["kind"], r["kind"]), **({"via": "(input)"} if r["kind"] in INPUTS else {})}
            for r in data["paths"]]
    first = data["targets"][0]
    heading = [f"circuit · {model_label(lm)}", prompt_line(enc),
               f"{data['n_selected_features']:,} of {counted(data['n_active_features'], 'active feature')} · "
               f"{counted(data['n_kept_nodes'], 'node')}, {counted(data['n_kept_edges'], 'edge')} kept"]
    notes = [f"target {first['token']!r} (p={first['prob']:.3f}) of {len(data['targets'])} logit nodes; "
             f"replacement score {data['replacement_score']:.3f}, completeness {data['completeness_score']:.3f}",
             "weight: the direct effect on the target logit (demeaned) in the frozen replacement model"]
    if any(r["kind"] in INPUTS for r in data["paths"]):
        notes.append("strongest source: the node's strongest kept incoming edge, from a feature, error node or "
                     "token; error nodes and tokens are the graph's inputs (no edge enters them): (input)")
    labelled = any("label" in r for r in rows)
    if labelled:
        sources = data.get("feature_labels", {}).get("sources") or []
        notes.append(f"label: from {', '.join(sources) if sources else 'no explanations file'}; \"top tokens: …\" "
                     "is no label: the tokens the feature's decoder direction promotes most (--features-dir)")
    columns: tuple[Column, ...] = (*COLUMNS, LABEL) if labelled else COLUMNS
    if any("head" in r for r in rows):
        columns = (*columns, *HEAD_COLUMNS)
        rows = [{**r, "head": r["head"] or "(bypass)"} for r in rows]
        notes += heads_notes(data.get("qk", []))
    if "check" in data:
        c = data["check"]
        notes.append(f"--check: {counted(c['n_edges'], 'edge')} re-measured by intervention, largest difference "
                     f"{c['max_abs_error']:.2e} (relative {c['max_relative_error']:.2e})")
    return Report(data=data, sections=[Section(columns, rows, title="strongest paths to the target")],
                  heading=heading, notes=notes)


def heads_notes(qk: list[dict[str, Any]]) -> list[str]:
    """``--heads``: what the head column says, and each QK-attributed head's score with its largest terms."""
    out = ["first head: the block.head whose part of the edge (the paths whose first attention head it is) is "
           "largest, and that part; the parts of all heads plus the bypass (paths through no head) sum to the weight"]
    for e in qk[:QK_NOTES]:
        terms = ", ".join(f"{t['query']} x {t['key']} {t['value']:+.3f}" for t in e["terms"][:3])
        out.append(f"head {e['layer']}.{e['head']} at query {e['query_pos']}, key {e['key_pos']}: score "
                   f"{e['score']:.3f} = {terms}, ... (query x key terms; --json 'qk' has them)")
    return out


def figure(lm: LoadedModel, enc: Encoded, result: CircuitResult | CircuitEstimate) -> FigureArgs:
    """``plots.draw("circuit", ...)``'s arguments: the graph JSON (``--json``'s dict) and the caption
    (anatomy_cli/output/html/circuit.py draws it; .html only). An estimate draws nothing."""
    if isinstance(result, CircuitEstimate):
        return (), {}

    return (result.json, Caption.of("circuit", lm, enc.text)), {}


ESTIMATE = (
    Column("quantity", "quantity"),
    Column("value", "value", "float", 0),
    Column("shown", "shown"),
)
SIZES = ("adjacency_bytes", "rows_bytes", "setup_bytes", "transcoder_bytes", "backward_bytes", "memory_bytes")
COUNTS = ("n_tokens", "active_features_bound", "feature_rows", "n_logits", "n_nodes", "backward_passes")


HEADS_BOUND = ("an upper bound: counted as if pruning kept every node (every feature row and logit a target, every "
               "feature, error and token node a source); the kept graph is known only after the run, which prints "
               "its own count for the kept edges before it starts them")


def estimate_report(model: Any, enc: Encoded, est: CircuitEstimate) -> Report:
    """``--estimate``: the bound per quantity (bytes, counts, FLOPs, seconds), before any weight loads (``model``:
    the opened model, or a loaded one from the API)."""
    e = est.to_dict()
    record = model_record(model) if hasattr(model, "model") else spec_record(model.spec)  # loaded, or opened only
    rows = ([{"quantity": k, "value": e[k], "shown": f"{e[k]:,}"} for k in COUNTS] +
            [{"quantity": k, "value": e[k], "shown": human_bytes(e[k])} for k in SIZES] +
            [{"quantity": "flops", "value": e["flops"], "shown": f"{e['flops']:.2g} FLOP"},
             {"quantity": "seconds_expected", "value": e["seconds_expected"],
              "shown": f"{human_seconds(e['seconds_expected'])} on {e['device']}"}])
    if e.get("heads_passes"):  # --heads: its replays, bounded by the whole graph
        rows += [{"quantity": "heads_passes", "value": e["heads_passes"], "shown": f"{e['heads_passes']:,}"},
                 {"quantity": "heads_flops", "value": e["heads_flops"], "shown": f"{e['heads_flops']:.2g} FLOP"},
                 {"quantity": "heads_seconds_expected", "value": e["heads_seconds_expected"],
                  "shown": f"{human_seconds(e['heads_seconds_expected'])} on {e['device']}"}]
    data = {**record, "prompt": enc.text, "token_ids": list(enc.ids), "bos": enc.bos, "estimate": True, **e,
            ESTIMATE_ROWS: rows}
    if e.get("heads_passes"):
        data["heads_bound"] = HEADS_BOUND
    heading = [f"circuit --estimate · {getattr(model, 'name', '')} · {e['n_layers']} blocks × {e['d_transcoder']:,} "
               f"transcoder features · nothing computed", prompt_line(enc)]
    per_site = (f"TopK: k = {est.k:,} features of each block" if getattr(est, "k", None) is not None
                else "every feature of every block")
    notes = [f"at most {e['active_features_bound']:,} active features ({per_site} at positions "
             f"1..{e['n_tokens'] - 1}): feature rows {e['feature_rows']:,} = min(--max-feature-nodes, that); "
             f"the graph is {e['n_nodes']:,} × {e['n_nodes']:,} float32",
             "bytes are upper bounds beyond the model's weights; the time is a rough estimate at an assumed rate"]
    if e.get("heads_passes"):
        notes.append(f"heads_*: --heads' batched replays after the graph, {HEADS_BOUND}")
    return Report(data=data, sections=[Section(ESTIMATE, rows, title="circuit --estimate")], heading=heading,
                  notes=notes)
