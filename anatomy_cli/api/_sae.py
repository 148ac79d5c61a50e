"""`anatomy sae` as a function: a sparse autoencoder (or transcoder) from local files on prompts. Runs the
command's own ``prepare``/``run``/``_report`` and returns its JSON with the
:class:`~anatomy_cli.analyses.sae.Reading` it renders. No torch at import time."""

from __future__ import annotations

from pathlib import Path

from anatomy_cli.api._model import Model, encode, loaded, texts_of
from anatomy_cli.api._results import Result
from anatomy_cli.text.options import PromptOptions

One = Result | list[Result]


def sae(model: Model, prompt: str | list[str], *, sae: str | Path, hook: str | None = None, top: int = 5,
        features: list[int] | None = None, lens_top: int = 5, labels: str | Path | None = None,
        prompts: PromptOptions = PromptOptions()) -> One:
    """`anatomy sae`: the SAE at ``sae`` (a SAELens or sparsify folder, or a Gemma Scope params.npz; ``hook``
    as ``--hook``) on the prompt: its health (L0, FVE, MSE, CE and KL with the reconstruction spliced in),
    the ``top`` features per token, the followed ``features`` with their logit lens (``lens_top`` tokens at
    each end), ``labels`` joined from Neuronpedia's explanations export. ``result``: Reading
    (``activations``: [pos, d_sae]); rows: ``top_features``."""
    from anatomy_cli.cli.commands import sae as command
    from anatomy_cli.models.sae import names

    sae_file, wanted, label_map = command.prepare(Path(sae), hook, features, None if labels is None else Path(labels))
    lm = loaded(model)
    names.check_fits(lm.info, lm.name, sae_file)
    texts, single = texts_of(prompt)
    encoded = encode(lm, texts, prompts)
    dictionary = command.dictionary_for(lm, sae_file)
    out = []
    for enc in encoded:
        reading = command.run(lm, enc, sae_file, dictionary, top=top, wanted=wanted, lens_k=lens_top,
                              labels=label_map)
        data = command._report(lm, enc, sae_file, reading).data
        out.append(Result("sae", reading, data, "top_features", (reading, command.caption(lm, enc, sae_file))))
    return out[0] if single else out
