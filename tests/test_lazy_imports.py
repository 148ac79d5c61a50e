"""Lazy imports only at the heavy boundaries (issue 59 item 7): an import inside a function must name a module that
pulls a heavy library when imported; every other import sits at the top of its module, where a reader sees it.

"Heavy", by a static rule (no subprocess, no import): the import pulls a library in HEAVY that its own module does not
pull already; a module pulls a library it imports at its top level, itself or through the package's modules it imports
at the top level (their packages' __init__ included), transitively. `if TYPE_CHECKING:` blocks are not imports; a class body is top level. A name the engine's
lazy package resolves on first use (``from anatomy_cli.engine import load``) is the module its ``_EXPORTS`` names.
What only a command's run needs goes through ``anatomy_cli.declare.commands.when_run`` instead (`--help` lists every
command without importing it). CONTRIBUTING.md, "Imports".
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from test_layout import _module_files

ROOT = Path(__file__).resolve().parents[1]

# What keeps a lazy import lazy. torch, transformers, the plotting libraries, Ray, llama.cpp and Parquet: seconds or
# hundreds of modules. numpy and gguf (which imports numpy): off `--help` and `import anatomy_cli`. rich: off a
# piped command's path (tests/test_cold_imports.py); typer: off the API's (tests/test_api_imports.py).
# huggingface_hub's functions pull its HTTP client (~350 modules, ~0.3 s); the tokenizer libraries (tokenizers,
# tiktoken) and PyYAML load native extensions and 25-40 modules each, needed only once a tokenizer or a transcoder
# config is read: all three off `--help`'s path. The rest import torch (accelerate, captum, sparsify,
# safetensors.torch), numpy (pandas, safetensors.numpy) or pyarrow (datasets), or are optional extras that may be
# missing (playwright, kaleido, circuit_tracer).
HEAVY = ("torch", "transformers", "matplotlib", "plotly", "ray", "llama_cpp", "pyarrow", "numpy", "gguf", "rich",
         "typer", "huggingface_hub", "tokenizers", "tiktoken", "tiktoken_ext", "yaml", "accelerate", "captum",
         "sparsify", "safetensors.torch", "safetensors.numpy", "pandas", "datasets", "playwright", "kaleido",
         "circuit_tracer")

_INDENTED_IMPORT = re.compile(r"^[ \t]+(?:import|from)\s", re.M)


@cache
def modules() -> dict[str, Path]:
    """``{"anatomy_cli.models.info": path, ...}``: every module of the package."""
    return _module_files()


@cache
def _source(name: str) -> str:
    return modules()[name].read_text(encoding="utf-8")


@cache
def _tree(name: str) -> ast.Module:
    return ast.parse(_source(name))


def _package(name: str) -> str:
    return name if modules()[name].name == "__init__.py" else name.rpartition(".")[0]


@cache
def _lazy_names(name: str) -> dict[str, str]:
    """A PEP 562 package's ``_EXPORTS`` (``{"loading": ("load", ...)}``) as ``{"load": "anatomy_cli.engine.loading"}``."""
    for node in _tree(name).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_EXPORTS" for t in node.targets):
            exports = ast.literal_eval(node.value)
            return {n: f"{name}.{module}" for module, names in exports.items() for n in names}
    return {}


def targets(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """What an import statement in module ``name`` imports: the package's modules (``anatomy_cli.x.y``) and the
    libraries (``torch``, ``safetensors.torch``, ``json``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        parts = _package(name).split(".")
        base = ".".join(parts[:len(parts) - node.level + 1] + ([base] if base else []))
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.append(sub if sub in modules() else _lazy_names(base).get(alias.name, base) if base in modules()
                     else base)
    return found


@cache
def _imports(name: str) -> tuple[list[ast.Import | ast.ImportFrom], list[ast.Import | ast.ImportFrom]]:
    """Module ``name``'s imports that run when it is imported (not in a function, not under `if TYPE_CHECKING:`)
    and those inside its functions. Statements only: an import is never inside an expression."""
    top: list[ast.Import | ast.ImportFrom] = []
    inside: list[ast.Import | ast.ImportFrom] = []
    todo: list[tuple[ast.AST, bool]] = [(node, False) for node in _tree(name).body]
    while todo:
        node, in_function = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            (inside if in_function else top).append(node)
            continue
        in_function = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        type_only = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for field in ("orelse",) if type_only else ("body", "orelse", "finalbody", "handlers", "cases"):
            todo += [(child, in_function) for child in getattr(node, field, ())]
    return top, inside


def _imported(name: str) -> tuple[set[str], set[str]]:
    """The package's modules and the libraries module ``name`` imports at its top level, its parent packages
    included (Python runs them first)."""
    parts = name.split(".")
    own = {".".join(parts[:i]) for i in range(1, len(parts))}
    libraries = set()
    for node in _imports(name)[0]:
        for target in targets(name, node):
            (own if target in modules() else libraries).add(target)
    own.discard(name)
    return own, libraries


@cache
def pulls(name: str) -> frozenset[str]:
    """The HEAVY libraries importing module ``name`` imports (the rule above)."""
    seen, todo, found = {name}, [name], set()
    while todo:
        own, libraries = _imported(todo.pop())
        found |= {h for h in HEAVY for lib in libraries if lib == h or lib.startswith(h + ".")}
        todo += own - seen
        seen |= own
    return frozenset(found)


def is_heavy(name: str, node: ast.Import | ast.ImportFrom) -> bool:
    """True when the import pulls a heavy library that module ``name`` does not already import at its top."""
    pulled = [pulls(t) if t in modules() else {h for h in HEAVY if t == h or t.startswith(h + ".")}
              for t in targets(name, node)]
    return bool(frozenset().union(*pulled) - pulls(name))


def in_function_imports() -> list[tuple[str, ast.Import | ast.ImportFrom]]:
    """Every import inside a function of the package, with its module's name."""
    return [(name, node) for name in sorted(modules()) if _INDENTED_IMPORT.search(_source(name))
            for node in sorted(_imports(name)[1], key=lambda n: n.lineno)]


def light_lazy_imports() -> list[str]:
    """``"anatomy_cli/x.py:12: from anatomy_cli.y import z"`` for each import inside a function that pulls nothing
    heavy."""
    return [f"{modules()[name].relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
            for name, node in in_function_imports() if not is_heavy(name, node)]


def test_the_rule_reads_the_package():
    assert "torch" in pulls("anatomy_cli.engine.loading")  # at its top
    assert pulls("anatomy_cli.errors") == frozenset()
    assert pulls("anatomy_cli.engine") == frozenset()  # a lazy package: `engine.load` imports torch on first use
    code = ("from anatomy_cli.engine import load", "from anatomy_cli import engine", "import json",
            "from safetensors.torch import save_file", "from . import sites")
    heavy = [is_heavy("anatomy_cli.models.info", ast.parse(line).body[0]) for line in code]
    assert heavy == [True, False, False, True, False]
    assert not is_heavy("anatomy_cli.engine.loading", ast.parse("import torch").body[0])  # torch there already


def test_imports_inside_functions_are_heavy_boundaries():
    # Hoist the import to the top of its module (a circle it makes means the two modules share something that
    # belongs in a third, lower one); what only a command's run needs: declare.commands.when_run.
    assert light_lazy_imports() == []
