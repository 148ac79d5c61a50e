"""`fit-lens`: fitting a lens on prompts and writing it (the Jacobian lens, in jlens' format)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import loaded
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.text.options import PromptOptions


def fit_lens(model: Model, kind: str, prompt: str | list[str], *, out: str | Path, source_layers: Any = None,
             target_layer: int | None = None, dim_batch: int = 8, max_seq_len: int = 128, skip_first: int = 16,
             dtype: str = "fp16", overwrite: bool = False, checkpoint: str | Path | None = None,
             shard: str | tuple[int, int] | None = None, prompts: PromptOptions = PromptOptions()) -> Result:
    """`anatomy fit-lens jacobian`: fit a Jacobian lens on ``prompt`` (a list of texts; the CLI's ``--prompts
    FILE``) and write it to ``out`` in jlens' format (read it with ``lens(..., lens=f"jacobian:{out}")``).
    ``source_layers``: blocks to fit (default every block below ``target_layer``, the last by default);
    ``dtype``: the file's precision (``fp16`` as jlens saves, or ``fp32``); ``checkpoint``: a file saved after every
    prompt and resumed from (same settings and prompts only); ``shard``: ``"i/N"``, prompts i, i + N, ... only
    (merge the shards' files with ``fit-lens merge``). ``result``: JacobianFit; rows:
    ``blocks`` (per fitted block ``‖J − I‖_F/√d`` and ``‖J‖_F``)."""
    from anatomy_cli.output.views import fit_lens as view
    from anatomy_cli.tasks import fit_lens as task

    opts = task.FitLensOptions(kind=kind, prompt=tuple(texts_of(prompt)[0]), out=Path(out),
                               source_layers=source_layers, target_layer=target_layer, dim_batch=dim_batch,
                               max_seq_len=max_seq_len, skip_first=skip_first, dtype=dtype, overwrite=overwrite,
                               checkpoint=None if checkpoint is None else Path(checkpoint), shard=shard)
    lm = loaded(model)
    plan = task.check(lm, opts)
    encoded = encode(lm, list(opts.prompt), prompts)
    result = task.run(lm, encoded, opts, plan)
    return Result(task.COMMAND, result, view.report(lm, result).data, view.ROWS)


def merge_lenses(files: list[str | Path], *, out: str | Path, dtype: str = "fp16", overwrite: bool = False) -> Result:
    """`anatomy fit-lens merge A.pt B.pt --out C.pt`: Jacobian lens fits of one model and one set of blocks as one
    file, the ``n_prompts``-weighted mean (equal to one fit on all their prompts). No model is loaded.
    ``result``: MergedLens; rows: ``inputs`` (each file and its prompt count)."""
    from anatomy_cli.output.views import fit_lens as view
    from anatomy_cli.tasks import fit_lens as task

    result = task.merge([Path(f) for f in files], Path(out), dtype=dtype, overwrite=overwrite)
    return Result(task.COMMAND, result, view.merge_report(result).data, "inputs")
