"""Analyses of a target token: dla, ablate, patch, attribute; and drift (a word across contexts). Each runs the
code its command runs (the command module's ``run`` where it has one, else the same engine and analysis
calls: dla and attribute call their analyses directly) and returns the command's JSON with its result object.
No torch at import time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anatomy_cli.api._model import Model, encode, loaded, resolve_token, texts_of
from anatomy_cli.api._prompts import One, _caption, _one
from anatomy_cli.api._results import Result
from anatomy_cli.errors import UsageError
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.model import LoadedModel


def _ids(lm: LoadedModel, target: str | None, target_id: int | None, foil: str | None, foil_id: int | None,
         first_token: bool) -> dict[str, Any]:
    """``{"target": id, "foil": id or None}`` as ``--target``/``--foil`` resolve them; UsageError without a
    target, or a foil equal to it."""
    ids = {"target": resolve_token(lm, target, target_id, first_token=first_token),
           "foil": resolve_token(lm, foil, foil_id, option="--foil", first_token=first_token)}
    if ids["target"] is None:
        raise UsageError("give target= (a text) or target_id= (a token id): the token the analysis explains")
    if ids["foil"] == ids["target"]:
        raise UsageError("--foil is the same token as --target: the logit difference would be 0 everywhere")
    return ids


def _decoder(lm: LoadedModel) -> None:
    from anatomy_cli.cli.commands.ablate import _check_decoder

    _check_decoder(lm.name, lm.is_causal and lm.has_unembed)


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
    lm = loaded(model)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    plan = task.check(lm, opts, encoded)
    out = []
    for enc, result in zip(encoded, task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, result)
        out.append(Result(task.COMMAND, result.shown, view.report(lm, enc, result).data, view.ROWS, args, kwargs))
    return _one(out, single)


def ablate(model: Model, prompt: str | list[str], *, target: str | None = None, target_id: int | None = None,
           foil: str | None = None, foil_id: int | None = None, first_token: bool = False, mode: str = "zero",
           heads: bool = False, layer: int | None = None, position: int = -1, method: str = "exact",
           check: int = 0, prompts: PromptOptions = PromptOptions(), batch_size: int = 8) -> One:
    """`anatomy ablate`: each attention and MLP output (``heads``: each head) zeroed or mean-ablated, and the
    change of log p(target) (or logit(target) - logit(foil)) at ``position``. ``result``: Ablation;
    rows: ``rows`` (one per component)."""
    from anatomy_cli.analyses import ablate as analysis
    from anatomy_cli.cli.commands import _attribution
    from anatomy_cli.cli.commands import ablate as command
    from anatomy_cli.engine import interventions
    from anatomy_cli.text.positions import check_position

    how, kind = command.AblateMode(mode), _attribution.Method(method)
    _attribution.check_options(kind, check)
    lm = loaded(model)
    _decoder(lm)
    if layer is not None and not -lm.n_layers <= layer < lm.n_layers:
        raise UsageError(f"--layer {layer} is out of range: {lm.name} has layers 0..{lm.n_layers - 1}")
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    check_position(position, encoded)
    ids = _ids(lm, target, target_id, foil, foil_id, first_token)
    plan = interventions.ablation_rows(lm, components=["head"] if heads else ["attn", "mlp"], mode=how.value,
                                       layers=None if layer is None else [layer % lm.n_layers])
    metric = analysis.metric_fn(ids["target"], ids["foil"])
    out = []
    for enc in encoded:
        result, extra = command.run(lm, enc, plan, metric, ids, how.value, kind, position, check, batch_size)
        p = position % len(enc)
        data = _attribution.extend(command._report(lm, enc, p, ids, result), extra).data
        cap = _caption("ablate", lm, enc.text, f"{'attribution estimate of the ' if extra else ''}{result.mode} "
                       f"ablation · position {p} = {enc.pieces[p]}")
        out.append(Result("ablate", result, data, "rows", (result, lm.n_heads, command._metric_name(lm, ids), cap)))
    return _one(out, single)


def patch(model: Model, clean: str, corrupt: str, *, target: str | None = None, target_id: int | None = None,
          foil: str | None = None, foil_id: int | None = None, first_token: bool = False, site: str = "resid_pre",
          method: str = "exact", check: int = 0, prompts: PromptOptions = PromptOptions(),
          batch_size: int = 8) -> Result:
    """`anatomy patch`: activation patching from CLEAN into CORRUPT at every (layer, position) of ``site``
    (``head``: every (layer, head)); value = (m - m_corrupt) / (m_clean - m_corrupt). ``result``: Patching;
    rows: ``cells``."""
    from anatomy_cli.cli.commands import _attribution
    from anatomy_cli.cli.commands import patch as command

    where, kind = command.PatchSite(site), _attribution.Method(method)
    _attribution.check_options(kind, check)
    lm = loaded(model)
    _decoder(lm)
    enc_clean, enc_corrupt = encode(lm, [clean, corrupt], prompts, truncate_hint=False)
    if len(enc_clean) != len(enc_corrupt):
        raise UsageError(f"CLEAN and CORRUPT must have the same number of tokens: CLEAN is {len(enc_clean)}, "
                         f"CORRUPT is {len(enc_corrupt)}")
    ids = _ids(lm, target, target_id, foil, foil_id, first_token)
    result, extra = command.run(lm, enc_clean, enc_corrupt, where.value, ids, kind, check, batch_size)
    data = _attribution.extend(command._report(lm, enc_clean, enc_corrupt, ids, result, wide=False), extra,
                               grid=True).data
    target_r, foil_r = data["target"], data["foil"]
    what = f"logit({target_r['token']}) - logit({foil_r['token']})" if foil_r else f"logit({target_r['token']})"
    cap = _caption("patch", lm, clean, f"corrupt {corrupt[:40]!r} · site {result.site}")
    return Result("patch", result, data, "cells", (result, enc_clean.pieces, enc_corrupt.pieces, what, cap))


def attribute(model: Model, prompt: str | list[str], *, target: str | None = None, target_id: int | None = None,
              foil: str | None = None, foil_id: int | None = None, first_token: bool = False,
              method: str = "integrated-gradients", steps: int = 32, baseline: str | None = None,
              prompts: PromptOptions = PromptOptions(), batch_size: int = 32) -> One:
    """`anatomy attribute`: how much each input token drove log p(target) at the last position (or
    logit(target) - logit(foil)), by Captum's ``method``. ``result``: TokenAttribution; rows: ``rows``
    (one per token)."""
    from anatomy_cli.cli.commands import attribute as command

    kind = command.AttributionMethod(method)
    base = None if baseline is None else command.Baseline(baseline)
    command._check_baseline(kind.value, base)
    lm = loaded(model)
    _decoder(lm)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    ids = _ids(lm, target, target_id, foil, foil_id, first_token)
    out = []
    for enc in encoded:
        result = command.run(lm, enc, ids, kind.value, steps=steps, baseline=base.value if base else None,
                             batch_size=batch_size)
        cap = _caption("attribute", lm, enc.text, command._method_line(result))
        out.append(Result("attribute", result, command._report(lm, enc, ids, result).data, "rows",
                          (result, command._metric_name(lm, ids), cap)))
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
