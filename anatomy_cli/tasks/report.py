"""`report`: every analysis of one prompt, from as few forward passes as the analyses allow (the task).

:class:`ReportOptions` holds the sections asked for (parsed and checked before anything opens); :func:`analyse`
computes what they draw into an :class:`Anatomy`, which :mod:`anatomy_cli.output.html.report` lays out.

Two forwards at most: one :func:`engine.run` capturing every hook point the sections need (residual
stream, attention and MLP outputs, ``hook_z``, logits at every position) serves the embedding, the
trace, the logit lens, the direct logit attribution and the next-token distribution; one eager-attention
forward (:func:`engine.attention_patterns`) of the prompt and the repeated random sequence serves the
attention patterns and the head scores (sdpa, the default attention, returns no weights).
No torch at import time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from typing import Optional

from anatomy_cli import engine
from anatomy_cli.declare.commands import when_run
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.session import describe

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.dla import Attribution
    from anatomy_cli.analyses.heads import Heads
    from anatomy_cli.analyses.lens import LensGrid
    from anatomy_cli.analyses.next_token import NextTokens
    from anatomy_cli.analyses.next_token import TokenProb
    from anatomy_cli.analyses.params.breakdown import ParamsResult
    from anatomy_cli.analyses.trace import Trace
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.cache import Cache

COMMAND = "report"
SECTIONS = ("tokens", "embedding", "residual", "lens", "attention", "heads", "dla", "next")
NEEDS_RUN = {"embedding", "residual", "lens", "dla", "next"}
NEEDS_ATTENTION = {"attention", "heads"}
HEADS_SEQ_LEN = 50  # the heads command's default; shortened to fit a small context


@dataclass(frozen=True)
class ReportOptions(Declared):
    """``sections``: the page's sections, in the page's order (None: all of :data:`SECTIONS`; the text ``NAME,...``
    of ``--sections`` or a sequence of names); ``k``: the next tokens listed and the trace's top tokens."""

    sections: tuple[str, ...] | None = option(
        None, "--sections", metavar="NAME,...", show_default=False, cli=Optional[str],
        help=f"Only these sections, in the page's order: {', '.join(SECTIONS)}. Default: all.")
    k: int = option(10, "--top", "-k", min=1, metavar="N", help="The next tokens listed and the trace's top tokens.")

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.sections, str):
            text = self.sections
            wanted = tuple(s.strip() for s in text.split(",") if s.strip())
            if not wanted or any(s not in SECTIONS for s in wanted):
                raise UsageError(f"--sections {text!r}: use names from {', '.join(SECTIONS)}, separated by commas")
            object.__setattr__(self, "sections", wanted)
        elif self.sections is not None:
            object.__setattr__(self, "sections", tuple(self.sections))
            unknown = [s for s in self.sections if s not in SECTIONS]
            if unknown or not self.sections:
                raise UsageError(f"--sections {','.join(self.sections)!r}: use names from {', '.join(SECTIONS)}, "
                                 "separated by commas")

    @property
    def chosen(self) -> list[str]:
        """The sections in the page's order."""
        return list(SECTIONS) if self.sections is None else [s for s in SECTIONS if s in self.sections]


Pooling = tuple[Callable[[int, int, bool], int], Callable[["torch.Tensor", int], "torch.Tensor"]]
"""``(block_factor(n, n_heads_total, causal), pool(pattern, f))``: how the attention patterns are shrunk for the
page (the caller's: output.html.attn's); None keeps every position."""


@dataclass
class Anatomy:
    """What the sections draw; a field is None when its section was not asked for or does not apply."""

    lm: LoadedModel
    enc: Encoded
    params: ParamsResult | None = None  # None when the model's files cannot be read
    embedding: torch.Tensor | None = None  # float [pos, d_model] on the CPU: the residual stream's row 0
    trace: Trace | None = None  # at the last position
    lens: LensGrid | None = None  # top 5 per cell
    patterns: torch.Tensor | None = None  # float [n_layers, n_heads, m, m]: pos x pos in blocks of `block` positions
    block: int = 1
    heads: Heads | None = None
    dla: Attribution | None = None  # of the top prediction
    dla_what: str | None = None
    next: NextTokens | None = None
    forwards: int = 0


