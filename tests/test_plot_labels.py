"""Pictures name tokens exactly as the tables do (issue 32, item 5): one display function for tokens."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.output import plots
from anatomy_cli.output.plots._text import token_label

runner = CliRunner()


def test_token_label_keeps_the_tables_spelling():
    assert token_label("<e6 88>") == "<e6 88>"
    assert token_label("·much") == "·much" and token_label("↵") == "↵"
    assert token_label("a b") == "a b"  # a piece is displayed already: not made visible twice


@pytest.mark.usefixtures("cached_load")
def test_lens_plot_labels_byte_pieces_like_the_table(tmp_path, tiny_model_dir, monkeypatch):
    saved = []
    real = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path, index=None: (saved.append(fig), real(fig, path, index))[1])
    result = runner.invoke(app, ["lens", "我爱你", "--model", str(tiny_model_dir("gpt2")), "--format", "json",
                                 "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 0, result.stderr
    tokens = json.loads(result.stdout)["tokens"]
    assert "<e6 88>" in tokens  # GPT-2 splits 我 (e6 88 91) into byte pieces
    labels = [t.get_text() for t in saved[0].axes[0].get_xticklabels()]
    assert labels == [token_label(t) for t in tokens]
    assert "<e6 88>" in labels and not any("·" in label for label in labels)
