"""`fit-sae`: training a TopK SAE or MLP transcoder for a model on a corpus (sparsify's format)."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._model import Model
from anatomy_cli.api._model import loaded
from anatomy_cli.api._results import Result


def fit_sae(model: Model, corpus: str | Path | list[str | Path], *, layer: int | str | list[int], out: str | Path,
            transcoder: bool = False, d_sae: int | None = None, k: int = 32, max_tokens: int = 20000, ctx: int = 256,
            epochs: int = 8, batch_size: int = 256, lr: float | None = None, seed: int = 0,
            overwrite: bool = False) -> Result:
    """`anatomy fit-sae CORPUS... --layer L --out DIR`: train a TopK SAE at the output of each block of ``layer``
    (``6``, ``"0-3"``, ``[2, 6]``, ``"all"``; or, with ``transcoder``, an MLP transcoder) on ``corpus`` (paths, as
    ``anatomy corpus`` reads them), the activations collected in one pass, and write each to ``out/layers.L``
    (``out/layers.L.mlp``) in sparsify's format. ``result``: SaeFit; rows: ``blocks`` (one per block)."""
    from anatomy_cli.output.views import fit_sae as view
    from anatomy_cli.tasks import fit_sae as task

    paths = [corpus] if isinstance(corpus, (str, Path)) else list(corpus)
    opts = task.FitSaeOptions(corpus=tuple(str(p) for p in paths), layer=layer, transcoder=transcoder, out=Path(out),
                              d_sae=d_sae, k=k, max_tokens=max_tokens, ctx=ctx, epochs=epochs, batch_size=batch_size,
                              lr=lr, seed=seed, overwrite=overwrite)
    lm = loaded(model)
    plan = task.check(lm, opts)
    result = task.run(lm, opts, plan)
    return Result(task.COMMAND, result, view.report(lm, result).data, view.ROWS)
