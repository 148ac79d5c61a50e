"""Moved to :mod:`anatomy_cli.tasks.report` (issue 47); kept for the callers that still import it here."""

from anatomy_cli.tasks.report import NEEDS_ATTENTION
from anatomy_cli.tasks.report import NEEDS_RUN
from anatomy_cli.tasks.report import SECTIONS
from anatomy_cli.tasks.report import Anatomy
from anatomy_cli.tasks.report import analyse

__all__ = ["NEEDS_ATTENTION", "NEEDS_RUN", "SECTIONS", "Anatomy", "analyse"]
