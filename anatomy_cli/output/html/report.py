"""`anatomy report`: the anatomy of one prompt on one page, in the order of the GPT-2 article.

Header (model, parameter table, dtype, BOS convention, quantization), then the sections: tokens,
embedding, residual stream (trace and logit lens), attention (pattern picker and head scores), direct
logit attribution of the top prediction, next-token distribution; each with one paragraph of
explanation. The figures are the ``part`` functions of the ``--plot FILE.html`` modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import plotly.graph_objects as go

from anatomy_cli.output.html import Page
from anatomy_cli.output.html import Part
from anatomy_cli.output.html import attn as attn_html
from anatomy_cli.output.html import dla as dla_html
from anatomy_cli.output.html import heads as heads_html
from anatomy_cli.output.html import lens as lens_html
from anatomy_cli.output.html import notes
from anatomy_cli.output.html import table
from anatomy_cli.output.html import text
from anatomy_cli.output.html import token
from anatomy_cli.output.html import trace as trace_html
from anatomy_cli.output.html._page import heat_size
from anatomy_cli.output.html._page import layout
from anatomy_cli.output.html._page import plot
from anatomy_cli.output.html._page import ticks
from anatomy_cli.tasks.records import dtype_name
from anatomy_cli.tasks.session import model_label

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.tasks.report import Anatomy

EMBED_DIMS = 64  # dimensions of the embedding drawn (the hover gives each vector's norm over all of them)

EXPLAIN = {
    "tokens": "The model never sees letters. The tokenizer cuts the prompt into pieces from a fixed vocabulary "
              "and replaces each piece by its number, its token id. A dot (·) marks a leading space, ↵ a newline, "
              "and a piece in angle brackets such as <e6 88> is some bytes of a character split across tokens.",
    "embedding": "Each token id picks one row of the embedding matrix: a vector of d_model numbers. Models with "
                 "learned positions (GPT-2) add a second vector for the position; rotary models (Llama, Gemma) "
                 "mix positions in inside attention instead. This is the residual stream's first reading, "
                 "'embed', the input of block 0. Shown: the first dimensions of each position's vector; hover "
                 "for the value and the vector's length.",
    "residual": "The residual stream is the one vector per position that every block reads from and adds to: "
                "attention adds what it gathers from other positions, the MLP (feed-forward network) adds what it "
                "computes from this position alone. Here, at the last position, from 'embed' through each "
                "block's output (block 0 first): how similar the vector stays to the embedding and to the "
                "previous reading, how long it is, and how much each sub-layer adds. Hover a point for the token "
                "the model would predict if it stopped there.",
    "lens": "The logit lens reads the residual stream at every point as if it were the model's output: apply "
            "the final norm and the unembedding to it, at each position, and look at the most probable next "
            "token. Rows are the "
            "readings ('embed' at the bottom, then block 0's output, block 1's, ...), columns the prompt's "
            "positions; colour is the top token's probability. Hover a cell for its five most probable tokens.",
    "attention": "Attention moves information between positions. Each head computes, for every query position, "
                 "weights over the earlier key positions (each row sums to 1) and adds a weighted mix of their "
                 "values. Pick a layer and a head; hover a cell for the query token, the key token and the weight.",
    "heads": "Some heads have recognisable jobs. Entropy: how spread out a head's attention is (0 = all on one "
             "token). First token: how much it parks on position 0, the attention sink. Previous token: weight on "
             "the position just before. Induction: on a random sequence repeated twice, weight on the token after "
             "the earlier copy of the current token, the mechanism behind in-context copying.",
    "dla": "The final residual stream is a sum: embedding plus what every attention layer and MLP added. With the "
           "final norm's scale frozen, the top prediction's logit splits into one term per component, the direct "
           "logit attribution. Positive terms pushed the prediction up; the terms add up to the model's logit.",
    "next": "The model's answer: the unembedding turns the last position's final vector into one score (logit) per "
            "vocabulary token, and the softmax turns the scores into probabilities of the next token.",
}


def page(an: Anatomy, sections: Sequence[str], *, title: str, facts: Sequence[tuple[str, str]],
         params_note: str | None = None) -> Page:
    """The report page for an :class:`anatomy_cli.tasks.report.Anatomy`: ``facts`` (label, value) pairs and
    the parameter table in the header, then ``sections`` in the article's order."""
    result = Page(title=title, lines=[f"prompt: {an.enc.text}"], untrained=bool(an.lm.untrained))
    result.add(table(["", ""], facts))
    if an.params is not None:
        rows = [(r.label, f"{r.parameters:,}", f"{r.share:.1%}") for r in an.params.rows]
        rows.append(("Total", f"{an.params.total:,}", "100.0%"))
        result.add(Part("<h2>parameters</h2>")).add(table(["component", "parameters", "share"], rows,
                                                           numeric=[False, True, True]))
    elif params_note:
        result.add(notes([params_note]))
    pieces = an.enc.pieces
    for name in sections:
        part = _SECTIONS[name](an, pieces)
        if part is None:
            continue
        result.add(text(name if name != "next" else "next-token distribution", EXPLAIN[name]))
        result.add(part)
    return result


