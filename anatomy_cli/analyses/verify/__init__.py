"""`anatomy verify`: the engine's numbers proved on the user's own model, one section per module.

``checks`` (the rows, tolerances, the result), ``runs`` (the runs every section reads, computed once),
``parity`` (against transformers' own forward), ``identities`` (exact up to rounding), ``precision`` (the
fp32 control and another device), ``known`` (known answers of trained models), ``llamacpp`` (a GGUF file
against llama.cpp). :func:`~anatomy_cli.analyses.verify.suite.verify` runs them in order.
"""
