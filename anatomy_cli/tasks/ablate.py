"""`ablate`: knock out each block's attention / MLP output (or each head, or each routed expert of an MoE block)
and measure the target (the task)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import cost
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import _attribution
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._attribution import Extra
from anatomy_cli.tasks._attribution import Method
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks._attribution import check_option
from anatomy_cli.tasks._attribution import check_options
from anatomy_cli.tasks._attribution import method_option
from anatomy_cli.tasks.session import warn_cost
from anatomy_cli.text.positions import check_position

if TYPE_CHECKING:
    from collections.abc import Callable

    from anatomy_cli.analyses.ablate import Ablation
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.gradients import Metric
    from anatomy_cli.models.info import ModelInfo
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "ablate"

# The command's --help (the prompt driver, cli/driver.py) and its API function's docstring (api/_driven.py).
HELP = """Knock out each layer's attention output, then its MLP output (or, with --heads, each head; with
--experts, each routed expert of each MoE block), and
report the target's log-probability at --position, or logit(target) - logit(foil) with --foil,
and its change from the intact run.

The knocked-out output is replaced at every position: by zeros (--mode zero) or by its mean
over the prompt's positions (--mode mean); a routed expert (--experts) is removed from the router's
candidates before the top k (--mode reroute, its default) or its weighted output dropped (--mode zero).
All ablations of a prompt run in a few batched forwards;
--method attribution estimates them all from one backward, (a_ablated - a) . dm/da; --check N reruns
the N largest exactly.

Examples:

\b
    anatomy ablate "The capital of Germany is" --target " Berlin" -m SmolLM2-135M-Instruct.Q4_1.gguf
    anatomy ablate "The capital of Germany is" --target " Berlin" --foil " Paris" --mode mean
    anatomy ablate "Thank you very" --target " much" --heads --layer -1 --format json
    anatomy ablate "Thank you very" --target " much" --heads --method attribution --check 8
    anatomy ablate "Thank you very" --target " much" --experts --layer 3 -m allenai/OLMoE-1B-7B-0924
"""
API_HELP = """`anatomy ablate`: each attention and MLP output (``heads``: each head) zeroed or mean-ablated (``mode``,
default ``zero``), or with ``experts`` each routed expert of each MoE block rerouted around or zeroed (default
``reroute``), and the change of log p(target) (or logit(target) - logit(foil)) at ``position``. ``result``:
Ablation; rows: ``rows`` (one per component)."""


class AblateMode(str, Enum):
    zero = "zero"
    mean = "mean"
    reroute = "reroute"  # --experts only: the expert removed from the router's candidates before top k


@dataclass(frozen=True)
class AblateOptions(Declared, TokenPair):
    """What to knock out (``heads``: each head; ``experts``: each routed expert of an MoE block; ``layer``: only
    that block) and how (``mode``; None: ``reroute`` with ``experts``, else ``zero``); ``position``: where the
    metric is read; ``method``/``check``: exact runs, or attribution estimates with N checked exactly."""

    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    foil: str | None = shared.foil()
    foil_id: int | None = shared.foil_id()
    first_token: bool = shared.first_token(foil=True)
    position: int = option(-1, "--position", "-p", metavar="N",
                           help="Where to read the metric (0-based; negative from the end).")
    heads: bool = option(False, "--heads", help="Ablate every attention head separately (its slice of the output "
                         "projection's input) instead of whole attention and MLP outputs.")
    experts: bool = option(False, "--experts", help="Knock out each routed expert of each MoE block (with --layer: "
                           "of that block) separately, at every position (Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE; "
                           "Qwen2-MoE's shared expert has no index and stays).")
    mode: AblateMode | None = option(None, "--mode", case_sensitive=False, show_default=False,
                                     help="zero (default): replace the output by zeros, with --experts drop the "
                                     "expert's weighted output; mean: by its mean over the prompt's positions; "
                                     "reroute (--experts, its default): the expert's router logit set to -inf before "
                                     "the top k, the family's normalisation as usual.")
    method: Method = method_option()
    check: int = check_option()
    layer: int | None = option(None, "--layer", "-l", metavar="L", show_default=False,
                               help="Only layer L (0-based; negative from the end); with --experts an MoE block.")
    batch_size: int = shared.batch_size(32, "Ablated runs per forward pass (more: faster, more memory).")

    def __post_init__(self) -> None:
        super().__post_init__()
        default = AblateMode.reroute if self.experts else AblateMode.zero
        object.__setattr__(self, "mode", default if self.mode is None else AblateMode(self.mode))
        object.__setattr__(self, "method", Method(self.method))
        _check_experts(self)
        self.check_tokens()
        check_options(self.method, self.check)
        self.require_target("--target TEXT or --target-id N is required: the token whose log-probability "
                            "ablations change, e.g. --target ' much'")


def _check_experts(opts: AblateOptions) -> None:
    """The refusals of ``--experts`` (and of ``--mode reroute`` without it) that need no model."""
    if not opts.experts:
        if opts.mode is AblateMode.reroute:
            raise UsageError("--mode reroute knocks out a routed expert: it needs --experts")
        return
    if opts.heads:
        raise UsageError("--experts and --heads are two different ablations: pass one of them")
    if opts.mode is AblateMode.mean:
        raise UsageError("--experts takes --mode reroute (the default) or --mode zero, not mean")
    if opts.method is not Method.exact:
        raise UsageError("--experts runs each ablation exactly: --method attribution does not estimate a change "
                         "of routing")


@dataclass(frozen=True)
class AblatePlan:
    ids: dict[str, int | None]
    layer: int | None  # the block (negative counted from the last), None: every block
    blocks: tuple[int, ...] = ()  # --experts: the MoE blocks whose experts are knocked out


@dataclass(frozen=True)
class AblateResult:
    """One prompt's ablations: ``ablation`` (Ablation), the metric read at ``position``, ``extra`` (what
    ``--method attribution`` adds, else None)."""

    position: int
    ablation: Ablation
    extra: Extra | None
    ids: dict[str, int | None]


def check(opened: Opened, opts: AblateOptions, encoded: list[Encoded]) -> AblatePlan:
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    if opts.experts:
        require(opened.info, Need.moe, command=f"{COMMAND} --experts")
    layer = None if opts.layer is None else sites.check_block(opts.layer, opened.info.n_layers, "--layer")
    check_position(opts.position, encoded)
    blocks = _moe_blocks(opened.info, layer) if opts.experts else ()
    return AblatePlan(opts.resolve(opened), layer, blocks)


def _moe_blocks(info: ModelInfo, layer: int | None) -> tuple[int, ...]:
    """``--experts``' blocks: ``layer`` (refused when its MLP is dense), else every MoE block."""
    assert info.moe is not None  # check required Need.moe
    sparse = tuple(info.moe.sparse_blocks)
    if layer is None:
        return sparse
    if layer not in sparse:
        raise UsageError(f"--layer {layer}: that block of {info.display_name} has a dense MLP, no "
                         f"experts; its MoE blocks are {', '.join(str(b) for b in sparse)}")
    return (layer,)


