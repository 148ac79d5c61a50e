"""`ablate`: knock out each block's attention / MLP output (or each head) and measure the target (the task)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._attribution import Extra
from anatomy_cli.tasks._attribution import Method
from anatomy_cli.tasks._attribution import TokenPair
from anatomy_cli.tasks._attribution import check_options
from anatomy_cli.tasks._checks import at_least
from anatomy_cli.text.positions import check_position

if TYPE_CHECKING:
    from anatomy_cli.analyses.ablate import Ablation
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel

COMMAND = "ablate"


class AblateMode(str, Enum):
    zero = "zero"
    mean = "mean"


@dataclass(frozen=True)
class AblateOptions(TokenPair):
    """What to knock out (``heads``: each head; ``layer``: only that block) and how (``mode``); ``position``: where
    the metric is read; ``method``/``check``: exact runs, or attribution estimates with N checked exactly."""

    position: int = -1
    heads: bool = False
    mode: AblateMode = AblateMode.zero
    method: Method = Method.exact
    check: int = 0
    layer: int | None = None
    batch_size: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", AblateMode(self.mode))
        object.__setattr__(self, "method", Method(self.method))
        self.check_tokens()
        check_options(self.method, self.check)
        at_least("--batch-size", self.batch_size)
        self.require_target("--target TEXT or --target-id N is required: the token whose log-probability "
                            "ablations change, e.g. --target ' much'")


@dataclass(frozen=True)
class AblatePlan:
    ids: dict[str, int | None]
    layer: int | None  # the block (negative counted from the last), None: every block


@dataclass(frozen=True)
class AblateResult:
    """One prompt's ablations: ``ablation`` (Ablation), the metric read at ``position``, ``extra`` (what
    ``--method attribution`` adds, else None)."""

    position: int
    ablation: Ablation
    extra: Extra | None
    ids: dict[str, int | None]


def check(opened: Any, opts: AblateOptions, encoded: list[Encoded]) -> AblatePlan:
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    layer = None if opts.layer is None else sites.check_block(opts.layer, opened.info.n_layers, "--layer")
    check_position(opts.position, encoded)
    return AblatePlan(opts.resolve(opened), layer)


def run(lm: LoadedModel, encoded: list[Encoded], opts: AblateOptions, plan: AblatePlan) -> list[AblateResult]:
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.engine import interventions
    from anatomy_cli.tasks.session import warn_cost

    rows = interventions.ablation_rows(lm, components=["head"] if opts.heads else ["attn", "mlp"],
                                       mode=opts.mode.value, layers=None if plan.layer is None else [plan.layer])
    target = plan.ids["target"]
    assert target is not None  # resolve_pair always gives the target
    metric = analysis.metric_fn(target, plan.ids["foil"])
    if opts.method is Method.exact:
        from anatomy_cli.models import cost

        warn_cost(f"ablate: {len(rows) * len(encoded):,} ablated runs", lm,
                  sum((len(rows) + 1) * cost.forward_flops(lm.info, len(e)) for e in encoded))
    out = []
    for enc in encoded:
        with notes.status("ablate") as line:
            ablation, extra = run_one(lm, enc, rows, metric, plan.ids, opts,
                                      progress=line.counter("ablate", "ablated runs"))
        out.append(AblateResult(opts.position % len(enc), ablation, extra, plan.ids))
    return out


def run_one(lm: LoadedModel, enc: Encoded, rows: list[Any], metric: Any, ids: dict[str, int | None],
            opts: AblateOptions, progress: Any = None) -> tuple[Ablation, Extra | None]:
    """``(Ablation, attribution extra or None)`` for one prompt. ``progress(runs done, runs)``: the ablated runs
    (not the attribution estimate)."""
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.engine import interventions
    from anatomy_cli.tasks import _attribution

    extra = None
    if opts.method is Method.attribution:
        base, edited, extra = _attribution.ablate(lm, enc.ids, rows, metric, position=opts.position,
                                                  check=opts.check, batch_size=opts.batch_size)
    else:
        base, edited = interventions.run_edits(lm, enc.ids, [edits for *_, edits in rows], position=opts.position,
                                               batch_size=opts.batch_size, reduce=metric, progress=progress)
        base = float(base[0])
    ablation = analysis.ablation("logit_diff" if ids["foil"] is not None else "logprob", opts.mode.value,
                                 [key for *key, _ in rows], edited, base)
    return ablation, extra
