"""The layout's promises that import-linter cannot check: light modules import no torch at import time; and the
layer rules the docs state are the ones import-linter checks.

import-linter (contracts in pyproject.toml, run by .ci/run) counts imports inside functions too, so it
cannot tell "imports torch when a command runs" from "imports torch when the module is imported".
"""

from __future__ import annotations

import json
import re
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


def _layers(items) -> list[str]:
    """Layer names, top first, without the package prefix: ``["cli", ..., "serve|corpus", "models:text", ...]``
    (``|``: independent of each other, ``:`` may import each other, as import-linter writes them)."""
    out = []
    for item in items:
        item = re.sub(r"\s+", "", item.replace("│", "|")).replace("anatomy_cli.", "")
        sep = next((c for c in "|:" if c in item), "|")
        out.append(sep.join(sorted(item.split(sep))))  # the order inside one layer says nothing
    return out


def test_the_layers_the_docs_state_are_the_import_linter_contract():
    # The layer order (and which neighbours are independent) is written three times: the contract that
    # lint-imports checks, CONTRIBUTING.md's one line and docs/architecture.md's drawing. They must agree.
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    (contract,) = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    enforced = _layers(contract["layers"])
    contributing = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    line = re.search(r"## The layers\s+`([^`]+)`", contributing).group(1)
    assert _layers(line.split("→")) == enforced, "CONTRIBUTING.md's layer line differs from pyproject.toml"
    architecture = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    drawing = re.search(r"```\n(.*?)```", architecture, re.S).group(1)
    drawn = [m.group(1) for m in (re.match(r"\s*(\w+(?:\s*[│|:]\s*\w+)*)\s{2,}\S", row)
                                  for row in drawing.splitlines()) if m]
    assert _layers(drawn) == enforced, "docs/architecture.md's drawing differs from pyproject.toml"
    packages = sorted(p.parent.name for p in (ROOT / "anatomy_cli").glob("*/__init__.py") if p.parent.name != "data")
    modules = sorted(p.stem for p in (ROOT / "anatomy_cli").glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert sorted(re.split(r"[|:]", "|".join(enforced))) == sorted(packages + modules)  # every package has a layer
