"""The output layer: formats, raw numbers, markup safety, stdout/stderr split."""

from __future__ import annotations

import csv
import io
import json

import pytest

from anatomy_cli.output.render import Column
from anatomy_cli.output.render import Format
from anatomy_cli.output.render import Report
from anatomy_cli.output.render import Section
from anatomy_cli.output.render import emit
from anatomy_cli.output.render import human_bytes
from anatomy_cli.output.render import resolve_format

COLUMNS = [Column("name", "Name"), Column("count", "Count", kind="int"),
           Column("share", "Share", kind="pct", digits=1), Column("share", "", kind="bar")]
ROWS = [{"name": "[bold]emb[/bold]", "count": 38597376, "share": 0.3102},
        {"name": "tab\there", "count": 7, "share": 0.0}]
REPORT = Report(data={"rows": ROWS, "total": 38597383}, sections=[Section(COLUMNS, ROWS)],
                heading=["model: [red]x"], notes=["note one"])


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_default_format_follows_the_terminal():
    assert resolve_format(None, io.StringIO()) is Format.tsv
    assert resolve_format(None, _Tty()) is Format.table
    assert resolve_format(Format.json, _Tty()) is Format.json


def test_tsv_has_header_raw_numbers_no_bar_and_notes_on_stderr(capsys):
    out = io.StringIO()
    emit(REPORT, Format.tsv, out=out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "name\tcount\tshare"
    assert lines[1] == "[bold]emb[/bold]\t38597376\t0.3102"
    assert lines[2] == "tab\\there\t7\t0.0"
    assert "\x1b" not in out.getvalue()
    err = capsys.readouterr().err
    assert "note one" in err and "model: [red]x" in err


def test_csv_is_rfc4180():
    out = io.StringIO()
    emit(REPORT, Format.csv, out=out)
    assert out.getvalue().startswith("name,count,share\r\n")
    rows = list(csv.reader(io.StringIO(out.getvalue())))
    assert rows[1] == ["[bold]emb[/bold]", "38597376", "0.3102"]
    assert rows[2] == ["tab\there", "7", "0.0"]


def test_json_is_the_data_with_raw_numbers():
    out = io.StringIO()
    emit(REPORT, Format.json, out=out)
    doc = json.loads(out.getvalue())
    assert doc["total"] == 38597383 and doc["rows"][0]["count"] == 38597376


def test_json_turns_nan_into_null():
    out = io.StringIO()
    emit(Report(data={"x": float("nan")}, sections=[]), Format.jsonl, out=out)
    assert json.loads(out.getvalue()) == {"x": None}


def test_table_is_markup_safe_and_human(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    out = io.StringIO()
    emit(REPORT, Format.table, out=out)
    text = out.getvalue()
    assert "[bold]emb[/bold]" in text  # printed literally, not interpreted
    assert "model: [red]x" in text
    assert "38,597,376" in text and "31.0%" in text and "█" * 7 in text
    assert "note one" in text
    assert "\x1b" not in text


@pytest.mark.parametrize("n, text", [(0, "0 B"), (1536, "1.5 KiB"), (124439808 * 4, "474.7 MiB"),
                                     (46702792704 * 2, "87.0 GiB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text
