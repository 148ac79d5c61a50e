"""`anatomy sae` as a function: a sparse autoencoder (or transcoder) from local files on prompts. Builds the
command's :class:`~anatomy_cli.tasks.sae.SaeOptions`, runs its task and view, and returns its JSON with the
:class:`~anatomy_cli.analyses.sae.Reading` it renders. No torch at import time."""

from __future__ import annotations

from anatomy_cli.api._declared import command
from anatomy_cli.api._model import Model
from anatomy_cli.api._model import encode
from anatomy_cli.api._model import left_out
from anatomy_cli.api._model import opened
from anatomy_cli.api._model import texts_of
from anatomy_cli.api._model import weights
from anatomy_cli.api._results import Result
from anatomy_cli.output.views import sae as view
from anatomy_cli.tasks import sae as sae_task
from anatomy_cli.tasks.recorded_model import chosen
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]


@command(sae_task.SaeOptions)
def sae(model: Model | None, prompt: str | list[str], opts: sae_task.SaeOptions, *,
        prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy sae`: the SAE at ``sae`` (a SAELens or sparsify folder, or a Gemma Scope params.npz; ``hook``
    as ``--hook``) on the prompt: its health (L0, FVE, MSE, CE and KL with the reconstruction spliced in),
    the ``top`` features per token, the followed ``features`` (``--feature``, repeatable) with their logit lens
    (``lens_top`` tokens at each end), ``labels`` joined from Neuronpedia's explanations export. ``result``:
    Reading (``activations``: [pos, d_sae]); rows: ``top_features``. ``model=None``: the model the SAE's metadata
    names (``model_name``, as fit-sae writes it) where it resolves, else the default model."""
    sae_file = sae_task.before_open(opts)  # no SAE at the path: refused before a model named by name opens
    first = opened(chosen(left_out(), False, lambda: sae_file.model_name) if model is None else model)
    plan = sae_task.check(first, opts, sae_file)
    texts, single = texts_of(prompt)
    encoded = encode(first, texts, prompts)
    lm = weights(first)
    out = []
    for enc, reading in zip(encoded, sae_task.run(lm, encoded, opts, plan)):
        args, kwargs = view.figure(lm, enc, reading, plan.sae_file)
        out.append(Result(sae_task.COMMAND, reading, view.report(lm, enc, reading, plan.sae_file).data, view.ROWS,
                          args, kwargs))
    return out[0] if single else out
