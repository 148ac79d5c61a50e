"""The layout's promises that import-linter cannot check: light modules import no torch at import time.

import-linter (contracts in pyproject.toml, run by .ci/run) counts imports inside functions too, so it
cannot tell "imports torch when a command runs" from "imports torch when the module is imported".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Modules a forwarded command, `--help`, `tokens`, `params` from headers or a usage error go through.
LIGHT = [
    "anatomy_cli.cli.main", "anatomy_cli.cli.entry", "anatomy_cli.cli.options", "anatomy_cli.cli.commands._common",
    "anatomy_cli.serve.client", "anatomy_cli.serve.protocol",
    "anatomy_cli.models.resolve", "anatomy_cli.models.model_files", "anatomy_cli.models.headers",
    "anatomy_cli.models.spec", "anatomy_cli.models.presets", "anatomy_cli.models.adapters",
    "anatomy_cli.text.tokenization", "anatomy_cli.text.targets", "anatomy_cli.text.display",
    "anatomy_cli.text.options", "anatomy_cli.text.inputs",
    "anatomy_cli.output.render", "anatomy_cli.output.plots",
    "anatomy_cli.analyses.params",
]
HEAVY = ["torch", "transformers", "matplotlib"]


@pytest.mark.parametrize("module", LIGHT)
def test_importing_a_light_module_loads_no_torch(module):
    code = (f"import sys, json; import {module}; "
            f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == [], f"importing {module} loaded {out.stdout.strip()}"


def test_every_package_says_what_it_may_import():
    for init in sorted((ROOT / "anatomy_cli").glob("*/__init__.py")):
        if init.parent.name == "data":
            continue
        doc = init.read_text(encoding="utf-8").split('"""')[1]
        assert "import" in doc, f"{init.relative_to(ROOT)}: the docstring should say what the package may import"
