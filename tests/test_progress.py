"""Long work says how far it is (issue 42 item 4): status lines with an ETA, a cost warning before a long
run, and `diff` of two architectures answered from the headers before any tensor is read."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.models import cost
from anatomy_cli.output.sink import progress_line

runner = CliRunner()


def invoke(args, **env):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200", **env})


COMMANDS = [
    ["lens", "The capital of France is"],
    ["patch", "The capital of France is", "The capital of Italy is", "--target", " Paris", "--foil", " Rome"],
    ["ablate", "The capital of France is", "--target", " Paris"],
    ["attribute", "The capital of France is", "--target", " Paris", "--steps", "4", "--allow-unconverged"],
    ["heads", "The capital of France is", "--seq-len", "8"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: a[0])
def test_status_lines_leave_stdout_unchanged(tiny_model_dir, cached_load, args):
    model = ["--model", tiny_model_dir("gpt2")]
    quiet = invoke([*args, *model])
    shown = invoke([*args, *model], ANATOMY_STATUS="1")
    assert quiet.exit_code == shown.exit_code == 0, shown.output
    assert shown.stdout == quiet.stdout
    lines = shown.stderr.splitlines()
    assert [line for line in lines if line in quiet.stderr.splitlines()] == quiet.stderr.splitlines()
    assert not any(line.startswith(("loading ", f"{args[0]}: ")) for line in quiet.stderr.splitlines())
    assert f"loading {tiny_model_dir('gpt2')}" in lines
    done = [line for line in lines if line.startswith(f"{args[0]}: ")]
    assert done and "/" in done[-1]  # e.g. "patch: 25/25 patched runs": the last step is always shown
    n_done, total = done[-1].split(": ", 1)[1].split(" ")[0].split("/")
    assert n_done == total


def test_progress_line_gives_an_eta():
    assert progress_line("lens", 0, 5000, "positions", 0.0) == "lens: 0/5,000 positions"
    assert progress_line("lens", 1000, 5000, "positions", 30.0) == "lens: 1,000/5,000 positions · ETA 2:00"
    assert progress_line("lens", 5000, 5000, "positions", 150.0) == "lens: 5,000/5,000 positions"


def test_cost_warning_before_a_long_run(tiny_model_dir, cached_load, monkeypatch):
    model = ["--model", tiny_model_dir("gpt2")]
    assert "warning" not in invoke(["lens", "a b c", *model]).stderr  # a tiny model is quick
    monkeypatch.setattr(cost, "WARN_SECONDS", 0.0)
    quiet = invoke(["lens", "a b c", *model])
    warned = [line for line in quiet.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warned) == 1 and warned[0].startswith("warning: lens on ") and " FLOP, roughly " in warned[0]


def test_cost_rule():
    class Info:
        n_layers, d_model, lm_head_rows = 30, 576, 49152
    # 12 L d² + V d weights, 2 FLOP each per token, plus attention 2 L T² d.
    assert cost.forward_flops(Info, 10) == 2 * (12 * 30 * 576 ** 2 + 49152 * 576) * 10 + 2 * 30 * 100 * 576
    assert cost.lens_flops(Info, 5000) == 2 * 31 * 5000 * 49152 * 576
    assert cost.warning("x", 1e9, "cpu") is None
    assert cost.warning("lens", cost.lens_flops(Info, 5000), "cpu") == \
        "lens: about 8.8e+12 FLOP, roughly 3 min on cpu (a rough estimate)"


def test_diff_of_two_families_reads_no_tensor(tiny_model_dir, monkeypatch):
    from anatomy_cli.analyses.diff import weights

    def no(*args, **kwargs):
        raise AssertionError("a tensor reader was opened")

    monkeypatch.setattr(weights, "open_tensors", no)  # where diff reads it
    result = invoke(["diff", tiny_model_dir("gpt2"), tiny_model_dir("llama")])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "is a gpt2 model and" in result.stderr and "a llama model (from their headers)" in result.stderr
    assert "differ in architecture" in result.stderr


def test_a_served_commands_progress_reaches_its_client():
    # In `anatomy serve`, the status line goes to the client: an update replaces the line of its own block.
    from anatomy_cli.output import sink
    from anatomy_cli.serve.session import Captured

    sent = []
    err = Captured("utf-8", True, sent.append)
    import sys
    saved, sys.stderr = sys.stderr, err
    try:
        with sink.status("patch") as line:
            line.counter("patch", "patched runs")(3, 3)
            with sink.status("inner"):
                line.update("patch: hidden while inner shows")
            line.update("patch: 4/4 patched runs")
    finally:
        sys.stderr = saved
    assert sent == ["patch", "patch: 3/3 patched runs", "inner", "patch: hidden while inner shows",
                    "patch: 4/4 patched runs", ""]
    assert err.value() == b""  # nothing drawn into the answer's stderr
