"""Reductions: functions from captured activations, weights or configs to frozen result dataclasses with
``to_dict()``; most run no model.

The modules that drive a model themselves (a forward or a backward through its modules), named here, the exceptions:

- ``circuit``, ``circuit_check``, ``circuit_heads``: the attribution graph's algorithm (circuit-tracer's
  ``attribute``), its edges re-measured by intervention (``--check``) and its head replays (``--heads``): forwards
  and backwards of the frozen replacement model (engine/replacement.py ``forward``). ``circuit_files`` writes the
  graph and runs nothing.
- ``diff.activations`` (``keep``): runs each model on the prompts (``engine.run``), then reduces the residuals.
- ``verify``: the ``verify`` command's checks run the model (``runs``, ``identities``, ``known``, ``parity``,
  ``precision``, ``fitted``) or llama.cpp (``llamacpp``, ``llamacpp_moe``) and compare.

Applying one module of a model to tensors already captured is a reduction here: ``dla`` (the final norm with its
denominator frozen, the unembedding); ``tokens`` reads a GGUF header, no weights.

May import engine, models, text, errors and units; never serve, corpus, output or cli.
"""
