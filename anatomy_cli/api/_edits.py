"""Analyses of a target token: dla, ablate, patch, attribute; and drift (a word across contexts). Each builds
its command's options object (:mod:`anatomy_cli.tasks`), runs the same ``check`` and ``run`` and returns the
view's JSON (:mod:`anatomy_cli.output.views`) with the result object. No torch at import time; nothing from
cli/."""

from __future__ import annotations

from typing import TYPE_CHECKING

from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import loaded
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._prompts import One
from anatomy_cli.api._prompts import _one
from anatomy_cli.api._results import Result
from anatomy_cli.api._run import run_prompts
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    pass


def dla(model: Model, prompt: str | list[str], *, target: str | None = None, target_id: int | None = None,
        foil: str | None = None, foil_id: int | None = None, first_token: bool = False,
        position: int | None = None, by: str = "layer", top: int | None = None, sort: str = "model",
        prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy dla`: direct logit attribution of logit(target) (minus logit(foil)) at ``position``; the rows add
    up to the model's own logit. ``result``: Attribution (the rows ``top``/``sort`` keep); rows: ``rows`` (one per
    component)."""
    from anatomy_cli.output.views import dla as view
    from anatomy_cli.tasks import dla as task

    opts = task.DlaOptions(target=target, target_id=target_id, foil=foil, foil_id=foil_id, first_token=first_token,
                           position=position, by=task.By(by), top=top, sort=task.Sort(sort), batch_size=batch_size)
    return run_prompts(task, view, model, prompt, opts, prompts, check_encoded=True, unwrap=lambda r: r.shown)


def ablate(model: Model, prompt: str | list[str], *, target: str | None = None, target_id: int | None = None,
           foil: str | None = None, foil_id: int | None = None, first_token: bool = False, mode: str | None = None,
           heads: bool = False, experts: bool = False, layer: int | None = None, position: int = -1,
           method: str = "exact", check: int = 0, prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy ablate`: each attention and MLP output (``heads``: each head) zeroed or mean-ablated (``mode``,
    default ``zero``), or with ``experts`` each routed expert of each MoE block rerouted around or zeroed (default
    ``reroute``), and the change of log p(target) (or logit(target) - logit(foil)) at ``position``. ``result``:
    Ablation; rows: ``rows`` (one per component)."""
    from anatomy_cli.output.views import ablate as view
    from anatomy_cli.tasks import ablate as task

    opts = task.AblateOptions(target=target, target_id=target_id, foil=foil, foil_id=foil_id, first_token=first_token,
                              position=position, heads=heads, experts=experts,
                              mode=None if mode is None else task.AblateMode(mode), method=task.Method(method),
                              check=check, layer=layer, batch_size=batch_size)
    return run_prompts(task, view, model, prompt, opts, prompts, check_encoded=True, unwrap=lambda r: r.ablation)


def patch(model: Model, clean: str, corrupt: str, *, target: str | None = None, target_id: int | None = None,
          foil: str | None = None, foil_id: int | None = None, first_token: bool = False, site: str = "resid_pre",
          method: str = "exact", check: int = 0, prompts: PromptOptions = PromptOptions(),
          batch_size: int = 8) -> Result:
    """`anatomy patch`: activation patching from CLEAN into CORRUPT at every (layer, position) of ``site``
    (``head``: every (layer, head)); value = (m - m_corrupt) / (m_clean - m_corrupt). ``result``: Patching;
    rows: ``cells``."""
    from anatomy_cli.output.views import patch as view
    from anatomy_cli.tasks import patch as task

    task.check_texts(clean, corrupt)
    opts = task.PatchOptions(target=target, target_id=target_id, foil=foil, foil_id=foil_id, first_token=first_token,
                             site=task.PatchSite(site), method=task.Method(method), check=check,
                             batch_size=batch_size)
    lm = loaded(model)
    enc_clean, enc_corrupt = encode(lm, [clean, corrupt], prompts, truncate_hint=False)
    ids = task.check(lm, opts, enc_clean, enc_corrupt)
    result = task.run(lm, enc_clean, enc_corrupt, opts, ids)
    data = view.report(lm, enc_clean, enc_corrupt, result, wide=False).data
    args, kwargs = view.figure(lm, enc_clean, enc_corrupt, result)
    return Result(task.COMMAND, result.patching, data, view.ROWS, args, kwargs)


def attribute(model: Model, prompt: str | list[str], *, target: str | None = None, target_id: int | None = None,
              foil: str | None = None, foil_id: int | None = None, first_token: bool = False,
              method: str = "integrated-gradients", steps: int = 32, baseline: str | None = None,
              max_rel_error: float = 0.05, max_steps: int = 256, allow_unconverged: bool = False,
              vary_first: bool = False, check: bool = False, layer: int | None = None, site: str = "resid_pre",
              prompts: PromptOptions = PromptOptions(), batch_size: int = 32) -> One:
    """`anatomy attribute`: how much each input token drove log p(target) at the last position (or
    logit(target) - logit(foil)), by Captum's ``method``. ``result``: TokenAttribution; rows: ``rows``
    (one per token)."""
    from anatomy_cli.output.views import attribute as view
    from anatomy_cli.tasks import attribute as task

    opts = task.AttributeOptions(
        target=target, target_id=target_id, foil=foil, foil_id=foil_id, first_token=first_token,
        method=task.AttributionMethod(method), steps=steps,
        baseline=None if baseline is None else task.Baseline(baseline), max_rel_error=max_rel_error,
        max_steps=max_steps, allow_unconverged=allow_unconverged, vary_first=vary_first, check=check, layer=layer,
        site=task.Site(site), batch_size=batch_size)
    lm = loaded(model)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    ids = task.check(lm, opts)
    out = []
    for enc, result in zip(encoded, task.run(lm, encoded, opts, ids)):
        args, kwargs = view.figure(lm, enc, result, ids)
        out.append(Result(task.COMMAND, result, view.report(lm, enc, result, ids).data, view.ROWS, args, kwargs))
    return _one(out, single)


def drift(model: Model, word: str, contexts: list[str] | None = None, *, matrix: int | str | None = None,
          pool: str = "mean", occurrence: int = 1, ignore_case: bool = False,
          prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy drift`: the cosine of WORD's vector between contexts at every residual row (``embed``, then
    blocks 0..L-1), with the anisotropy baseline. ``matrix``: ``"embed"`` or a block. ``result``:
    DriftResult; rows: ``layers`` (n_layers + 1)."""
    from anatomy_cli.output.views import drift as view
    from anatomy_cli.tasks import drift as task

    opts = task.DriftOptions(word=word, contexts=None if contexts is None else tuple(contexts), matrix=matrix,
                             pool=task.Pool(pool), occurrence=occurrence, ignore_case=ignore_case)
    lm = loaded(model)
    encoded = encode(lm, opts.texts(), prompts, what="context", truncate_hint=False)
    plan = task.check(lm, opts, encoded)
    result = task.run(lm, encoded, opts, plan)
    args, kwargs = view.figure(lm, encoded, result)
    return Result(task.COMMAND, result, view.report(lm, encoded, result).data, view.ROWS, args, kwargs)
