"""The one list of commands: a :class:`Command` record each, in the order the docs name them.

A record says what the command is called, where its code lives (``module``: ``anatomy_cli/tasks/<module>.py``),
how it runs (``view``: the module of ``anatomy_cli/output/views`` of a command the prompt driver runs, whose CLI
command and API function are generated from the task module's hooks, ``cli/driver.py`` and ``api/_driven.py``;
None: a command of its own shape, ``anatomy_cli/cli/commands/<module>.py``), what it needs to run
(:class:`Needs`), whether a running ``anatomy serve`` answers it (:class:`Serve`), the Python API function that
runs it (``api``: ``(module of anatomy_cli/api, function)``) and its docs page. Nothing else lists command names:
``cli/main.py`` registers the records' commands, ``serve/client.py`` forwards by the records, ``api/__init__.py``
exports their functions,
``serve --status`` and docs/serve.md name the forwarded ones from them. Standard library only (the serve client
imports this before anything heavy).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from enum import Enum
from types import ModuleType


class Needs(str, Enum):
    """What a command reads before it can answer."""

    nothing = "nothing"      # arithmetic, files on disk, the tokenizer of a preset
    config = "config"        # a model's config or file header, no weights
    weights = "weights"      # a model's weights (encoders too)
    decoder = "decoder"      # a decoder's weights and LM head
    moe = "moe"              # a decoder with mixture-of-experts blocks


@dataclass(frozen=True)
class Serve:
    """Whether a running ``anatomy serve`` answers the command: ``forward`` (by default when it loads weights),
    only with one of ``only_with`` on the line, never with one of ``not_with`` on it (``why``: the reason, which
    ``serve --status`` and docs/serve.md give); ``forward=False`` with ``why``: never, and why."""

    forward: bool = True
    only_with: tuple[str, ...] = ()
    not_with: tuple[str, ...] = ()
    why: str = ""


@dataclass(frozen=True)
class Command:
    name: str
    module: str
    needs: Needs
    serve: Serve | None = None  # None: forwarded when it needs weights, else not
    api: tuple[str, str] | None = None  # (module under anatomy_cli/api, function name)
    docs: str | None = None  # the page under docs/, from the repository root
    view: str | None = None  # the prompt driver's view (output/views/<view>.py); None: cli/commands/<module>.py

    @property
    def forwarded(self) -> bool:
        """True when a running server answers the command (some option lines aside: :meth:`forwards`)."""
        if self.serve is not None:
            return self.serve.forward
        return self.needs not in (Needs.nothing, Needs.config)

    def forwards(self, options: set[str]) -> bool:
        """True when a server answers a command line of this command whose options are ``options``."""
        if not self.forwarded:
            return False
        serve = self.serve or Serve()
        return (not serve.only_with or bool(options & set(serve.only_with))) and not options & set(serve.not_with)

    @property
    def forwarded_name(self) -> str:
        """``tokens --model`` where the command is forwarded only with an option, else its name."""
        only = self.serve.only_with if self.serve else ()
        return f"{self.name} {only[0]}" if only else self.name

    @property
    def not_forwarded(self) -> str | None:
        """``corpus --ray: why``, ``convert: why``: what a server never answers of it, or None."""
        serve = self.serve
        if serve is None or not serve.why:
            return None
        what = self.name if not serve.forward else f"{self.name} {serve.not_with[0]}"
        return f"{what}: {serve.why}"


_RAY = ("--ray", "--ray-address")

# In the order docs/serve.md and `serve --help` name the forwarded commands; then those that load no weights.
COMMANDS: tuple[Command, ...] = (
    Command("trace", "trace", Needs.decoder, api=("_driven", "trace"), docs="docs/commands/trace.md", view="trace"),
    Command("next", "next_token", Needs.decoder, api=("_driven", "next_token"), docs="docs/commands/next.md",
            view="next"),
    Command("drift", "drift", Needs.weights, api=("_driven", "drift"), docs="docs/commands/drift.md", view="drift"),
    Command("lens", "lens", Needs.decoder, api=("_driven", "lens"), docs="docs/commands/lens.md", view="lens"),
    Command("dla", "dla", Needs.decoder, api=("_driven", "dla"), docs="docs/commands/dla.md", view="dla"),
    Command("attn", "attn", Needs.weights, api=("_driven", "attn"), docs="docs/commands/attn.md", view="attn"),
    Command("heads", "heads", Needs.weights, api=("_driven", "heads"), docs="docs/commands/heads.md", view="heads"),
    Command("ablate", "ablate", Needs.decoder, api=("_driven", "ablate"), docs="docs/commands/ablate.md",
            view="ablate"),
    Command("patch", "patch", Needs.decoder, api=("_driven", "patch"), docs="docs/commands/patch.md", view="patch"),
    Command("attribute", "attribute", Needs.decoder, api=("_driven", "attribute"), docs="docs/commands/attribute.md",
            view="attribute"),
    Command("tokens", "tokens", Needs.nothing, serve=Serve(only_with=("--model", "-m")),
            docs="docs/commands/tokens.md"),
    Command("report", "report", Needs.decoder, docs="docs/commands/report.md"),
    Command("diff", "diff", Needs.weights, api=("_diff", "diff"), docs="docs/commands/diff.md"),
    Command("corpus", "corpus", Needs.decoder, api=("_corpus", "corpus_stats"), docs="docs/commands/corpus.md",
            serve=Serve(not_with=_RAY, why="its Ray workers load their own copies of the model")),
    Command("verify", "verify", Needs.weights, api=("_verify", "verify"), docs="docs/commands/verify.md"),
    Command("generate", "generate", Needs.decoder, api=("_generation", "generate"),
            docs="docs/commands/generate.md"),
    Command("steer", "steer", Needs.decoder, api=("_generation", "steer"), docs="docs/commands/steer.md"),
    Command("sae", "sae", Needs.decoder, api=("_sae", "sae"), docs="docs/commands/sae.md"),
    Command("features", "features", Needs.decoder, api=("_features", "features"), docs="docs/commands/features.md",
            serve=Serve(not_with=_RAY, why="the same: its Ray workers load their own copies of the model")),
    Command("explain", "explain", Needs.decoder, api=("_explain", "explain"), docs="docs/commands/explain.md"),
    Command("route", "route", Needs.moe, api=("_driven", "route"), docs="docs/commands/route.md", view="route"),
    Command("fit-lens", "fit_lens", Needs.decoder, api=("_fit_lens", "fit_lens"), docs="docs/commands/fit-lens.md",
            serve=Serve(not_with=_RAY, why="the same: its Ray workers load their own copies of the model")),
    Command("lens-eval", "lens_eval", Needs.decoder, api=("_lens_eval", "lens_eval"),
            docs="docs/commands/lens-eval.md"),
    Command("circuit", "circuit", Needs.decoder, api=("_circuit", "circuit"), docs="docs/commands/circuit.md"),
    Command("fit-sae", "fit_sae", Needs.decoder, api=("_fit_sae", "fit_sae"), docs="docs/commands/sae.md"),
    Command("params", "params", Needs.config, docs="docs/commands/params.md"),
    Command("layernorm", "layernorm", Needs.nothing, docs="docs/commands/layernorm.md"),
    Command("models", "models", Needs.nothing, docs="docs/commands/models.md"),
    Command("convert", "convert", Needs.weights, docs="docs/commands/convert.md",
            serve=Serve(forward=False, why="it saves the weights, and the server's copies of tied weights share one "
                        "buffer, which safetensors refuses to save; a one-off conversion gains nothing from a "
                        "loaded model")),
    Command("serve", "serve", Needs.nothing, docs="docs/serve.md"),
)

BY_NAME: dict[str, Command] = {c.name: c for c in COMMANDS}


def record(name: str) -> Command:
    """The record of the command called ``name`` (KeyError for none)."""
    return BY_NAME[name]


def forwarded() -> tuple[Command, ...]:
    """The commands a running server answers, in the docs' order."""
    return tuple(c for c in COMMANDS if c.forwarded)


