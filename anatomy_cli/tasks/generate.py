"""`generate`: the continuation token by token through the KV cache, a per-step trace, optionally steered (the
task).

:class:`GenerateOptions` holds the lengths, the lens, the cache check and the sweep's target, with the sampling
options (:class:`SamplingOptions`) and the steering options (:class:`~anatomy_cli.tasks._steering.SteeringOptions`)
as one dataclass each; :func:`check` refuses, before any weight loads, a model that cannot generate and a vector
that does not fit; :func:`run` computes one :class:`Generated` per prompt.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace
from typing import TYPE_CHECKING
from typing import Any

from anatomy_cli.declare import shared
from anatomy_cli.declare.fields import Declared
from anatomy_cli.declare.fields import option
from anatomy_cli.errors import UsageError
from anatomy_cli.models import lens_choice
from anatomy_cli.models.capabilities import Need
from anatomy_cli.models.capabilities import require
from anatomy_cli.tasks import notes
from anatomy_cli.tasks._steering import SteeringOptions
from anatomy_cli.tasks._steering import record as steering_record
from anatomy_cli.tasks._steering import vector as steering_vector
from anatomy_cli.tasks._stream import decode
from anatomy_cli.tasks._stream import recording
from anatomy_cli.tasks._stream import streamed
from anatomy_cli.tasks.lens import fitted_lens
from anatomy_cli.tasks.session import describe
from anatomy_cli.text import targets

if TYPE_CHECKING:
    import torch

    from anatomy_cli.analyses.generate import Continuation
    from anatomy_cli.analyses.generate import Sweep
    from anatomy_cli.analyses.next_token import Describe
    from anatomy_cli.engine import Encoded
    from anatomy_cli.engine import LoadedModel
    from anatomy_cli.engine.fitted_lens import FittedLens
    from anatomy_cli.engine.generate import Generation
    from anatomy_cli.engine.hooks import HookFn
    from anatomy_cli.engine.steering import SteeringVector
    from anatomy_cli.tasks.protocol import Opened

COMMAND = "generate"

__all__ = ["COMMAND", "GenerateOptions", "SamplingOptions", "SteeringOptions", "check", "check_plot", "run"]


@dataclass(frozen=True)
class SamplingOptions(Declared):
    """Greedy decoding unless ``sample``: then ``softmax(logits / temperature)`` within the ``top_p`` nucleus,
    ``seed`` fixing the draws."""

    sample: bool = option(False, "--sample", help="Sample instead of greedy decoding.")
    temperature: float = option(1.0, "--temperature", help="With --sample: divide the logits by T.")
    top_p: float = option(1.0, "--top-p", help="With --sample: nucleus sampling's mass.")
    seed: int | None = option(None, "--seed", help="With --sample: fix the random draws.")

    def __post_init__(self) -> None:
        from anatomy_cli.analyses.generate import check_sampling

        super().__post_init__()
        if not self.sample and (self.temperature != 1.0 or self.top_p != 1.0 or self.seed is not None):
            raise UsageError("--temperature, --top-p and --seed need --sample")
        check_sampling(self.temperature, self.top_p)

    def record(self) -> dict[str, Any]:
        """The record's ``sampling`` key."""
        if not self.sample:
            return {"method": "greedy"}
        return {"method": "sample", "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}

    def chooser(self) -> Callable[[], Callable[[torch.Tensor], int]]:
        """A factory of the token rule: a fresh sampler per run, so every coefficient of a sweep draws the same
        random numbers."""
        from anatomy_cli.analyses.generate import sampler
        from anatomy_cli.engine.generate import greedy

        if not self.sample:
            return lambda: greedy
        return lambda: sampler(temperature=self.temperature, top_p=self.top_p, seed=self.seed)


@dataclass(frozen=True)
class GenerateOptions(Declared):
    """``max_new_tokens``: stop after N (or at EOS); ``k``: top tokens per step; ``lens``: the chosen token under
    the lens of every block (``logit``, ``tuned:DIR`` or ``jacobian:FILE``; True: logit; None/False: none);
    ``check``: replay without the KV cache; ``target``/``target_id``/``first_token``: a sweep's token whose
    log-probability shift is reported. The sampling and steering options are one dataclass each (their fields
    are the command's options at these fields' places)."""

    max_new_tokens: int = option(20, "--max-new-tokens", min=1, metavar="N",
                                 help="Stop after N new tokens (or at the model's EOS).")
    sampling: SamplingOptions = field(default_factory=SamplingOptions)
    k: int = option(5, "--top", "-k", min=1, metavar="N", help="Top tokens listed per step.")
    lens: str | bool | None = option(  # after __post_init__: the lens' text or None
        None, "--lens", metavar="[logit|tuned:DIR|jacobian:FILE]", show_default=False, cli=str | None,
        help="Per step: the chosen token's probability under a lens at every block, and the first block that ranks "
        "it first. A bare --lens is the logit lens; tuned:DIR or jacobian:FILE a fitted lens.")
    steering: SteeringOptions = field(default_factory=SteeringOptions)
    check: bool = option(False, "--check", help="Replay the tokens without the KV cache (a full forward per step) "
                         "and report the largest logit difference.")
    target: str | None = shared.target()
    target_id: int | None = shared.target_id()
    first_token: bool = shared.first_token()

    def __post_init__(self) -> None:
        super().__post_init__()
        lens = self.lens
        text = None if lens is None or lens is False else "logit" if lens is True else lens_choice.parse(lens).text
        object.__setattr__(self, "lens", text)  # UsageError for a bad --lens, a missing file or directory
        targets.check_first_token(self.first_token, self.wanted)
        if self.wanted is not None and len(self.coefs) < 2:
            raise UsageError("--target is for a coefficient sweep (--steer FILE --coef -4,0,4)")

    @property
    def lens_text(self) -> str | None:
        """``logit``, ``tuned:DIR``, ``jacobian:FILE``, or None (no lens)."""
        return self.lens if isinstance(self.lens, str) else None

    @property
    def wanted(self) -> targets.TokenChoice | None:
        return targets.choice(self.target, self.target_id, first_token=self.first_token)

    @property
    def coefs(self) -> list[float]:
        return self.steering.coefs

    @property
    def sweep(self) -> bool:
        return len(self.coefs) > 1


def check_plot(opts: GenerateOptions) -> None:
    """``--plot`` draws a coefficient sweep or the ``--lens`` grid: UsageError when there is neither."""
    if not opts.lens and not opts.sweep:
        raise UsageError("--plot draws a coefficient sweep (--steer FILE --coef -2,0,2) or the --lens grid: "
                         "give one of them")


@dataclass(frozen=True)
class GeneratePlan:
    """What :func:`check` resolved: the target's id and the steering vector (checked against the model)."""

    target_id: int | None
    vector: SteeringVector | None
    steer: dict[str, Any] | None  # the record's ``steer`` key
    fitted: FittedLens | None = None  # --lens tuned:DIR / jacobian:FILE, checked against the model


def check(opened: Opened, opts: GenerateOptions) -> GeneratePlan:
    """``opened``: an OpenedModel or a LoadedModel. Every refusal before the weights: a model that cannot
    generate, more new tokens than the context holds, a target that is not a token, a vector that does not fit."""
    require(opened.info, Need.decoder, Need.lm_head, command=COMMAND)
    n_ctx = opened.info.n_ctx
    if n_ctx is not None and opts.max_new_tokens > n_ctx:
        raise UsageError(f"--max-new-tokens {opts.max_new_tokens} is past {opened.name}'s context of {n_ctx} "
                         f"tokens")
    wanted = opts.wanted
    target_id = None if wanted is None else targets.resolve(opened.tokenizer, wanted, model=opened.name,
                                                            vocab_size=opened.info.lm_head_rows)
    found = steering_vector(opened, opts.steering)
    return GeneratePlan(target_id, found, steering_record(opts.steering, found),
                        fitted_lens(opened, opts.lens_text, command=COMMAND))


@dataclass(frozen=True)
class Generated:
    """One prompt's outcome: ``result`` (a Continuation, or a Sweep for several coefficients) and the largest
    cache-check difference (None without ``check``)."""

    result: Continuation | Sweep
    max_abs_logit_diff: float | None


@dataclass(frozen=True)
class Settings:
    """One run's settings: the token rule factory, the lengths, the lens, the steering vector, the stop ids;
    ``overflowed``: the coefficients whose steered run went non-finite (filled as the runs go)."""

    choose: Callable[[], Callable[[torch.Tensor], int]]
    max_new_tokens: int
    k: int
    lens: bool
    vector: SteeringVector | None
    stop: tuple[int, ...]
    progress: Callable[[int, int], None] | None = None  # after each token: the status line (and cancellation)
    lens_map: Callable[[torch.Tensor], torch.Tensor] | None = None  # a fitted lens' reading of the blocks
    overflowed: set[float] = field(default_factory=set)


def run(lm: LoadedModel, encoded: list[Encoded], opts: GenerateOptions, plan: GeneratePlan) -> list[Generated]:
    from anatomy_cli.engine.generate import stop_ids

    s = Settings(opts.sampling.chooser(), opts.max_new_tokens, opts.k, opts.lens is not None, plan.vector,
                 stop_ids(lm), lens_map=None if plan.fitted is None else plan.fitted.read_blocks)
    described = describe(lm)
    out = []
    for index, enc in enumerate(encoded):
        what = f"generating ({index + 1}/{len(encoded)})"
        with notes.status(what) as line:
            chosen: list[int] = []
            step = replace(s, choose=recording(s.choose, chosen),  # shares s.overflowed
                           progress=line.counter(what, "tokens", functools.partial(streamed, lm, chosen)))
            out.append(one_prompt(lm, list(enc.ids), step, opts, plan, described))
    if s.overflowed:
        notes.warn(overflow_warning(sorted(s.overflowed)))
    return out


def overflow_warning(coefs: list[float]) -> str:
    """The one warning of a run whose steering made the activations non-finite."""
    which = ", ".join(f"{c:g}" for c in coefs)
    return (f"steering with coefficient{'s' if len(coefs) > 1 else ''} {which} made the activations non-finite "
            f"(inf or NaN, or too large for the next norm's mean square in float32): the logits after it are "
            f"meaningless (often a uniform distribution); use a smaller --coef")


def finite(t: torch.Tensor) -> bool:
    """True when ``t`` and its mean square over the last dimension (what RMSNorm and LayerNorm compute, in
    float32) are finite: a residual of 1e30s is finite but its norm divides by inf."""
    import torch

    wide = t.float()
    return bool(torch.isfinite(wide).all()) and bool(torch.isfinite(wide.pow(2).mean(-1)).all())


def steering_hooks(s: Settings, coef: float) -> dict[str, HookFn] | None:
    """The vector's hooks at ``coef``, each noting in ``s.overflowed`` when its steered activation is not
    :func:`finite` (None without a vector)."""
    if s.vector is None:
        return None

    def watched(fn: HookFn) -> HookFn:
        def hook(t: torch.Tensor) -> torch.Tensor | None:
            out = fn(t)  # a steering hook returns the steered tensor (HookFn allows None: unchanged)
            if out is not None and coef not in s.overflowed and not finite(out):
                s.overflowed.add(coef)
            return out
        return hook

    return {name: watched(fn) for name, fn in s.vector.hooks(coef).items()}


def one_prompt(lm: LoadedModel, ids: list[int], s: Settings, opts: GenerateOptions, plan: GeneratePlan,
               described: Callable[[int], tuple[str, str | None]]) -> Generated:
    """A sweep (several coefficients) or one continuation, with the cache check when asked."""
    result: Continuation | Sweep
    if opts.sweep:
        target = None if plan.target_id is None else described(plan.target_id)[0]
        result, worst = sweep(lm, ids, s, opts.coefs, plan.target_id, opts.check, target)
    else:
        g = run_one(lm, ids, s, opts.coefs[0])
        worst = cache_check(lm, g, s, opts.coefs[0]) if opts.check else None
        result = continuation(lm, g, s, described)
    return Generated(result, worst)


def run_one(lm: LoadedModel, ids: list[int], s: Settings, coef: float, *, lens: bool | None = None,
            use_cache: bool = True) -> Generation:
    import torch

    from anatomy_cli.engine.generate import generate

    g = generate(lm, ids, max_new_tokens=s.max_new_tokens, choose=s.choose(), stop=s.stop,
                 hooks=steering_hooks(s, coef), lens=s.lens if lens is None else lens, use_cache=use_cache,
                 progress=s.progress, lens_map=s.lens_map)
    if s.vector is not None and not bool(torch.isfinite(g.logits).all()):
        s.overflowed.add(coef)
    return g


def cache_check(lm: LoadedModel, g: Generation, s: Settings, coef: float) -> float:
    """Largest |logit| difference between ``g`` (cached) and the same tokens replayed with a full forward per
    step and no cache (the same steering hooks)."""
    from anatomy_cli.engine.generate import generate
    from anatomy_cli.engine.generate import replay

    if not g.tokens:
        return 0.0
    again = generate(lm, list(g.prompt), max_new_tokens=len(g.tokens), choose=replay(g.tokens),
                     hooks=steering_hooks(s, coef), use_cache=False, progress=s.progress)
    return float((again.logits.double() - g.logits.double()).abs().max())


def continuation(lm: LoadedModel, g: Generation, s: Settings, describe: Describe) -> Continuation:
    """The :class:`~anatomy_cli.analyses.generate.Continuation` of one generation."""
    from anatomy_cli.analyses import generate as analysis

    steps = analysis.steps(g.logits, g.tokens, s.k, describe, lens_logprob=g.lens_logprob, lens_top=g.lens_top)
    return analysis.Continuation(decode(lm, g.tokens), tuple(g.tokens), g.stopped, tuple(steps))


def sweep(lm: LoadedModel, ids: list[int], s: Settings, coefs: list[float], target_id: int | None,
          do_check: bool, target: str | None = None) -> tuple[Sweep, float | None]:
    """Every coefficient's continuation, KL and target shift (the first step against coefficient 0), and the
    largest cache-check difference over all runs (None without ``do_check``)."""
    from anatomy_cli.analyses import generate as analysis

    base = run_one(lm, ids, s, 0.0, lens=False)
    worst = cache_check(lm, base, s, 0.0) if do_check else None
    rows = []
    for coef in coefs:
        g = base if coef == 0 else run_one(lm, ids, s, coef, lens=False)
        if do_check and coef != 0:
            worst = max(worst or 0.0, cache_check(lm, g, s, coef))
        rows.append(analysis.sweep_row(coef, decode(lm, g.tokens), len(g.tokens), g.logits[0], base.logits[0],
                                       target_id))
    return analysis.Sweep(tuple(rows), target), worst
