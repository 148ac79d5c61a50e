"""Pure functions from captured activations or configs to frozen result dataclasses with ``to_dict()``.

May import engine, models, text, errors and units; never serve, corpus, output or cli.
"""
