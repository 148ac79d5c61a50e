"""Pictures (`--plot`): the shared rules, on synthetic results (no model).

Path checks, numbered batch files, file types from their headers, byte-identical SVG,
token labels with the tables' escapes, no empty boxes for CJK, and a 30-layer x 20-position
lens grid whose labels do not overlap. The per-command pictures are in test_plots_commands.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.output import plots

HEADERS = {".png": b"\x89PNG\r\n\x1a\n", ".pdf": b"%PDF-", ".svg": b"<?xml"}


def file_type(path: Path) -> str:
    """The format a file's first bytes say it is: png, pdf or svg (else '?')."""
    head = path.read_bytes()[:300]
    for suffix, magic in HEADERS.items():
        if head.startswith(magic) and (suffix != ".svg" or b"<svg" in path.read_bytes()[:2000]):
            return suffix
    return "?"


# ---------------------------------------------------------------- checks before anything loads

@pytest.mark.parametrize("name", ["out.jpg", "out", "out.png.txt", "out.eps"])
def test_an_unknown_suffix_is_a_usage_error(tmp_path, name):
    with pytest.raises(UsageError, match=r"\.png, \.svg, \.pdf or \.html"):
        plots.check_path(tmp_path / name)


def test_suffix_case_does_not_matter(tmp_path):
    assert plots.check_path(tmp_path / "A.PNG") == tmp_path / "A.PNG"
    assert plots.check_path(None) is None


def test_a_missing_directory_is_a_one_line_error(tmp_path):
    with pytest.raises(AnatomyError, match="does not exist") as info:
        plots.check_path(tmp_path / "nope" / "x.png")
    assert not isinstance(info.value, UsageError) and "\n" not in str(info.value)


def test_a_file_as_directory_and_a_directory_as_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(AnatomyError, match="is not a directory"):
        plots.check_path(tmp_path / "f" / "x.png")
    (tmp_path / "d.png").mkdir()
    with pytest.raises(UsageError, match="is a directory"):
        plots.check_path(tmp_path / "d.png")


def test_an_unwritable_directory(tmp_path):
    # /proc refuses new files even to root, for whom a chmod'ed directory would still be writable.
    target = Path("/proc/anatomy-test.png") if Path("/proc").is_dir() else None
    if target is None:
        pytest.skip("no /proc")
    with pytest.raises(AnatomyError, match="no permission"):
        plots.check_path(target)
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(AnatomyError, match="no permission"):
            plots.check_path(locked / "x.svg")


