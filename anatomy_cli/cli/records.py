"""The model in JSON: :mod:`anatomy_cli.tasks.records` (kept here for the commands' imports)."""

from anatomy_cli.tasks.records import dtype_name
from anatomy_cli.tasks.records import model_record
from anatomy_cli.tasks.records import spec_record

__all__ = ["dtype_name", "model_record", "spec_record"]
