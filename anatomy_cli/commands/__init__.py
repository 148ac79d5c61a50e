"""One module per command; each registers on anatomy_cli.app.app when imported."""
