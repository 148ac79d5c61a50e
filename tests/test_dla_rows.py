"""`dla` rows as a reader sees them: signed bars that keep their sign without colour, `--top N` with the
rest summed into one `other` row (the identity still holds), and `--sort` (issue 32, item 1)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anatomy_cli.analyses.dla import Attribution
from anatomy_cli.analyses.dla import Row
from anatomy_cli.cli.main import app
from anatomy_cli.output.render import signed_bar

runner = CliRunner()


def _attribution(values):
    rows = tuple(Row(f"c{i}", i, None, v) for i, v in enumerate(values))
    return Attribution(rows=rows, total=sum(values), logit=sum(values), norm_scale=1.0, centred=False)


def test_signed_bar_puts_negative_left_and_positive_right_of_the_centre():
    neg, pos, zero = signed_bar(-1.0, 6), signed_bar(0.5, 6), signed_bar(0.0, 6)
    assert neg == "██████│      " and pos == "      │███   " and zero == "      │      "
    assert len({len(neg), len(pos), len(zero)}) == 1
    assert signed_bar(-0.25, 6) == "    ▐█│      "  # 1.5 cells: a half block on the outer end


def test_select_top_sums_the_rest_into_other_and_keeps_the_identity():
    values = [0.5, -3.0, 0.25, 2.0, -0.125, 1.0]
    full = _attribution(values)
    top = full.select(3)
    assert [r.component for r in top.rows] == ["c1", "c3", "c5", "other"]  # model order, then other
    assert top.rows[-1].contribution == pytest.approx(0.5 + 0.25 - 0.125)
    assert sum(r.contribution for r in top.rows) == pytest.approx(sum(values))
    assert top.other_rows == 3 and top.to_dict()["other_rows"] == 3
    assert [r.component for r in full.select(3, "abs").rows] == ["c1", "c3", "c5", "other"]
    assert [r.component for r in full.select(None, "value").rows] == ["c3", "c5", "c0", "c2", "c4", "c1"]
    assert [r.component for r in full.select(2, "value").rows] == ["c3", "c1", "other"]
    assert full.select(6).other_rows == 0 and full.select(99).rows == full.rows


@pytest.mark.usefixtures("cached_load")
def test_dla_table_without_colour_shows_the_sign_in_the_bar(tiny_model_dir, monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    args = ["dla", "Thank you very", "--model", str(tiny_model_dir("gpt2")), "--device", "cpu",
            "--target", " much", "--foil", " Paris"]
    data = json.loads(runner.invoke(app, [*args, "--format", "json"]).stdout)
    table = runner.invoke(app, [*args, "--format", "table"])
    assert table.exit_code == 0, table.stderr
    lines = {line.split()[0]: line for line in table.stdout.splitlines() if line.strip()}
    for row in data["rows"]:
        line = lines[row["component"]]
        left, _, right = line.rpartition("│")
        if row["contribution"] < 0:
            assert "█" in left.rsplit(f"{row['contribution']:.4f}", 1)[1] and "█" not in right, line
        elif row["contribution"] > 0:
            assert "█" in right or "▌" in right, line


@pytest.mark.usefixtures("cached_load")
def test_dla_top_and_sort_on_the_command_line(tiny_model_dir):
    args = ["dla", "Thank you very", "--model", str(tiny_model_dir("gpt2")), "--device", "cpu",
            "--target", " much", "--by", "head", "--format", "json"]
    full = json.loads(runner.invoke(app, args).stdout)
    result = runner.invoke(app, [*args, "--top", "4", "--sort", "abs"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    rows = data["rows"]
    assert len(rows) == 5 and rows[-1]["component"] == "other"
    assert data["other_rows"] == len(full["rows"]) - 4
    biggest = sorted(full["rows"], key=lambda r: -abs(r["contribution"]))[:4]
    assert [r["component"] for r in rows[:4]] == [r["component"] for r in biggest]
    assert sum(r["contribution"] for r in rows) == pytest.approx(full["total"], rel=1e-9)
    tsv = runner.invoke(app, [*args[:-2], "--top", "2", "--format", "tsv"])
    assert tsv.stdout.splitlines()[-1].startswith("other\t")
    assert runner.invoke(app, [*args, "--top", "0"]).exit_code == 2