def test_checking_leaves_nothing_behind(tmp_path):
    plots.check_path(tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_numbered_paths_for_a_batch():
    assert plots.numbered(Path("d/lens.png"), None) == Path("d/lens.png")
    assert plots.numbered(Path("d/lens.png"), 2) == Path("d/lens-2.png")
    assert plots.numbered(Path("lens.v1.svg"), 10) == Path("lens.v1-10.svg")


def test_the_package_does_not_import_matplotlib():
    code = "import sys, anatomy_cli.output.plots, anatomy_cli.cli.main; print('matplotlib' in sys.modules)"  # every command
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------- drawing rules

def _describe(i: int) -> tuple[str, str]:
    names = ["·the", "·Berlin", "↵", ",", "·capital", "·of", "$", "·中文", "·extraordinarily"]
    name = names[i % len(names)]
    return name, name


def _lens_grid(n_layers: int, n_pos: int):
    from anatomy_cli.analyses.lens import lens_grid

    g = torch.Generator().manual_seed(0)
    resid = torch.randn(n_layers + 1, n_pos, 16, generator=g)
    w = torch.randn(16, 40, generator=g)
    return lens_grid(resid, lambda h: h @ w, describe=_describe, target_id=1)


def _lens_figure(n_layers=4, n_pos=5, untrained=False, stat="prob"):
    from anatomy_cli.output.plots import lens

    grid = _lens_grid(n_layers, n_pos)
    tokens = [_describe(i + 2)[0] for i in range(n_pos)]
    cap = plots.Caption("lens", "tiny-model", "The capital of Germany is\nthe city of", untrained=untrained)
    return grid, lens.figure(grid, stat, tokens, cap)


def test_lens_image_is_the_grid_statistic():
    grid, fig = _lens_figure()
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (5, 5)
    assert torch.allclose(torch.as_tensor(image.filled(float("nan"))), grid.stat("prob").double(), atol=1e-12)
    # each cell names its top token, as the table does
    from anatomy_cli.output.plots._base import drawable

    cell_texts = {(round(t.get_position()[0]), round(t.get_position()[1])): t.get_text() for t in fig.axes[0].texts}
    assert len(cell_texts) == 25
    for (c, r), text in cell_texts.items():  # cut with "…" only where the token is longer than the cell
        full = drawable(grid.top_tokens[r][c][0])
        assert text == full or (text.endswith("…") and full.startswith(text[:-1]))


def test_saved_files_have_the_format_of_their_suffix(tmp_path, capsys):
    _, fig = _lens_figure()
    for suffix in (".png", ".svg", ".pdf"):
        written = plots.save(fig, tmp_path / f"lens{suffix}", index=3)
        assert written == tmp_path / f"lens-3{suffix}"
        assert file_type(written) == suffix
    wrote = [f"wrote {tmp_path / f'lens-3{s}'}" for s in (".png", ".svg", ".pdf")]
    assert capsys.readouterr().err.splitlines() == wrote


def test_the_same_picture_gives_the_same_svg_bytes(tmp_path):
    for i in (1, 2):
        _, fig = _lens_figure(untrained=True)
        plots.save(fig, tmp_path / f"a{i}.svg")
        plots.save(fig, tmp_path / f"a{i}.pdf")
    assert (tmp_path / "a1.svg").read_bytes() == (tmp_path / "a2.svg").read_bytes()
    assert (tmp_path / "a1.pdf").read_bytes() == (tmp_path / "a2.pdf").read_bytes()
    assert b"<dc:date>" not in (tmp_path / "a1.svg").read_bytes()


def test_title_prompt_and_untrained_label():
    _, fig = _lens_figure(untrained=True)
    title = fig._suptitle.get_text()
    assert title.startswith("lens · tiny-model\n'The capital of Germany is↵the city of'")
    assert "untrained (random weights)" in [t.get_text() for t in fig.texts]
    _, fig = _lens_figure(untrained=False)
    assert "untrained (random weights)" not in [t.get_text() for t in fig.texts]


def test_token_labels_use_the_table_escapes():
    from anatomy_cli.output.plots._base import drawable
    from anatomy_cli.output.plots._base import shorten
    from anatomy_cli.output.plots._base import token_label

    assert token_label("·much") == "·much"
    assert token_label("·much↵") == "·much↵"  # the piece as the tables show it, not made visible twice
    assert token_label("·extraordinarily") == "·extrao…"
    assert token_label("$x$") == r"\$x\$"  # a dollar sign, not mathtext
    assert shorten("a" * 100, 20) == "a" * 9 + " … " + "a" * 8
    assert shorten("one\ntwo") == "one↵two"
    assert drawable("a\x07b") == "a<U+0007>b"


def test_cjk_never_becomes_empty_boxes(tmp_path):
    """Either a CJK font is installed and draws the characters, or they are written as <U+4E2D>."""
    from anatomy_cli.output.plots._base import drawable
    from anatomy_cli.output.plots._base import new_figure
    from anatomy_cli.output.plots._text import fonts

    _, covered = fonts()
    label = drawable("·中文")
    if ord("中") in covered:
        assert label == "·中文"
    else:
        assert label == "·<U+4E2D><U+6587>"
    fig = new_figure(6, 3)
    ax = fig.subplots()
    ax.set_title(label)
    ax.set_xticks([0], [drawable("日本語 한국어")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib warns "Glyph ... missing from font(s)" for a box
        plots.save(fig, tmp_path / "cjk.png")


def _overlaps(boxes) -> list[tuple[int, int]]:
    """Pairs of boxes that overlap by more than half a pixel."""
    bad = []
    ordered = sorted(enumerate(boxes), key=lambda b: b[1].x0)
    for n, (i, a) in enumerate(ordered):
        for j, b in ordered[n + 1:]:
            if b.x0 >= a.x1 - 0.5:
                break
            if min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5 and min(a.x1, b.x1) - max(a.x0, b.x0) > 0.5:
                bad.append((i, j))
    return bad


@pytest.mark.parametrize("n_layers, n_pos", [(30, 20), (48, 60)])
def test_a_big_grid_has_no_overlapping_labels(n_layers, n_pos):
    _, fig = _lens_figure(n_layers=n_layers, n_pos=n_pos)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
        shown = [t.get_window_extent(renderer) for t in labels if t.get_visible() and t.get_text()]
        assert len(shown) >= min(10, len(labels)), "labels thinned away entirely"
        assert _overlaps(shown) == []
    cells = [t.get_window_extent(renderer) for t in ax.texts]
    assert _overlaps(cells) == []
    if n_pos == 20:
        assert len(cells) == (n_layers + 1) * n_pos  # 30 x 20 still names every cell
        # every layer and every position keeps its label at this size
        assert len([t for t in ax.get_yticklabels() if t.get_text()]) >= (n_layers + 1) // 2
        assert len([t for t in ax.get_xticklabels() if t.get_text()]) == n_pos
    # the last block is always labelled (rows: embed, 0..L-1)
    assert ax.get_yticklabels()[-1].get_text() == str(n_layers - 1)
