"""Tables at 80 columns (issue 61, item 8): every command's terminal table fits the terminal.

Each command line of the golden record (tests/test_golden_outputs.py: every command, on the tiny models) runs
again with ``--format table`` under COLUMNS=80, through the real renderer (the CLI's rich console, whose width
COLUMNS sets), and the output is checked against the report the command handed to the renderer:

* no line is wider than 80 cells;
* no word of the data is split across lines: every word of every header and cell of a shown column appears
  whole in the output (rich's fold would print ``intermediat`` / ``e``), or abbreviated in its middle where one
  word alone is too long (``/tmp/pyt…seed1``);
* a column left out is named in the one stderr note, which says how to see every column.

Piped output is untouched (tsv/json: tests/test_golden_outputs.py compares the JSON).
"""

from __future__ import annotations

from collections import Counter

import pytest
from rich.cells import cell_len
from test_golden_outputs import CASE
from test_golden_outputs import CASES
from test_golden_outputs import runner
from test_golden_outputs import runs  # noqa: F401  (the fixture: the tiny models, input files, environment)

from anatomy_cli.cli.main import app
from anatomy_cli.output import render

WIDTH = 80
DROPPED = "not shown at"  # the note's words (anatomy_cli/output/tables.py: drop_note)


def _table_argv(argv: tuple[str, ...]) -> list[str]:
    argv = list(argv)
    i = argv.index("--format")
    argv[i + 1] = "table"
    return argv


WRITES = ("--out", "--json")  # the options naming files a command writes: written elsewhere than the record's


def run_table(runs, name: str, monkeypatch, tmp_path) -> tuple[str, str, list]:  # noqa: F811
    """``name``'s command line with ``--format table`` at COLUMNS=80: (stdout, stderr, the reports rendered). The
    files it writes go under ``tmp_path``, so that the record's cases still find theirs."""
    case = CASE[name]
    for need in case.needs:
        runs.run(need)
    reports: list = []
    real = render._emit_table

    def spy(report, out):
        reports.append(report)
        return real(report, out)

    monkeypatch.setattr(render, "_emit_table", spy)
    argv = [a.format(**runs.paths) for a in _table_argv(case.argv)]
    argv = [a.replace(str(runs.paths["tmp"]), str(tmp_path)) if i and argv[i - 1] in WRITES else a
            for i, a in enumerate(argv)]
    result = runner.invoke(app, argv, env={**runs.env, "COLUMNS": str(WIDTH)}, input=case.input)
    assert result.exit_code == 0, f"{name}: anatomy {' '.join(argv)}\n{result.output}"
    return result.stdout, result.stderr, reports


def check_fits(stdout: str, stderr: str, reports: list, width: int = WIDTH) -> list[str]:
    """Assert the table output fits ``width`` and splits no word; the titles of the columns left out."""
    wide = [line for line in stdout.splitlines() if cell_len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width}:\n" + "\n".join(wide[:5])
    # the words of the tables: the output's, less those of the headings, section titles and notes around them
    around = Counter(w for report in reports for text in (*report.heading, *report.notes,
                                                          *(s.title or "" for s in report.sections))
                     for w in text.split())
    tokens = set(Counter(stdout.split()) - around)
    shortened = [t.split("…") for t in tokens if t.count("…") == 1]

    def whole(word: str) -> bool:  # as is, or abbreviated in its middle (a path: /tmp/pyt…seed1)
        return word in tokens or any(h and word.startswith(h) and word.endswith(t) and len(word) > len(h) + len(t)
                                     for h, t in shortened)

    notes = [line for line in stderr.splitlines() if DROPPED in line]
    dropped, split = [], []
    for report in reports:
        for section in report.sections:
            for column in section.columns:
                if column.kind in render.BAR_KINDS:
                    continue
                words = [*column.title.split(),
                         *(w for row in section.rows for w in render._human(row.get(column.key), column).split())]
                missing = [w for w in words if not whole(w)]
                if not missing:
                    continue
                if any(column.title in note for note in notes):
                    dropped.append(column.title)
                else:
                    split.append(f"column {column.title!r}: {missing[:5]}")
    assert not split, "words not whole in the output, in columns no note says were left out:\n" + "\n".join(split)
    assert len(notes) <= 1, notes
    return dropped


NAMES = [c.name for c in CASES]


@pytest.mark.parametrize("name", NAMES)
def test_every_table_fits_80_columns_without_splitting_words(runs, name, monkeypatch, tmp_path):  # noqa: F811
    stdout, stderr, reports = run_table(runs, name, monkeypatch, tmp_path)
    assert reports, f"{name}: no table rendered"
    check_fits(stdout, stderr, reports)


