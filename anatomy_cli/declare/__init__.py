"""What a command is, declared once: its record (:mod:`.commands`) and its options (:mod:`.fields`).

Standard library only, so the `serve` client reads the records before anything heavy is imported. Everything
that lists commands (the CLI app, serve's forwarding, the API's exports, `serve --status`, the docs index) reads
:data:`.commands.COMMANDS`; everything that offers an option (the Typer command, the API keyword, the served
command) reads the option's field in the command's options dataclass.
"""