def analyse(lm: LoadedModel, enc: Encoded, sections: set[str], *, model: str, k: int = 10,
            pooling: Pooling | None = None) -> Anatomy:
    """Run ``lm`` on ``enc`` once (plus one eager-attention forward when attention is asked for) and compute
    every analysis ``sections`` needs (``pooling``: see :data:`Pooling`). Raises what the engine and the
    analyses raise."""
    from anatomy_cli.analyses import lens as lens_analysis
    from anatomy_cli.analyses import next_token
    from anatomy_cli.analyses import trace

    out = Anatomy(lm=lm, enc=enc)
    name_token = describe(lm)
    try:
        params_analysis = when_run("analyses.params")

        out.params = params_analysis.analyse(model)
    except Exception:
        out.params = None
    if sections & NEEDS_RUN:
        names = engine.residual_names(lm) + engine.layer_names(lm, "attn_out") + engine.layer_names(lm, "mlp_out")
        if sites.Whole.pos_embed in lm.points:
            names.append(sites.Whole.pos_embed.value)
        z_names = sites.names(range(lm.n_layers), sites.Point.attn_z)
        if "dla" in sections and all(n in lm.points for n in z_names):
            names += z_names
        if lm.has_unembed:
            names.append("logits")
        (cache,) = engine.run(lm, [enc], names)
        out.forwards += 1
        resid = cache.residual_stream()                                     # [L + 1, pos, d_model]
        out.embedding = resid[0].detach().float().cpu()
        if lm.has_unembed:
            last = resid[:, -1]
            out.trace = trace.trace(last, attn_out=cache.stack("attn_out")[:, -1],
                                    mlp_out=cache.stack("mlp_out")[:, -1],
                                    lens_logits=engine.unembed(lm, last), logits=cache.logits[-1], k=k,
                                    describe=name_token)
            out.lens = lens_analysis.lens_grid(resid, lambda h: engine.unembed(lm, h), describe=name_token,
                                               positions=cache.positions, k=5)
            out.next = next_token.next_tokens(cache.logits[-1], k, describe=name_token)
            if "dla" in sections and lm.is_causal and not lm.adapter.post_ln:
                out.dla, out.dla_what = _dla(lm, cache, out.next.top[0])
    if sections & NEEDS_ATTENTION:
        _attention(lm, enc, out, pooling)
    return out


def _attention(lm: LoadedModel, enc: Encoded, out: Anatomy, pooling: Pooling | None) -> None:
    """The eager-attention forward of the prompt and the repeated random sequence: ``out.patterns`` (pooled
    for the page), ``out.heads`` (the head scores; prompts of two tokens or more)."""
    import torch

    from anatomy_cli.analyses import heads as heads_analysis

    n_ctx = lm.n_ctx or 2 * HEADS_SEQ_LEN + 2
    seq_len = max(2, min(HEADS_SEQ_LEN, (n_ctx - 2) // 2))
    ids = heads_analysis.random_repeat(engine.ordinary_token_ids(lm), seq_len, 0)
    rand = engine.encode_ids(lm, ids, text=f"<{seq_len} random tokens, seed 0, repeated>")
    start = rand.special.index(False)
    out.block = 1 if pooling is None else pooling[0](len(enc), lm.n_layers * lm.n_heads, lm.is_causal)
    on_prompt: dict[int, torch.Tensor] = {}

    def reduce(i: int, layer: int, p: torch.Tensor) -> torch.Tensor:
        if i == 1:
            return torch.cat([heads_analysis.pattern_scores(p),
                              heads_analysis.repeat_scores(p, start=start, seq_len=seq_len)])
        if len(enc) >= 2:
            on_prompt[layer] = heads_analysis.pattern_scores(p).cpu()
        # the page's blocks: a long prompt's full patterns never stay in memory
        return p if pooling is None else pooling[1](p, out.block)

    out.patterns, scores = engine.attention_patterns(lm, [enc, rand], reduce=reduce)
    out.forwards += 1
    if len(enc) >= 2:
        prompt_scores = torch.stack([on_prompt[layer] for layer in range(lm.n_layers)])
        out.heads = heads_analysis.heads(prompt_scores, scores[:, 3:], measured_on="prompt", seq_len=seq_len,
                                         seed=0, random_token_ids=ids[:seq_len])


def _dla(lm: LoadedModel, cache: Cache, top: TokenProb) -> tuple[Attribution, str]:
    """Direct logit attribution of the top prediction at the last position, by head where the architecture
    allows it (else by layer), from the shared cache: the same :func:`analyses.dla.logit_attribution` as
    ``anatomy dla``."""
    from anatomy_cli.analyses.dla import logit_attribution
    from anatomy_cli.engine import decompose

    unembedding = decompose.unembedding_direction(lm, top.token_id, None)
    result = None
    if sites.name(0, sites.Point.attn_z) in cache:
        try:
            result = logit_attribution(lm, cache, top.token_id, by_head=True, row=-1, unembedding=unembedding)
        except AnatomyError:
            pass
    if result is None:
        result = logit_attribution(lm, cache, top.token_id, by_head=False, row=-1, unembedding=unembedding)
    if (mismatch := result.mismatch()) is not None:
        notes.warn(mismatch)
    return result, f"logit({top.token})"
