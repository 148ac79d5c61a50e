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


def test_importing_a_light_module_loads_no_torch():
    """Each light module imported in turn, in one fresh interpreter (one each cost ~0.35 s): what each import
    added of HEAVY. A module imported stays imported, so the modules before one add nothing to what it loads."""
    code = (f"import sys, json, importlib\nfor module in {LIGHT!r}:\n"
            "    importlib.import_module(module)\n"
            f"    print(json.dumps([module, sorted(m for m in {HEAVY!r} if m in sys.modules)]))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    loaded = [json.loads(line) for line in out.stdout.splitlines()]
    assert [module for module, _ in loaded] == LIGHT
    assert [(module, heavy) for module, heavy in loaded if heavy] == []


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


def _module_files() -> dict[str, Path]:
    """``{"anatomy_cli.models.info": path, ...}``: every module file of the package."""
    out = {}
    for path in (ROOT / "anatomy_cli").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules ``path`` imports anywhere in it: at the top, inside functions and under
    ``if TYPE_CHECKING:`` (a type-only import is still an edge a reader follows)."""
    import ast

    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out.update(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names)
    return {m for m in out if m in modules}


def _circles() -> list[list[str]]:
    """Import circles between the files of one folder (``models/adapters.py`` → ``models/info.py`` → ...),
    type-only imports counted: the strongly connected parts of each folder's import graph."""
    modules = _module_files()
    graph = {name: {m for m in _imported(path, name, modules) if m != name} for name, path in modules.items()}
    # A package's __init__ is a file of its own folder too (output/html/__init__.py <-> output/html/_page.py).
    folder = {name: path.parent for name, path in modules.items()}
    edges = {a: {b for b in graph[a] if b in folder and folder[b] == folder[a]} for a in folder}
    circles, seen = [], set()
    for start in sorted(edges):
        if start in seen:
            continue
        reach = _reachable(edges, start)
        part = sorted(m for m in reach if start in _reachable(edges, m))
        seen.update(part)
        if len(part) > 1:
            circles.append(part)
    return circles


def _reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    out, todo = {start}, [start]
    while todo:
        for nxt in edges[todo.pop()] - out:
            out.add(nxt)
            todo.append(nxt)
    return out


# corpus/activations.py <-> corpus/worker.py: a type-only import left to the corpus rewrite (issue 51 item 15);
# remove it here once that circle is gone (the test fails then, so this list cannot go stale).
KNOWN_CIRCLES: list[list[str]] = []


def test_no_import_circles_between_files_counting_type_only_imports():
    # import-linter's acyclic_siblings contract skips `if TYPE_CHECKING:` imports (exclude_type_checking_imports),
    # so a circle through a type-only import passes lint-imports; this counts them.
    assert _circles() == KNOWN_CIRCLES


def _long_functions(limit: int) -> list[str]:
    """Every function in anatomy_cli/ whose body (its docstring aside) runs past `limit` lines."""
    import ast

    found = []
    for path in sorted((ROOT / "anatomy_cli").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = node.body
            docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            first = body[1] if docstring and len(body) > 1 else body[0]
            lines = (node.end_lineno or first.lineno) - first.lineno + 1
            if lines > limit:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_body_runs_past_sixty_lines():
    # A function past ~60 lines has more than one job (issue 59).
    assert _long_functions(60) == []


def test_the_function_length_check_sees_a_long_body():
    # The check above must be able to fail: at a 20-line limit it finds functions (the engine's forward has more).
    assert len(_long_functions(20)) > 10
