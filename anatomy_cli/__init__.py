"""anatomy: inspect the anatomy of transformer language models from the shell."""

__version__ = "0.1.0"
