"""One module per command; each registers on anatomy_cli.cli.app.app when imported."""
