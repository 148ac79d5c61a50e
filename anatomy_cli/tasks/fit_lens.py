"""`fit-lens jacobian`: fit a Jacobian lens on prompts and write it in jlens' format (the task: its options, checks
and dispatch). The fit itself is :mod:`anatomy_cli.tasks._jacobian_run` (in-process, or on Ray through
:mod:`anatomy_cli.tasks._jacobian_ray`); `fit-lens merge` is :mod:`anatomy_cli.tasks._lens_merge`; `fit-lens tuned`
(a tuned lens on a corpus, tuned-lens' format) is :mod:`anatomy_cli.tasks._tuned_fit`; the options of both:
:mod:`anatomy_cli.tasks._fit_lens_options`.

jlens' estimator exactly (:mod:`anatomy_cli.engine.jacobian_fit`): per prompt (its first ``max_seq_len`` tokens)
one forward of the ids replicated ``dim_batch`` times and ``ceil(d_model / dim_batch)`` backward passes; ``J_l``
averaged over the valid positions (``skip_first`` through the second-to-last), then over the prompts. Prompts
too short to have a valid position are skipped and counted. Blocks are anatomy's (0..L−1, jlens' layers).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.corpus.ray_run import ray_module
from anatomy_cli.declare.commands import when_run
from anatomy_cli.errors import UsageError
from anatomy_cli.models import sites
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import _jacobian_run
from anatomy_cli.tasks._fit_lens_options import FitLensOptions as FitLensOptions
from anatomy_cli.tasks._fit_lens_options import FitLensPlan as FitLensPlan
from anatomy_cli.tasks._jacobian_run import JacobianFit as JacobianFit  # re-exported: the views' result types
from anatomy_cli.tasks._jacobian_run import fitted_prompts
from anatomy_cli.tasks._lens_merge import MergedLens as MergedLens
from anatomy_cli.tasks._lens_merge import merge as merge
from anatomy_cli.tasks.session import busy_threads
from anatomy_cli.tasks.session import check_early

if TYPE_CHECKING:
    from anatomy_cli.engine import Encoded
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks._tuned_fit import TunedFit
    from anatomy_cli.tasks._tuned_fit import TunedPlan
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "fit-lens"
# KIND (positional), the CLI's --prompts FILE (the API's prompt), --out (required: the CLI's and the API's own)
INPUTS = {"kind": None, "prompt": "prompts", "out": "out"}


def before_open(spec: ModelSpec, opts: FitLensOptions) -> None:
    """``tuned``'s ``--ctx`` past a GGUF file's context, refused from its header before the model opens (the open
    imports torch: seconds; :func:`anatomy_cli.tasks.session.check_early`), with the words the opened model's check
    gives; a Jacobian fit's ``--target-layer`` and ``--source-layers`` against its block count
    (:func:`jacobian_blocks`). The CLI and the API (a model given by name or spec)."""
    header = check_early(spec, ctx=opts.ctx)
    if opts.kind != "tuned" and header is not None and header.block_count is not None:
        jacobian_blocks(opts, header.block_count)


def check(opened: Opened, opts: FitLensOptions, encoded: list[Encoded] | None = None) -> FitLensPlan | TunedPlan:
    """Resolves the target and source blocks against the model (before its weights load); refuses an encoder,
    ``--ray`` without Ray installed, and ``encoded`` (the prompts tokenized) when no prompt is long enough.
    ``tuned``: :func:`anatomy_cli.tasks._tuned_fit.check` (a TunedPlan)."""

    if opts.kind == "tuned":
        _tuned_fit = when_run("tasks._tuned_fit")

        return _tuned_fit.check(opened, opts)

    require(opened.info, Need.decoder, command=f"{COMMAND} {opts.kind}")
    if opts.ray:
        ray_module()  # not installed: the one-line error before any weight loads
    sources, target = jacobian_blocks(opts, opened.info.n_layers)
    if encoded is not None:

        fitted_prompts(encoded, opts)
    return FitLensPlan(sources, target)


def jacobian_blocks(opts: FitLensOptions, n: int) -> tuple[tuple[int, ...], int]:
    """A Jacobian fit's source blocks and target block on a model of ``n`` blocks; UsageError for a block out of
    range, a target of 0, or a source at or above the target."""
    target = n - 1 if opts.target_layer is None else sites.check_block(opts.target_layer, n, "--target-layer")
    if target == 0:
        raise UsageError("--target-layer 0 leaves no block below it to fit")
    if opts.source_layers is None:
        return tuple(range(target)), target
    sources = tuple(sorted({sites.check_block(b, n, "--source-layers") for b in opts.source_layers}))
    above = [b for b in sources if b >= target]
    if above:
        raise UsageError(f"--source-layers {','.join(map(str, above))}: every source block must be below the "
                         f"target block {target}")
    return sources, target


def run(lm: Any, encoded: list[Encoded], opts: FitLensOptions, plan: FitLensPlan | TunedPlan) -> JacobianFit | TunedFit:
    """Fits, writes ``opts.out`` (atomically) and returns the summary: a JacobianFit (``lm`` the LoadedModel, or
    with ``opts.ray`` the OpenedModel: the workers load the weights); ``tuned``: a TunedFit, the corpus in
    ``plan``, ``encoded`` empty; on one thread on a busy machine (:func:`~anatomy_cli.tasks.session.busy_threads`).
    Raises UsageError when no prompt is long enough."""
    with nullcontext() if opts.ray else busy_threads(f"{COMMAND} {opts.kind}"):  # --ray: the workers fit
        if opts.kind == "tuned":
            _tuned_fit = when_run("tasks._tuned_fit")

            assert isinstance(plan, _tuned_fit.TunedPlan)  # check() planned a tuned fit
            return _tuned_fit.run(lm, opts, plan)

        assert isinstance(plan, FitLensPlan)  # check() planned a Jacobian fit
        return _jacobian_run.run(lm, encoded, opts, plan)
