"""`features --plot FILE.html`: a dashboard of a dictionary's features, one page that opens from disk.

A list of the followed features (search by id or by token text; sort by frequency, max activation or id), and the
panel of the feature picked: its explanation and scores where ``anatomy explain`` wrote them (then also listed,
searched and sortable by score), its status, its top-activating and interval-sampled contexts with every token shaded
by the feature's activation there, its activation histogram (plotly), its logit effects and the features firing
with it (links to their panels, ``#f-ID``). Everything is read from the command's JSON record (the view's report
data, the same object ``--format json`` prints), written once into the page as JSON; the page's script writes
every token and every other piece of user or model text with ``textContent`` (the package's escaping rule).
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import caption_page
from anatomy_cli.output.html import esc
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import script_json
from anatomy_cli.output.html._page import CONFIG
from anatomy_cli.output.html._page import FONT
from anatomy_cli.output.html.markup import Part
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from anatomy_cli.output.plots.caption import Caption

STYLE = """
.fx-wrap { display: flex; gap: 1.5em; align-items: flex-start; }
.fx-list { flex: 0 0 auto; width: 36em; max-width: 45%; max-height: 80vh; overflow: auto; }
.fx-list table.data td { max-width: 12em; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.fx-list tr { cursor: pointer; } .fx-list tr.sel td { background: #ffe9c7; }
.fx-panel { flex: 1 1 0; min-width: 20em; }
.fx-panel .ctx { margin: 2px 0; white-space: normal; } .fx-panel .ctx b { font-weight: normal; color: #555; }
.fx-panel span.tok { background: #fff; } .fx-panel span.tok.at { outline: 2px solid #c05000; }
.status-dead { color: #888; font-weight: bold; } .status-always-on { color: #a00; font-weight: bold; }
.explained .fx-list { width: 52em; max-width: 55%; } .explained .fx-list table.data td:nth-child(8) { max-width: 18em; }
.fx-panel .explanation { font-size: 1.1em; margin: 0.3em 0 0.6em; }
p.weak { color: #c00000; font-weight: bold; max-width: 60em; }
"""


def page_data(data: dict[str, Any], explanations: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What the page's script reads, taken from the command's JSON record (no value recomputed), packed for pages
    of thousands of features: each distinct token text once (``pieces``), each corpus window's tokens that some
    context shows once (``windows``: piece indices by position, -1 where none is shown), a context as a row
    ``[feature, kind (0 top, 1 quantile), rank, quantile, lower, upper, activation, at, window, start,
    activations]`` (its tokens: ``windows[window][start:start + len(activations)]``) and a logit effect as
    ``[feature, side (0 top, 1 bottom), rank, piece index, effect]``; every token's activation to 3 significant
    digits, a context's own and its interval's bounds to 4, effects to 6 (what the page shows), no ids; a feature's
    histogram without its trailing empty bins, its co-firing features as ``[feature, tokens]`` (the fraction is
    tokens / fires); ``tokens``, the corpus' (a dead feature's panel says it never fired on them). The script
    unpacks them. ``explanations``: ``explain``'s rows (output/views/explain.py
    ``flat``: the explanation, its scores and its control's), as they are; without them the key is left out and the
    page is the page without explanations."""
    pieces: dict[str, int] = {}

    def idx(text: str) -> int:
        return pieces.setdefault(text, len(pieces))

    shown: dict[int, dict[int, int]] = {}  # window -> position -> piece
    contexts = []
    for c in data["contexts"]:
        start = c["position"] - c["at"]
        held = shown.setdefault(c["window"], {})
        for j, t in enumerate(c["tokens"]):
            held[start + j] = idx(t)
        contexts.append([c["feature"], 0 if c["kind"] == "top" else 1, c["rank"], c["quantile"],
                         _digits(c["lower"], 4), _digits(c["upper"], 4), _digits(c["activation"], 4), c["at"],
                         c["window"], start, [_digits(a, 3) for a in c["activations"]]])
    order = {w: i for i, w in enumerate(shown)}
    for row in contexts:
        row[8] = order[row[8]]
    windows = [[held.get(p, -1) for p in range(max(held) + 1)] for held in shown.values()]
    logits = [[e["feature"], 0 if e["side"] == "top" else 1, e["rank"], idx(e["token"]), _digits(e["effect"], 6)]
              for e in data["logit_effects"]]
    rows = [{**r, "histogram": _trimmed(r["histogram"]),
             **({"cooccurring": [[c["feature"], c["tokens"]] for c in r["cooccurring"]]} if "cooccurring" in r else {})}
            for r in data["features"]]
    out = {"edges": data["histogram_edges"], "tokens": data["tokens"], "features": rows, "pieces": list(pieces),
           "windows": windows, "contexts": contexts, "logits": logits, "font": FONT, "config": CONFIG}
    if explanations:
        out["explanations"] = explanations
    return out


def _digits(x: float | None, n: int) -> float | int | None:
    """``x`` to ``n`` significant digits (its shortest JSON text: a whole number as an int, ``0`` not ``0.0``);
    None stays None."""
    if x is None:
        return None
    v = float(f"{x:.{n}g}")
    return int(v) if v.is_integer() and abs(v) < 2 ** 53 else v


def _trimmed(counts: list[int]) -> list[int]:
    """A histogram without its trailing empty bins (the page reads a missing bin as empty)."""
    end = len(counts)
    while end and not counts[end - 1]:
        end -= 1
    return counts[:end]


def figure(data: dict[str, Any], cap: Caption, explanations: list[dict[str, Any]] | None = None) -> Page:
    """The dashboard page of ``data`` (:func:`anatomy_cli.output.views.features.report`'s data, the JSON record,
    or the same fields read back from ``features --out DIR``); with ``explanations`` (``explain``'s rows) the
    list gains the explanation and its scores (sortable, searched) and each panel shows them. A dictionary too weak
    to read (``data["fit_report"]["warning"]``) has that warning above the list."""
    page = caption_page(cap)
    explained = bool(explanations)
    scored = ('<option value="detection_balanced_accuracy">detection score</option>'
              '<option value="fuzz_balanced_accuracy">fuzzing score</option>') if explained else ""
    controls = ('<div class="controls"><label>search <input id="fx-search" type="search" size="24" '
                f'placeholder="feature id or {"token or explanation" if explained else "token"} text"></label>'
                '<label>sort by <select id="fx-sort"><option value="frequency">frequency</option>'
                f'<option value="max_activation">max activation</option>{scored}'
                '<option value="feature">index</option></select></label><span id="fx-count"></span></div>')
    more = "<th>detection</th><th>fuzzing</th><th>explanation</th>" if explained else ""
    body = (f'<div class="fx-wrap{" explained" if explained else ""}"><div class="fx-list"><table class="data" '
            'id="fx-list"><thead><tr><th>feature</th><th>frequency</th><th>max</th><th>mean</th><th>status</th>'
            f'{more}<th>promotes</th></tr></thead><tbody></tbody></table></div><div class="fx-panel" id="fx-panel">'
            '</div></div>')
    script = resources.files("anatomy_cli.output.html").joinpath("features.js").read_text(encoding="utf-8")
    weak = (data.get("fit_report") or {}).get("warning")  # tasks/features.py weak_note's line, as stderr has it
    warning = f'<p class="weak">{esc(weak)}</p>' if weak else ""
    page.add(Part(f"<style>{STYLE}</style>{warning}{controls}{body}<script>(function(){{var D="
                  f"{script_json(page_data(data, explanations))};\n{script}\n}})();</script>"))
    lines = ["frequency: the share of the corpus' tokens where the feature fires; max and mean (over firing tokens) "
             "its activation; a token's shade: its activation over the feature's max (the framed token is the "
             "context's own)",
             f"logit effects: {data['logit_convention']}",
             f"{data['tokens']:,} tokens in {counted(int(data['windows']), 'window')} of {data['ctx']}; see "
             "docs/commands/features.md"]
    if explained:
        lines.insert(1, "explanations: anatomy explain's (explanations.json); detection and fuzzing: delphi's "
                     "balanced accuracy, (TP/P + TN/N) / 2, 0.5 is chance; control: the same scorer on another "
                     "feature's explanation; see docs/commands/explain.md")
    return page.add(notes(lines))