def _tokens(an: Anatomy, pieces: Sequence[str]) -> Part:
    chips = "".join(f'<span class="tok">{token(p)}<sub>{i}</sub></span>' for p, i in zip(pieces, an.enc.ids))
    return Part(f"<p>{chips}</p><p class=\"note\">{len(pieces)} tokens; the small number is the token id</p>")


def _embedding(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.embedding is None:
        return None
    emb = an.embedding
    dims = min(EMBED_DIMS, emb.shape[1])
    norms = emb.norm(dim=-1).tolist()
    values = emb[:, :dims].tolist()
    labels = [token(p, 12) for p in pieces]
    hover = [[f"position {q}: {labels[q]}<br>‖vector‖ {norms[q]:.4f} over {emb.shape[1]} dims"
              for _ in range(dims)] for q in range(len(pieces))]
    limit = max(abs(v) for row in values for v in row) or 1.0
    fig = go.Figure(go.Heatmap(z=values, customdata=hover, colorscale="RdBu", reversescale=True, zmid=0,
                               zmin=-limit, zmax=limit, colorbar={"title": {"text": "value", "side": "right"}},
                               hovertemplate="%{customdata}<br>dimension %{x}: %{z:.4f}<extra></extra>"))
    width, height = heat_size(len(pieces), dims, cell_w=14, cell_h=22)
    fig.update_layout(**layout(width=width, height=height))
    fig.update_xaxes(title_text=f"dimension (first {dims} of {emb.shape[1]})")
    fig.update_yaxes(title_text="position", autorange="reversed", **ticks(labels))
    return plot(fig)


def _residual(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.trace is None:
        return None
    return trace_html.part(an.trace)


def _lens(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.lens is None:
        return None
    return lens_html.part(an.lens, "prob", [pieces[p] for p in an.lens.positions])


def _attention(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.patterns is None:
        return None
    return attn_html.part(an.patterns, pieces, causal=an.lm.is_causal, block=an.block)


def _heads(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.heads is None:
        return None
    return heads_html.part(an.heads, an.lm.n_layers, an.lm.n_heads)


def _dla(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.dla is None or an.dla_what is None:  # set together
        return None
    body = dla_html.part(an.dla, an.lm.n_layers, an.lm.n_heads, an.dla_what)
    return Part(body.html + notes([f"{an.dla_what} at the last position: rows add up to {an.dla.total:.4f}, "
                                   f"the model's own logit is {an.dla.logit:.4f}"]).html)


def _next(an: Anatomy, pieces: Sequence[str]) -> Part | None:
    if an.next is None:
        return None
    top = list(an.next.top)
    labels = [f"{t.rank}. {token(t.token, 20)}" for t in top]
    fig = go.Figure(go.Bar(y=labels, x=[t.probability for t in top], orientation="h", marker_color="#4c72b0",
                           customdata=[[t.token_id, t.logprob] for t in top],
                           text=[f"{t.probability:.4f}" for t in top], textposition="outside",
                           hovertemplate="%{y} (id %{customdata[0]})<br>p %{x:.4f} · log p %{customdata[1]:.4f}"
                                         "<extra></extra>"))
    fig.update_layout(**layout(width=760, height=max(300, 30 * len(top) + 120),
                               margin={"l": 160, "r": 60, "t": 30, "b": 50}))
    fig.update_xaxes(title_text="probability of the next token", range=[0, 1.1])
    fig.update_yaxes(autorange="reversed")
    return plot(fig)


_SECTIONS = {"tokens": _tokens, "embedding": _embedding, "residual": _residual, "lens": _lens,
             "attention": _attention, "heads": _heads, "dla": _dla, "next": _next}


def facts(lm: LoadedModel, enc: Encoded) -> list[tuple[str, str]]:
    """The page header's (label, value) pairs: model, architecture, shape, dtype, quantization, BOS, prompt."""
    tok = lm.tokenizer
    bos_piece = tok.piece(tok.bos_id) if tok.bos_id is not None else None
    starts = bool(enc.ids) and tok.bos_id is not None and enc.ids[0] == tok.bos_id
    bos_text = ("this tokenizer has no BOS token" if bos_piece is None else
                f"BOS {bos_piece} (id {tok.bos_id}); this prompt {'starts' if starts else 'does not start'} with it"
                + (f"; bos: {'true' if enc.bos else 'false'} ({enc.bos_source})" if enc.bos_source else ""))
    return [("model", model_label(lm)), ("architecture", type(lm.model).__name__),
            ("shape", f"{lm.n_layers} layers × {lm.n_heads} heads, d_model {lm.d_model}"),
            ("dtype", dtype_name(lm)),
            ("quantization", f"GGUF {lm.dequantized_from}, dequantized to {dtype_name(lm)}" if lm.dequantized_from
             else "none (weights as stored)"),
            ("BOS convention", bos_text), ("prompt", f"{len(enc)} tokens")]
