"""The task layer: each command's options, checks and run, written once, under the CLI, the API and `serve`.

One module per command. Each has a frozen options dataclass (``XOptions``), ``check(info, opts)`` that makes
every refusal of the command before any weight loads (reading the capability record,
:func:`anatomy_cli.models.capabilities.require`), and ``run(lm, encoded, opts)`` returning the command's
result objects. :mod:`.session` is the prompt pipeline (open → check → load); :mod:`.notes` is where warnings,
informational lines and progress go (data, never printed here). No typer, no rich, nothing from cli/ or output/.
"""
