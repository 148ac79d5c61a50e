"""`fit-lens`: fitting a lens and writing it (the Jacobian lens on prompts, in jlens' format; the tuned lens on a
corpus, in tuned-lens' format)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.engine.loader import current_loader
from anatomy_cli.engine.opening import as_spec
from anatomy_cli.models.spec import ModelSpec
from anatomy_cli.output.views import fit_lens as view
from anatomy_cli.tasks import fit_lens as task
from anatomy_cli.text.options import PromptOptions

if TYPE_CHECKING:
    from anatomy_cli.engine.opening import OpenedModel


@command(task.FitLensOptions)
def fit_lens(model: Model, kind: str, prompt: str | list[str] | None = None,
             opts: task.FitLensOptions = task.FitLensOptions(), *, out: str | Path,
             prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy fit-lens jacobian`: fit a Jacobian lens on ``prompt`` (a list of texts; the CLI's ``--prompts
    FILE``) and write it to ``out`` in jlens' format (read it with ``lens(..., lens=f"jacobian:{out}")``).
    ``source_layers``: blocks to fit (default every block below ``target_layer``, the last by default);
    ``dtype``: the file's precision (``fp16`` as jlens saves, or ``fp32``); ``checkpoint``: a file saved every
    ``checkpoint_every`` prompts and resumed from (same settings and prompts only); ``shard``: ``"i/N"``, prompts
    i, i + N, ... only (merge the shards' files with ``fit-lens merge``); ``ray``: the prompts fitted on
    ``workers`` Ray actors (at ``ray_address``, else ``RAY_ADDRESS``, else a local Ray), each loading the model
    from its spec (a loaded ``model``: from its name). ``result``: JacobianFit; rows: ``blocks`` (per fitted
    block ``‖J − I‖_F/√d`` and ``‖J‖_F``).

    `anatomy fit-lens tuned`: ``fit_lens(model, "tuned", corpus=PATH, tokens=N, out=DIR)`` fits a tuned lens
    (tuned-lens' recipe) on the first ``tokens`` tokens of ``corpus`` (a text file, a directory of .txt/.md, a
    .jsonl/.csv/.parquet file's ``column``) in windows of ``ctx`` tokens (default min(2048, the context)), over
    ``steps`` SGD steps (windows shuffled with ``seed``; with ``checkpoint``, the training state saved every
    ``checkpoint_every`` steps and resumed from), and writes DIR (config.json + params.pt), which
    ``tuned_lens.TunedLens.from_model_and_pretrained`` and ``lens(..., lens=f"tuned:{DIR}")`` read. ``result``:
    TunedFit; rows: ``translators`` (the KL to the final distribution at the first and the last step)."""
    texts = tuple(texts_of(prompt)[0]) if prompt is not None else ()
    opts = dataclasses.replace(opts, kind=kind, prompt=texts, out=Path(out))
    first = _opened(model) if opts.ray else opened(model, lambda spec: task.before_open(spec, opts))
    encoded = encode(first, list(opts.prompt), prompts) if opts.prompt else []
    plan = task.check(first, opts, encoded)  # every refusal before the weights load
    lm = first if opts.ray else weights(first)  # on Ray the workers load the weights
    result = task.run(lm, encoded, opts, plan)
    return Result(task.COMMAND, result, view.report(lm, result).data,
                  view.TUNED_ROWS if kind == "tuned" else view.ROWS)


def _opened(model: Model) -> OpenedModel:
    """``model`` opened, not loaded (a loaded one by its name), through the current loader."""
    return current_loader().open(as_spec(model) if isinstance(model, (ModelSpec, str)) else ModelSpec(model.name))


def merge_lenses(files: list[str | Path], *, out: str | Path, dtype: str = "fp16", overwrite: bool = False) -> Result:
    """`anatomy fit-lens merge A.pt B.pt --out C.pt`: Jacobian lens fits of one model and one set of blocks as one
    file, the ``n_prompts``-weighted mean (equal to one fit on all their prompts). No model is loaded.
    ``result``: MergedLens; rows: ``inputs`` (each file and its prompt count)."""
    result = task.merge([Path(f) for f in files], Path(out), dtype=dtype, overwrite=overwrite)
    return Result(task.COMMAND, result, view.merge_report(result).data, "inputs")
