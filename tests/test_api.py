"""The Python API (anatomy_cli.api, `import anatomy_cli as anatomy`): each function's to_dict() is the command's
--format json for the same prompt and model; the hook context leaves no hook behind; importing stays torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import anatomy_cli as anatomy
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Thank you very much"
SAE = ROOT / "tests" / "fixtures" / "sae" / "saelens-standard"  # blocks.1.hook_resid_post, d_sae 64


def cli_json(*args: str) -> dict:
    result = CliRunner().invoke(app, [*args, "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def as_json(data: dict) -> dict:
    return json.loads(json.dumps(data))


@pytest.mark.parametrize("module", ["anatomy_cli", "anatomy_cli.api"])
def test_importing_the_api_loads_no_torch(module):
    code = (f"import sys, json; import {module} as m; m.trace; m.ModelSpec; "
            "print(json.dumps(sorted(x for x in ('torch', 'transformers', 'matplotlib', 'pandas', 'typer') "
            "if x in sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == []


def test_no_public_name_is_shadowed_by_a_subpackage():
    # Importing anatomy_cli.corpus sets the package's attribute `corpus` to that module: a public function of the
    # same name would be unreachable as anatomy.corpus after the first run.
    subpackages = {p.name for p in (ROOT / "anatomy_cli").iterdir() if (p / "__init__.py").is_file()}
    subpackages |= {p.stem for p in (ROOT / "anatomy_cli").glob("*.py")}
    import anatomy_cli.api  # the attribute `api` exists once the subpackage is imported (here, not by order)

    assert not set(anatomy_cli.api.__all__) & subpackages


def test_unknown_names_are_attribute_errors():
    with pytest.raises(AttributeError):
        anatomy.no_such_function  # noqa: B018
    assert set(anatomy.api.__all__) <= set(dir(anatomy))


# (API call, CLI arguments after the model) for the same prompt and options.
CASES = {
    "trace": (lambda lm: anatomy.trace(lm, PROMPT, target=" much", k=3),
              ["trace", PROMPT, "--target", " much", "-k", "3"]),
    "next": (lambda lm: anatomy.next_token(lm, PROMPT, k=4), ["next", PROMPT, "-k", "4"]),
    "lens": (lambda lm: anatomy.lens(lm, PROMPT, stat="rank", target=" much", stride=2, k=2),
             ["lens", PROMPT, "--stat", "rank", "--target", " much", "--stride", "2", "-k", "2"]),
    "lens --layers": (lambda lm: anatomy.lens(lm, PROMPT, layers=["embed", 0], target_id=881),
                      ["lens", PROMPT, "--layers", "embed,0", "--target-id", "881"]),
    "dla": (lambda lm: anatomy.dla(lm, PROMPT, target=" much", foil=" Paris", by="head", top=5),
            ["dla", PROMPT, "--target", " much", "--foil", " Paris", "--by", "head", "--top", "5"]),
    "heads": (lambda lm: anatomy.heads(lm, PROMPT, seq_len=6, sort="induction", top=3),
              ["heads", PROMPT, "--seq-len", "6", "--sort", "induction", "--top", "3"]),
    "attn": (lambda lm: anatomy.attn(lm, PROMPT, layer=1, head=0), ["attn", PROMPT, "--layer", "1", "--head", "0"]),
    "attn --layer": (lambda lm: anatomy.attn(lm, PROMPT, layer=-1, position=1, k=2),
                     ["attn", PROMPT, "--layer", "-1", "--position", "1", "--top", "2"]),
    "ablate": (lambda lm: anatomy.ablate(lm, PROMPT, target=" much", heads=True),
               ["ablate", PROMPT, "--target", " much", "--heads"]),
    "patch": (lambda lm: anatomy.patch(lm, "Thank you very much", "Thank you so much", target=" much"),
              ["patch", "Thank you very much", "Thank you so much", "--target", " much"]),
    "attribute": (lambda lm: anatomy.attribute(lm, PROMPT, target=" much", steps=4),
                  ["attribute", PROMPT, "--target", " much", "--steps", "4"]),
    "drift": (lambda lm: anatomy.drift(lm, "bank", ["I paid at the bank.", "We swam to the bank."]),
              ["drift", "bank", "-c", "I paid at the bank.", "-c", "We swam to the bank."]),
    "generate": (lambda lm: anatomy.generate(lm, PROMPT, max_new_tokens=3, k=2, lens=True, check=True),
                 ["generate", PROMPT, "--max-new-tokens", "3", "-k", "2", "--lens", "--check"]),
    "generate-feature": (lambda lm: anatomy.generate(lm, PROMPT, max_new_tokens=2, steer_feature=5, sae=SAE,
                                                     coef=[-2, 0, 2], target=" much"),
                         ["generate", PROMPT, "--max-new-tokens", "2", "--steer-feature", "5", "--sae", str(SAE),
                          "--coef", "-2,0,2", "--target", " much"]),
    "steer": (lambda lm: anatomy.steer(lm, positive="I love it", negative="I hate it", layer="0-1", reduce="mean"),
              ["steer", "--positive", "I love it", "--negative", "I hate it", "--layer", "0-1", "--reduce", "mean"]),
    "sae": (lambda lm: anatomy.sae(lm, PROMPT, sae=SAE, features=[3, 5], top=2, lens_top=2),
            ["sae", PROMPT, "--sae", str(SAE), "--feature", "3", "--feature", "5", "--top", "2", "--lens-top", "2"]),
}


@pytest.mark.usefixtures("cached_load")
@pytest.mark.parametrize("command", list(CASES))
def test_each_function_returns_the_commands_json(command, tiny_model_dir):
    path = str(tiny_model_dir("gpt2"))
    call, args = CASES[command]
    lm = anatomy.load(path)
    result = call(lm)
    assert isinstance(result, anatomy.Result)
    assert as_json(result.to_dict()) == cli_json(args[0], "-m", path, *args[1:])
    assert len(result.rows) == len(result.to_dict()[result.rows_key]) > 0
    assert "<table>" in result._repr_html_()


@pytest.mark.usefixtures("cached_load")
def test_a_list_of_prompts_gives_a_list_and_the_result_object_is_the_commands(tiny_model_dir):
    from anatomy_cli.analyses.trace import Trace

    path = str(tiny_model_dir("llama"))
    results = anatomy.trace(anatomy.ModelSpec(path), ["Thank you very", "The capital of France is"])
    assert [r.to_dict()["prompt"] for r in results] == ["Thank you very", "The capital of France is"]
    assert isinstance(results[0].result, Trace) and results[0].layers is results[0].result.layers


@pytest.mark.usefixtures("cached_load")
def test_to_pandas_is_long_form(tiny_model_dir):
    pd = pytest.importorskip("pandas")
    lm = anatomy.load(str(tiny_model_dir("gpt2")))
    grid = anatomy.lens(lm, PROMPT)
    frame = grid.to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert len(frame) == (lm.n_layers + 1) * len(grid.to_dict()["tokens"])
    assert {"layer", "position"} <= set(frame.columns)


def test_to_pandas_numeric_columns_are_float64_with_nan():
    """An all-null numeric column (a patch's value when clean = corrupt) and numbers with gaps are float64 with
    NaN; text stays text."""
    pd = pytest.importorskip("pandas")
    from anatomy_cli.api._results import Result

    rows = [{"layer": 0, "value": None, "shift": 1, "token": "a"},
            {"layer": 1, "value": None, "shift": None, "token": "b"}]
    frame = Result("patch", None, {"cells": rows}, "cells").to_pandas()
    assert frame["value"].dtype == "float64" and frame["value"].isna().all()
    assert frame["shift"].dtype == "float64" and frame["shift"].tolist()[0] == 1.0 and pd.isna(frame["shift"][1])
    assert frame["layer"].dtype == "int64" and not pd.api.types.is_numeric_dtype(frame["token"])


@pytest.mark.usefixtures("cached_load")
def test_plot_is_the_figure_the_command_saves(tiny_model_dir):
    from matplotlib.figure import Figure

    lm = anatomy.load(str(tiny_model_dir("gpt2")))
    fig = anatomy.trace(lm, PROMPT).plot()
    assert isinstance(fig, Figure)
    assert "trace" in fig.texts[0].get_text() or fig.axes


@pytest.mark.usefixtures("cached_load")
def test_bad_options_are_the_commands_errors(tiny_model_dir):
    lm = anatomy.load(str(tiny_model_dir("gpt2")))
    # the options class's message in the API's words (anatomy_cli.declare.fields.api_words)
    with pytest.raises(UsageError, match="stat='rank' is the target's rank: give target=TEXT or target_id=N"):
        anatomy.lens(lm, PROMPT, stat="rank")
    with pytest.raises(UsageError, match="out of range"):
        anatomy.trace(lm, PROMPT, position=40)
    with pytest.raises(UsageError):
        anatomy.dla(lm, PROMPT)
    with pytest.raises(ValueError):
        anatomy.lens(lm, PROMPT, stat="bogus")


def _hook_count(lm) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in lm.model.modules())


def test_hooks_edit_activations_and_leave_nothing_behind_on_error(tiny_lm):
    import torch

    lm = tiny_lm("gpt2")
    before = _hook_count(lm)
    ids = torch.tensor([[464, 3139, 286, 4881]])
    clean = lm.model(ids).logits
    with anatomy.capture(lm, ["blocks.0.hook_resid_post", "logits"]) as seen:
        lm.model(ids)
    assert seen["blocks.0.hook_resid_post"].shape == (1, 4, lm.d_model)
    assert torch.allclose(seen["logits"], clean)
    with anatomy.hooks(lm, {"blocks.0.hook_attn_out": lambda t: torch.zeros_like(t)}):
        assert _hook_count(lm) > before
        edited = lm.model(ids).logits
    assert not torch.allclose(edited, clean)
    with pytest.raises(RuntimeError, match="boom"):
        with anatomy.hooks(lm, {"blocks.1.hook_resid_pre": lambda t: t * 2}):
            raise RuntimeError("boom")
    assert _hook_count(lm) == before
    with pytest.raises(UsageError):
        with anatomy.hooks(lm, {"blocks.99.hook_resid_pre": lambda t: t}):
            pass
    assert _hook_count(lm) == before
    assert torch.equal(lm.model(ids).logits, clean)
    assert "blocks.0.hook_resid_pre" in anatomy.hook_names(lm)


@pytest.mark.usefixtures("cached_load")
def test_diff_returns_the_commands_json(tiny_model_dir):
    path = str(tiny_model_dir("llama"))
    weights = anatomy.diff(path, path)
    assert as_json(weights.to_dict()) == cli_json("diff", path, path)
    spec = anatomy.ModelSpec(path, device="cpu")
    acts = anatomy.diff(spec, spec, "Thank you very", target=" much", k=3)
    expected = cli_json("diff", path, path, "Thank you very", "--device", "cpu", "--target", " much", "--k", "3")
    assert as_json(acts.to_dict()) == expected
    assert [r["layer"] for r in acts.rows] == ["embed", *range(len(acts.rows) - 1)]
    with pytest.raises(UsageError, match="^target= needs a PROMPT"):  # the keyword, not the flag
        anatomy.diff(path, path, target=" much")


@pytest.mark.usefixtures("cached_load")
def test_corpus_returns_the_commands_json_and_draws_its_picture(tiny_model_dir, tmp_path):
    from matplotlib.figure import Figure

    path = str(tiny_model_dir("gpt2"))
    source = tmp_path / "text.txt"
    source.write_text("The cat sat on the mat. " * 12 + "\n\nA second paragraph, about dogs. " * 6, encoding="utf-8")
    lm = anatomy.load(path)
    result = anatomy.corpus_stats(lm, source, ctx=16, max_tokens=96, heads=True)
    expected = cli_json("corpus", str(source), "-m", path, "--ctx", "16", "--max-tokens", "96", "--heads")
    assert as_json(result.to_dict()) == expected
    assert result.stats.tokens == expected["tokens"] > 0 and len(result.rows) == lm.n_layers + 1
    assert len(expected["heads"]) == lm.n_layers * lm.info.n_heads
    assert isinstance(result.plot(), Figure)
    by_name = anatomy.corpus_stats(path, source, ctx=16, max_tokens=96, lens=False)  # a name: opened and loaded
    assert all(row["kl_nats"] is None for row in by_name.rows)
    assert [r["resid_norm"] for r in by_name.rows] == [r["resid_norm"] for r in expected["layers"]]


def _cli_options(command: str) -> set[str]:
    """The long options of a command, as option-dataclass field names (``--top-p`` -> ``top_p``)."""
    import typer.main

    from anatomy_cli.cli.main import app as cli

    click = typer.main.get_command(cli).commands[command]  # type: ignore[attr-defined]
    names = set()
    for param in click.params:
        longs = [o for o in param.opts if o.startswith("--")]
        if longs:
            names.add(longs[0][2:].replace("-", "_"))
    return names


# the options every prompt command has, outside the task's options dataclass (ModelSpec, PromptOptions,
# --format, --plot); the API takes the model and prompts= instead
_COMMON = {"model", "device", "dtype", "revision", "trust_remote_code", "init", "seed_init", "device_map",
           "offline", "gguf_dequant", "bos", "allow_special", "truncate", "chat", "format", "plot", "help"}


@pytest.mark.parametrize("command, function, options", [
    ("generate", "generate", "GenerateOptions"), ("steer", "steer", "SteerOptions"), ("sae", "sae", "SaeOptions")])
def test_every_option_is_a_keyword_and_a_field(command, function, options):
    # Issue 47: every CLI option has an API keyword of the same name, built into the same options dataclass.
    import dataclasses
    import importlib
    import inspect

    task = importlib.import_module(f"anatomy_cli.tasks.{command}")
    fields = set()
    for f in dataclasses.fields(getattr(task, options)):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        fields |= {g.name for g in dataclasses.fields(value)} if dataclasses.is_dataclass(value) else {f.name}
    fields -= {"sides"}
    keywords = set(inspect.signature(getattr(anatomy, function)).parameters) - {"model", "prompt", "prompts"}
    cli = _cli_options(command) - _COMMON
    cli = {{"top": "k"}.get(o, o) if command == "generate" else o for o in cli}
    cli = {{"feature": "features"}.get(o, o) for o in cli}
    spec = {f.name for f in dataclasses.fields(anatomy.ModelSpec)}
    assert keywords == fields, keywords ^ fields
    assert cli - spec == fields, (cli - spec) ^ fields


def test_a_tasks_warning_reaches_stderr_from_the_api(tiny_model_dir, capsys):
    # the API installs the stderr sink as the CLI does: --bos on a prompt that starts with BOS is said, not swallowed
    lm = anatomy.load(str(tiny_model_dir("gpt2")))
    capsys.readouterr()
    anatomy.next_token(lm, "<|endoftext|>Thank you", prompts=anatomy.PromptOptions(bos=True, allow_special=True))
    assert "warning: prompt already starts with the BOS token" in capsys.readouterr().err


def test_load_writes_no_loading_bar_on_stderr_as_the_cli_does(tiny_model_dir, capfd):
    # issue 61 item 12: anatomy.load printed transformers' "Loading weights" progress bar on stderr; the CLI,
    # which loads through tasks.session.load_weights, never does. The bar's switch is process-wide: turned on here
    # as in a fresh process (a command run earlier in this one turned it off), and restored.
    from transformers.utils import logging as hf_logging

    path = str(tiny_model_dir("llama"))
    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.enable_progress_bar()
    try:
        capfd.readouterr()
        lm = anatomy.load(path, device="cpu")
        err = capfd.readouterr().err
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()
    assert lm.n_layers == 2
    assert "Loading weights" not in err and "it/s]" not in err, err


def test_python_md_documents_every_public_name():
    # issue 61 item 11: docs/python.md had no `circuit`. Every function of __all__ has its entry (`name(` with its
    # arguments, in the table or the hooks' example) and every class is named.
    import re

    text = (ROOT / "docs" / "python.md").read_text(encoding="utf-8")
    from anatomy_cli import api

    for name in api.__all__:
        if name[0].isupper():
            assert f"`{name}" in text or f"{name}(" in text, name
        else:
            assert re.search(rf"(`|anatomy\.){name}\(\w", text), f"docs/python.md has no `{name}(...)` entry"
