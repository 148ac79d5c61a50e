"""`attribute`: which input tokens drove the prediction (Captum), with the completeness check (the task)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks.session import warn_cost
from anatomy_cli.units import counted

if TYPE_CHECKING:
    from collections.abc import Callable
    from collections.abc import Sequence

    from anatomy_cli.analyses.attribute import TokenAttribution
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.gradients import Metric
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "attribute"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Token attribution: how much each input token drove the target's log-probability at the last
position, or logit(target) - logit(foil) with --foil. One row per token: its attribution and its
share, attribution / sum of |attributions|.

Integrated gradients must pass its completeness check: the attributions add up to f(prompt) -
f(baseline) within --max-rel-error, the steps doubled from --steps up to --max-steps, else exit 1
(--allow-unconverged prints the result marked unconverged).

Examples:

\b
    anatomy attribute "The capital of Germany is" --target " Berlin" -m SmolLM2-135M-Instruct.Q4_1.gguf
    anatomy attribute "The Eiffel Tower is in the city of" --target " Paris" --foil " Rome" --check
    anatomy attribute "The capital of France is" --target " Paris" --layer 10 --site mlp_out
    anatomy attribute "Thank you very" --target " much" --method occlusion --plot much.png
"""
API_HELP = """`anatomy attribute`: how much each input token drove log p(target) at the last position (or
logit(target) - logit(foil)), by Captum's ``method``. ``result``: TokenAttribution; rows: ``rows``
(one per token)."""


class AttributionMethod(str, Enum):
    saliency = "saliency"
    input_x_gradient = "input-x-gradient"
    integrated_gradients = "integrated-gradients"
    occlusion = "occlusion"


class Baseline(str, Enum):
    pad = "pad"
    unk = "unk"
    mean = "mean"
    zero = "zero"
    drop = "drop"


class Site(str, Enum):
    """``--site``: the sites of :mod:`anatomy_cli.models.sites` integrated gradients runs at with ``--layer``
    (:data:`anatomy_cli.engine.integrated.SITES`)."""

    resid_pre = sites.Site.resid_pre.value
    attn_out = sites.Site.attn_out.value
    mlp_out = sites.Site.mlp_out.value


@dataclass(frozen=True)
class AttributeOptions(Declared, TokenPair):
    """Captum's ``method`` (integrated gradients from ``steps`` doubled to ``max_steps`` until within
    ``max_rel_error``; ``layer``/``site``: at a block's activation instead of the embeddings), ``baseline``,
    ``check``: occlusion's rank agreement."""

    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    foil: str | None = shared.foil()
    foil_id: int | None = shared.foil_id()
    first_token: bool = shared.first_token(foil=True)
    method: AttributionMethod = option(
        AttributionMethod.integrated_gradients, "--method", case_sensitive=False,
        help="saliency: gradient norm per token; input-x-gradient; integrated-gradients (--steps, --baseline); "
        "occlusion: drop or replace one token at a time, no gradients.")
    steps: int = option(32, "--steps", min=1, help="Integrated gradients: points on the path to start with "
                        "(Gauss-Legendre); doubled until --max-rel-error is met.")
    baseline: Baseline | None = option(
        None, "--baseline", case_sensitive=False, show_default=False,
        help="Integrated gradients: pad (default), unk, mean (the mean embedding) or zero at every position but "
        "the first (see --vary-first). zero converges badly on pre-norm models: their first norm divides the "
        "embedding's scale out, so f changes almost only in a sliver of the path next to 0 that the steps miss. "
        "Occlusion: drop (default: the token is removed), or its embedding replaced by pad, unk, mean or "
        "zero.")
    max_rel_error: float = option(
        0.05, "--max-rel-error", min=0.0, help="Integrated gradients: the completeness bound, |sum of attributions "
        "- (f(x) - f(baseline))| / |f(x) - f(baseline)|; missed: the steps are doubled up to --max-steps, then "
        "exit 1.")
    max_steps: int = option(256, "--max-steps", min=1, help="Integrated gradients: the most steps the doubling "
                            "goes to.")
    allow_unconverged: bool = option(False, "--allow-unconverged", help="Print integrated gradients that missed "
                                     "--max-rel-error (marked unconverged) instead of exit 1.")
    vary_first: bool = option(
        False, "--vary-first", help="Integrated gradients: the baseline replaces the first position too. By default "
        "it keeps its own embedding (attribution 0): the first position is the attention sink, and moving it makes "
        "f jump along the path.")
    check: bool = option(False, "--check", help="Run occlusion too (replacing by the same baseline) and report "
                         "Spearman's rank correlation between the two per-token rankings.")
    layer: int | None = option(None, "--layer", min=0, show_default=False,
                               help="Integrated gradients at block L's --site activation (Captum "
                               "LayerIntegratedGradients): one row per position of that activation.")
    site: Site = option(Site.resid_pre, "--site", case_sensitive=False, help="With --layer: resid_pre (block "
                        "input), attn_out or mlp_out (what attention / the MLP adds).")
    batch_size: int = shared.batch_size(32, "Integrated-gradient steps or occluded prompts per forward pass.")

    def __post_init__(self) -> None:
        super().__post_init__()  # the declared limits: --steps, --max-rel-error, --max-steps, --layer, --batch-size
        object.__setattr__(self, "method", AttributionMethod(self.method))
        object.__setattr__(self, "site", Site(getattr(self.site, "value", self.site)))
        if self.baseline is not None:
            object.__setattr__(self, "baseline", Baseline(self.baseline))
        self.check_tokens()
        self.require_target("--target TEXT or --target-id N is required: the token whose prediction is explained, "
                            "e.g. --target ' much'")
        _check_baseline(self.method.value, self.baseline)
        _check_ig_options(self.method.value, self.check, self.layer)


