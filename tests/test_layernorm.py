"""`anatomy layernorm`: the article's example, equality with torch, negative numbers as values, bad input."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses.layernorm import layer_norm
from anatomy_cli.analyses.layernorm import parse_list
from anatomy_cli.cli.main import app

runner = CliRunner()
ARTICLE = [100, 0.001, -50, 25]


def _json(*args):
    result = runner.invoke(app, ["layernorm", *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _torch(values, gamma=None, beta=None, eps=1e-5):
    x = torch.tensor(values, dtype=torch.float64)
    w = None if gamma is None else torch.tensor(gamma, dtype=torch.float64)
    b = None if beta is None else torch.tensor(beta, dtype=torch.float64)
    return torch.nn.functional.layer_norm(x, (len(values),), w, b, eps).tolist()


def test_article_example():
    data = _json("100", "0.001", "-50", "25")
    assert data["values"] == [100.0, 0.001, -50.0, 25.0]
    assert round(data["mean"], 5) == 18.75025
    assert round(data["std"], 4) == 54.1265
    assert round(data["variance"], 4) == 2929.6781
    assert data["eps"] == 1e-5
    assert [round(v, 4) for v in data["normalized"]] == [1.5011, -0.3464, -1.2702, 0.1155]
    assert data["output"] == data["normalized"]
    assert data["gamma"] == [1.0] * 4 and data["beta"] == [0.0] * 4
    assert data["output"] == pytest.approx(_torch(ARTICLE), abs=1e-12)
    # the article's figures (σ = 55.9; [1.45, -0.34, -1.23, 0.11]) are not these; see docs/commands/layernorm.md
    assert round(data["std"], 1) != 55.9 and round(data["output"][0], 2) != 1.45


def test_population_not_sample_variance():
    result = layer_norm([1.0, 2.0, 3.0, 4.0], eps=0.0)
    assert result.variance == 1.25  # sum of squares 5 / n (n - 1 would give 1.6667)
    assert result.denominator == result.std == 1.25 ** 0.5


def test_gamma_beta_match_torch():
    gamma, beta = [1.0, 2.0, -0.5, 3.0], [0.0, 0.25, -1.0, 10.0]
    data = _json("100", "0.001", "-50", "25", "--gamma", "1,2,-0.5,3", "--beta", "0, 0.25, -1, 10")
    assert data["gamma"] == gamma and data["beta"] == beta
    assert data["output"] == pytest.approx(_torch(ARTICLE, gamma, beta), abs=1e-12)
    assert data["output"][3] == pytest.approx(data["normalized"][3] * 3.0 + 10.0)


def test_random_vectors_match_torch():
    gen = torch.Generator().manual_seed(0)
    for n in (2, 7, 64):
        x = (torch.randn(n, generator=gen, dtype=torch.float64) * 30 + 5).tolist()
        g = torch.randn(n, generator=gen, dtype=torch.float64).tolist()
        b = torch.randn(n, generator=gen, dtype=torch.float64).tolist()
        for eps in (1e-5, 1e-12, 0.5):
            ours = layer_norm(x, gamma=g, beta=b, eps=eps).output
            assert list(ours) == pytest.approx(_torch(x, g, b, eps), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("args", [
    ["-50", "100", "0.001", "25"],
    ["--eps", "1e-5", "-50", "100", "0.001", "25"],
    ["-50", "--format", "json", "100", "0.001", "25"],
    ["-50", "100", "--eps=1e-5", "0.001", "25"],
    ["--format", "json", "--", "-50", "100", "0.001", "25"],
])
def test_negative_numbers_are_values_and_options_work_anywhere(args):
    if "--format" not in args:
        args = [*args, "--format", "json"]
    result = runner.invoke(app, ["layernorm", *args])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["values"] == [-50.0, 100.0, 0.001, 25.0]
    assert round(data["mean"], 5) == 18.75025 and data["eps"] == 1e-5


def test_number_spellings():
    assert _json("-1e-3", "-.5", "+2", "3.", "-0")["values"] == [-0.001, -0.5, 2.0, 3.0, -0.0]


def test_negative_gamma_and_short_format_option():
    data = _json("1", "-2", "--gamma", "-1,-2", "--beta=-0.5,0.5")
    assert data["gamma"] == [-1.0, -2.0] and data["beta"] == [-0.5, 0.5]
    assert data["output"] == pytest.approx(_torch([1.0, -2.0], [-1.0, -2.0], [-0.5, 0.5]), abs=1e-12)
    result = runner.invoke(app, ["layernorm", "-3", "-f", "tsv", "3"])
    assert result.exit_code == 0 and result.stdout.startswith("quantity\tvalue\nmean\t0.0\n")


def test_help_still_works():
    for flag in ("-h", "--help"):
        result = runner.invoke(app, ["layernorm", "-5", flag])
        assert result.exit_code == 0 and "Example" in result.stdout


def test_single_value_outputs_beta_and_says_so():
    result = runner.invoke(app, ["layernorm", "5", "--beta", "0.5", "--format", "json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["output"] == [0.5] and data["normalized"] == [0.0]
    assert data["variance"] == 0.0 and data["std"] == 0.0 and data["mean"] == 5.0
    assert result.stderr.startswith("warning: all values are equal, so variance = 0")
    assert "output is β" in result.stderr


def test_equal_values_give_exactly_beta():
    # 0.1 * 3 / 3 != 0.1 in floating point; the result is still exactly β.
    result = layer_norm([0.1, 0.1, 0.1], beta=[1.0, 2.0, 3.0])
    assert result.constant and result.output == (1.0, 2.0, 3.0) and result.centered == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("args, message", [
    ([], "error: no values: give the numbers to normalise"),
    (["1", "abc"], "error: value 'abc' is not a number"),
    (["1", "nan"], "error: value 'nan' is not finite"),
    (["1", "-inf"], "error: value '-inf' is not finite"),
    (["inf", "1"], "error: value 'inf' is not finite"),
    (["1", "2", "--gamma", "1,2,3"], "error: --gamma has 3 values but the input has 2; give one per input value"),
    (["1", "2", "--beta", "1"], "error: --beta has 1 values but the input has 2"),
    (["1", "2", "--gamma", "1,,2"], "error: --gamma '1,,2' has an empty item"),
    (["1", "2", "--gamma", ""], "error: --gamma is empty"),
    (["1", "2", "--beta", "0,x"], "error: --beta item 'x' is not a number"),
    (["1", "2", "--eps", "-1e-5"], "error: --eps must be a finite number >= 0"),
    (["1", "1", "--eps", "0"], "error: all values are equal and --eps is 0"),
    (["1e300", "-1e300"], "error: the values are too large"),
    (["1", "--bogus"], "error: No such option: --bogus"),
    (["1", "-x"], "error: No such option: -x"),
])
def test_bad_input_is_a_one_line_usage_error(args, message):
    result = runner.invoke(app, ["layernorm", *args])
    assert result.exit_code == 2, result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_parse_list_accepts_commas_and_spaces():
    assert parse_list("1, 2,3  4", "--gamma") == [1.0, 2.0, 3.0, 4.0]


def test_tsv_sections_and_table_values():
    result = runner.invoke(app, ["layernorm", "1", "2", "3", "4", "--eps", "0", "--format", "tsv"])
    assert result.exit_code == 0 and result.stderr == ""
    stats, vector = result.stdout.split("\n\n")
    assert stats.splitlines() == ["quantity\tvalue", "mean\t2.5", "variance\t1.25", f"std\t{1.25 ** 0.5!r}",
                                  "eps\t0.0", f"denominator\t{1.25 ** 0.5!r}"]
    lines = vector.splitlines()
    assert lines[0] == "index\tx\tcentered\tnormalized\tgamma\tbeta\toutput"
    assert lines[1].split("\t")[:3] == ["0", "1.0", "-1.5"] and len(lines) == 5
    table = runner.invoke(app, ["layernorm", "100", "0.001", "-50", "25", "--format", "table"]).stdout
    for shown in ("18.750250", "54.126501", "1.5011", "-0.3464", "-1.2702", "0.1155"):
        assert shown in table



# That `layernorm` imports no torch is checked in a fresh interpreter together with `tokens` and `--help`:
# tests/test_tokens.py::test_help_tokens_and_layernorm_do_not_import_torch.
