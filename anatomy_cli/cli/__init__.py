"""The command line: app (Typer app, errors to exit codes), entry (the console script), main (every
command registered), options (shared options), commands/ (one module per command: parse, call, render).

The top layer: may import everything below it; nothing imports it (serve gets a registry handed in).
"""