def check(opened: Opened, opts: AttributeOptions) -> dict[str, int | None]:
    """Every refusal before the weights load; returns the token ids ``{"target": id, "foil": id or None}``."""
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    if opts.layer is not None:
        sites.check_block(opts.layer, opened.info.n_layers, "--layer", negative=False)
    return opts.resolve(opened)


def run(lm: LoadedModel, encoded: list[Encoded], opts: AttributeOptions,
        ids: dict[str, int | None]) -> list[TokenAttribution]:
    method = opts.method.value
    # A forward and a backward (about twice a forward) per integrated-gradients step; occlusion one forward per token.
    passes = {"integrated-gradients": 3 * opts.steps, "occlusion": max((len(e) for e in encoded), default=0)}
    warn_cost(f"attribute: {method}", lm,
              sum(passes.get(method, 3) * cost.forward_flops(lm.info, len(e)) for e in encoded))
    out = []
    for enc in encoded:
        with notes.status(f"attribute: {method}") as line:
            out.append(run_one(lm, enc, ids, opts, progress=line.counter("attribute", "steps")))
    return out


def run_one(lm: LoadedModel, enc: Encoded, ids: dict[str, int | None], opts: AttributeOptions,
            progress: Callable[[int, int], None] | None = None) -> TokenAttribution:
    """The attribution of one prompt. Raises AnatomyError when integrated gradients stays unconverged and not
    ``allow_unconverged``. ``progress(steps done, steps planned)``: integrated gradients' steps."""
    from anatomy_cli.analyses import attribute as analysis
    from anatomy_cli.engine import token_attribution

    target = ids["target"]
    assert target is not None  # resolve_pair always gives the target
    metric = analysis.metric_fn(target, ids["foil"])
    got = token_attribution.attribute_tokens(
        lm, enc.ids, metric, opts.method.value, steps=opts.steps,
        baseline=opts.baseline.value if opts.baseline else None, batch_size=opts.batch_size,
        max_steps=opts.max_steps, max_rel_error=opts.max_rel_error, keep_first=not opts.vary_first,
        layer=opts.layer, site=opts.site.value, progress=progress)
    result = analysis.token_attribution(
        got.method, "logit_diff" if ids["foil"] is not None else "logprob", enc.ids, enc.pieces, got.scores,
        got.metric, baseline=got.baseline, steps=got.steps, baseline_metric=got.baseline_metric, delta=got.delta,
        max_rel_error=opts.max_rel_error if got.converged is not None else None, tries=got.tries,
        kept_first=got.kept_first, layer=got.layer, site=got.site)
    if result.converged is False and not opts.allow_unconverged:
        raise AnatomyError(_unconverged(result))
    return _with_check(lm, enc.ids, metric, result, opts.batch_size) if opts.check else result


def _check_baseline(method: str, baseline: Baseline | None) -> None:
    if baseline is None:
        return
    if method in ("saliency", "input-x-gradient"):
        raise UsageError(f"--baseline is for integrated-gradients and occlusion; {method} takes none")
    if method == "integrated-gradients" and baseline is Baseline.drop:
        raise UsageError("--baseline drop is for occlusion: integrated gradients needs a baseline of the same "
                         "length (zero, pad or unk)")


def _check_ig_options(method: str, check: bool, layer: int | None) -> None:
    if layer is not None and method != "integrated-gradients":
        raise UsageError(f"--layer is for integrated-gradients; {method} attributes to the input tokens only")
    if check and method == "occlusion":
        raise UsageError("--check compares with occlusion: use it with another --method")
    if check and layer is not None:
        raise UsageError("--check compares per-token rankings; with --layer the rows are a layer's positions")


def _with_check(lm: LoadedModel, token_ids: Sequence[int], metric: Metric, result: TokenAttribution,
                batch_size: int) -> TokenAttribution:
    """``result`` with the agreement check: occlusion by the same baseline (drop when the method has none)."""
    from anatomy_cli.analyses import attribute as analysis
    from anatomy_cli.engine import token_attribution

    baseline = result.baseline or "drop"
    if baseline == "drop" and len(token_ids) < 2:
        raise UsageError("--check: occlusion by dropping needs at least 2 tokens")
    occ = token_attribution.attribute_tokens(lm, token_ids, metric, "occlusion", baseline=baseline,
                                             batch_size=batch_size)
    return dataclasses.replace(result, check=analysis.agreement(result, "occlusion", baseline, occ.scores))


def _unconverged(result: TokenAttribution) -> str:
    c = result.completeness
    assert c is not None
    tries = ", ".join(f"{counted(n, 'step')} {e:.3g}" for n, e in c.tries)
    return (f"integrated gradients did not converge: relative error {c.relative_error:.3g} > --max-rel-error "
            f"{c.max_rel_error:g} (sum of attributions {c.sum_attributions:.4f} vs f(x) - f(baseline) "
            f"{c.difference:.4f}; tried {tries}); raise --max-steps, try another --baseline, or pass "
            "--allow-unconverged")


OPTIONS = AttributeOptions  # the options class the driver generates the CLI options and API keywords from