def test_params_per_layer_is_one_table_with_each_blocks_storage(smollm2_gguf, monkeypatch):
    """`params smollm2 --per-layer` at 80 columns: one table, a row per block (not 30 one-row blocks), each with its
    types, bytes on disk and bits per weight, block 3's summed here from the gguf package's tensors."""
    from gguf import GGUFReader

    from anatomy_cli.units import human_bytes

    reports: list = []
    real = render._emit_table
    monkeypatch.setattr(render, "_emit_table", lambda report, out: (reports.append(report), real(report, out))[1])
    result = runner.invoke(app, ["params", str(smollm2_gguf), "--per-layer", "--format", "table"],
                           env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    check_fits(result.stdout, result.stderr, reports)
    lines = result.stdout.splitlines()
    assert sum(line.split()[:1] == ["Component"] for line in lines) == 1  # one header: one table
    block = [t for t in GGUFReader(str(smollm2_gguf)).tensors if t.name.startswith("blk.3.")]
    n_bytes, n_params = sum(int(t.n_bytes) for t in block), sum(int(t.n_elements) for t in block)
    row = next(line for line in lines if line.startswith("layer 3 "))
    assert "Q4_1, F32" in row and human_bytes(n_bytes) in row and f"{8 * n_bytes / n_params:.2f}" in row
    assert [line.split()[1] for line in lines if line.startswith("layer ")] == [str(i) for i in range(30)]


# ---- the rule itself, on hand-made tables ----------------------------------------------------------------------

def _render(section, width: int) -> tuple[list[str], list[str]]:
    """A section through the renderer at ``width`` columns: (its lines, the columns it left out)."""
    import io

    from rich.console import Console

    from anatomy_cli.output import tables

    out = io.StringIO()
    console = Console(file=out, width=width, markup=False, highlight=False, emoji=False)
    dropped = tables.render_section(console, section, render._human)
    return out.getvalue().splitlines(), dropped


def test_text_wraps_at_spaces_and_a_long_word_is_abbreviated_in_its_middle():
    from anatomy_cli.output.render import Column
    from anatomy_cli.output.render import Section

    columns = [Column("name", "intermediate name"), Column("n", "count", "int"), Column("why", "note")]
    rows = [{"name": "responsibility and accountability", "n": 1_234_567,
             "why": "/a/very/long/path/to/some/checkpoint/directory/model-seed1 is here"}] * 2
    lines, dropped = _render(Section(columns, rows), 40)
    text = "\n".join(lines)
    assert all(cell_len(line) <= 40 for line in lines) and not dropped
    for word in ("intermediate", "responsibility", "accountability", "1,234,567", "is", "here"):
        assert word in text.split()
    shortened = [w for w in text.split() if "…" in w]  # the path: its start and its end kept
    assert shortened and all(w.startswith("/a/v") and w.endswith("seed1") for w in shortened)


def test_columns_go_by_priority_optional_first_the_first_never():
    from anatomy_cli.output.render import Column
    from anatomy_cli.output.render import Section

    columns = [Column("a", "first", "int"), Column("b", "bee", "int", priority=1), Column("c", "sea", "int"),
               Column("d", "dee", "int"), Column("e", "±", "int", priority=-1), Column("f", "±", "int")]
    rows = [{k: 10 ** 9 for k in "abcdef"}] * 3  # 13 cells each: 6 columns need 83
    assert _render(Section(columns, rows), 83)[1] == []
    assert _render(Section(columns, rows), 82)[1] == ["± (e)"]  # optional: the first to go, named by its key
    assert _render(Section(columns, rows), 55)[1] == ["± (e)", "± (f)"]
    assert _render(Section(columns, rows), 54)[1] == ["dee", "± (e)", "± (f)"]  # then the rightmost of priority 0
    assert _render(Section(columns, rows), 40)[1] == ["sea", "dee", "± (e)", "± (f)"]  # named in table order
    lines, dropped = _render(Section(columns, rows), 20)
    assert dropped == ["bee", "sea", "dee", "± (e)", "± (f)"] and lines[-1].split() == ["1,000,000,000"]


def test_a_one_row_table_too_wide_is_column_value_lines():
    from anatomy_cli.output.render import Column
    from anatomy_cli.output.render import Section

    columns = [Column(f"n{i}", kind="int") for i in range(6)]
    row = {f"n{i}": 131_072 * (i + 1) for i in range(6)}
    lines, dropped = _render(Section(columns, [row]), 30)
    assert [line.split() for line in lines] == [[f"n{i}", f"{v:,}"] for i, v in enumerate(row.values())]
    assert not dropped


def test_the_note_is_one_stderr_line_and_piped_output_never_changes(monkeypatch, capsys):
    import io

    from anatomy_cli.output.render import Column
    from anatomy_cli.output.render import Format
    from anatomy_cli.output.render import Report
    from anatomy_cli.output.render import Section
    from anatomy_cli.output.render import emit

    columns = [Column("layer", kind="int"), *(Column(f"m{i}", f"measure {i}", "float") for i in range(12))]
    rows = [{"layer": n, **{f"m{i}": 1.5 * i for i in range(12)}} for n in range(3)]
    report = Report(data={}, sections=[Section(columns, rows), Section(columns, rows)])
    piped = []
    for width in ("40", "300"):
        monkeypatch.setenv("COLUMNS", width)
        for fmt in (Format.tsv, Format.csv):
            out = io.StringIO()
            emit(report, fmt, out=out)
            piped.append(out.getvalue())
    assert piped[:2] == piped[2:] and "m11" in piped[0]
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("COLUMNS", "40")
    out = io.StringIO()
    emit(report, Format.table, out=out)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("note: not shown at 40 columns: measure 4, measure 5,")
    assert "--format tsv or json" in err[0] and err[0].count("measure 11") == 1  # both tables: named once
    assert all(cell_len(line) <= 40 for line in out.getvalue().splitlines())
