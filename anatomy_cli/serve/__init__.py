"""`anatomy serve`: a local server that keeps models loaded, and the client that forwards commands to it.

Modules: ``protocol`` (socket path, framing, peer check; stdlib only), ``client`` (stdlib only: the console
script tries it before importing typer, torch or transformers), ``server`` (runs commands in-process on
cached models). See docs/serve.md. May import engine, models, text, errors and units; never analyses, output
or cli: the server is handed the command registry (``cli.app.click_command``).
"""
