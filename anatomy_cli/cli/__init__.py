"""The command line: app (Typer app, errors to exit codes), entry (the console script), main (every
command registered), options (shared options), commands/ (one module per command: parse, call, render).

May import everything below it; only anatomy_cli.api (the Python API) imports it, for the commands' run
functions (serve gets a registry handed in).
"""