def docs_index() -> str:
    """docs/commands/README.md: every command with what it needs, whether a server answers it, its API function
    and its page (tests/test_declarations.py checks the file against this; ``python -m
    anatomy_cli.declare.commands > docs/commands/README.md`` writes it)."""
    lines = ["# Commands", "", "Written from the command records (anatomy_cli/declare/commands.py): "
             "`python -m anatomy_cli.declare.commands > docs/commands/README.md`.", "",
             "| command | needs | answered by `anatomy serve` | Python API | page |", "|---|---|---|---|---|"]
    for c in sorted(COMMANDS, key=lambda c: c.name):
        served = "yes" if c.forwarded and not (c.serve and (c.serve.only_with or c.serve.not_with)) else "no"
        if c.serve and c.serve.only_with:
            served = f"with {c.serve.only_with[0]}"
        elif c.serve and c.serve.not_with and c.forwarded:
            served = f"yes, not with {c.serve.not_with[0]}"
        api = f"`anatomy.{c.api[1]}`" if c.api else "–"
        page = c.docs.removeprefix("docs/commands/").removeprefix("docs/") if c.docs else ""
        link = f"[{page}]({page})" if c.docs and c.docs.startswith("docs/commands/") else f"[{page}](../{page})"
        lines.append(f"| `{c.name}` | {c.needs.value} | {served} | {api} | {link} |")
    return "\n".join(lines) + "\n"


def when_run(module: str) -> ModuleType:
    """``anatomy_cli.<module>``, a part only a command's run needs (its view, run phase, analysis, server or
    pictures), imported when the command runs. `anatomy --help` imports every command's declaration (its task and
    CLI modules) to list it, and nothing the commands run: this is the one import at that boundary. An import inside
    a function elsewhere is at a heavy library (torch, transformers, matplotlib ...; tests/test_lazy_imports.py)."""
    return importlib.import_module(f"anatomy_cli.{module}")


if __name__ == "__main__":
    print(docs_index(), end="")