def run(lm: LoadedModel, encoded: list[Encoded], opts: AblateOptions, plan: AblatePlan) -> list[AblateResult]:
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.engine import expert_edits
    from anatomy_cli.engine import interventions

    assert opts.mode is not None  # __post_init__ chose it
    rows: list[Any]
    if opts.experts:
        rows = expert_edits.rows(lm, plan.blocks, "zero" if opts.mode is AblateMode.zero else "reroute")
    else:
        rows = interventions.ablation_rows(lm, components=["head"] if opts.heads else ["attn", "mlp"],
                                           mode="mean" if opts.mode is AblateMode.mean else "zero",
                                           layers=None if plan.layer is None else [plan.layer])
    target = plan.ids["target"]
    assert target is not None  # resolve_pair always gives the target
    metric = analysis.metric_fn(target, plan.ids["foil"])
    if opts.method is Method.exact:

        warn_cost(f"ablate: {len(rows) * len(encoded):,} ablated runs", lm,
                  sum((len(rows) + 1) * cost.forward_flops(lm.info, len(e)) for e in encoded))
    out = []
    for enc in encoded:
        with notes.status("ablate") as line:
            ablation, extra = run_one(lm, enc, rows, metric, plan.ids, opts,
                                      progress=line.counter("ablate", "ablated runs"))
        out.append(AblateResult(opts.position % len(enc), ablation, extra, plan.ids))
    return out


def run_one(lm: LoadedModel, enc: Encoded, rows: list[Any], metric: Metric, ids: dict[str, int | None],
            opts: AblateOptions, progress: Callable[[int, int], None] | None = None) -> tuple[Ablation, Extra | None]:
    """``(Ablation, attribution extra or None)`` for one prompt. ``progress(runs done, runs)``: the ablated runs
    (not the attribution estimate)."""
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.engine import interventions

    extra = None
    if opts.method is Method.attribution:
        base, edited, extra = _attribution.ablate(lm, enc.ids, rows, metric, position=opts.position,
                                                  check=opts.check, batch_size=opts.batch_size)
    else:
        base, edited = interventions.run_edits(lm, enc.ids, [edits for *_, edits in rows], position=opts.position,
                                               batch_size=opts.batch_size, reduce=metric, progress=progress)
        base = float(base[0])
    assert opts.mode is not None  # __post_init__ chose it
    ablation = analysis.ablation("logit_diff" if ids["foil"] is not None else "logprob", opts.mode.value,
                                 [key for *key, _ in rows], edited, base)
    return ablation, extra


def carried(result: AblateResult) -> object:
    """What the API's Result carries of one prompt's result."""
    return result.ablation


OPTIONS = AblateOptions  # the options class the driver generates the CLI options and API keywords from
