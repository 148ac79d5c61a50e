"""`fit-sae`: training a TopK SAE or MLP transcoder for a model on a corpus (sparsify's format)."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.output.views import fit_sae as view
from anatomy_cli.tasks import fit_sae as fit_sae_task


@command(fit_sae_task.FitSaeOptions, inputs=("corpus",))
def fit_sae(model: Model, corpus: str | Path | list[str | Path], opts: fit_sae_task.FitSaeOptions) -> Result:
    """`anatomy fit-sae CORPUS... --layer L --out DIR`: train a TopK SAE at the output of each block of ``layer``
    (``6``, ``"0-3"``, ``[2, 6]``, ``"all"``; or, with ``transcoder``, an MLP transcoder) on ``corpus`` (paths, as
    ``anatomy corpus`` reads them), the activations collected in one pass, and write each to ``out/layers.L``
    (``out/layers.L.mlp``) in sparsify's format. ``result``: SaeFit; rows: ``blocks`` (one per block).
    ``estimate=True``: the cost alone (the weights load for its probes), nothing trained or written; ``result``:
    SaeEstimate; rows: ``phases``."""
    first = opened(model, lambda spec: fit_sae_task.before_open(spec, opts))  # --ctx past a GGUF's context: refused
    plan = fit_sae_task.check(first, opts)  # every refusal before the weights load
    lm = weights(first)
    result = fit_sae_task.run(lm, opts, plan)
    rows = view.ESTIMATE_ROWS if isinstance(result, fit_sae_task.SaeEstimate) else view.ROWS
    return Result(fit_sae_task.COMMAND, result, view.report(lm, result).data, rows)
