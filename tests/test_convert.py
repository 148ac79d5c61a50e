"""`anatomy convert FILE.gguf --to DIR` (issue 42, item 6): the directory loads with --model and gives the
GGUF file's logits and token ids; bad targets are one-line usage errors."""

from __future__ import annotations

import pytest
import torch
from test_gguf import write_tiny_gguf
from torch.testing import assert_close
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app

runner = CliRunner()
PROMPT = "The capital of Germany is"


@pytest.fixture(scope="module")
def tiny_gguf_file(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


def _logits(lm, ids):
    with torch.no_grad():
        return lm.model(input_ids=torch.tensor([ids])).logits[0]


def test_the_directory_gives_the_gguf_files_logits_and_ids(tiny_gguf_file, tmp_path):
    out = tmp_path / "converted"
    result = runner.invoke(app, ["convert", str(tiny_gguf_file), "--to", str(out)])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == str(out)
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert "quantization_config" not in (out / "config.json").read_text()
    gguf_lm = engine.load(str(tiny_gguf_file), device="cpu")
    dir_lm = engine.load(str(out), device="cpu")
    ids = gguf_lm.tokenizer.hf(PROMPT)["input_ids"]
    assert dir_lm.tokenizer.hf(PROMPT)["input_ids"] == ids
    assert dir_lm.tokenizer.hf.decode(ids) == gguf_lm.tokenizer.hf.decode(ids) == PROMPT
    assert_close(_logits(dir_lm, ids), _logits(gguf_lm, ids), rtol=0, atol=0)


def test_dtype_is_respected(tiny_gguf_file, tmp_path):
    from safetensors import safe_open

    out = tmp_path / "bf16"
    result = runner.invoke(app, ["convert", str(tiny_gguf_file), "--to", str(out), "--dtype", "bf16"])
    assert result.exit_code == 0, result.stderr
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}


def test_a_non_empty_directory_needs_overwrite(tiny_gguf_file, tmp_path):
    (tmp_path / "keep.txt").write_text("x")
    result = runner.invoke(app, ["convert", str(tiny_gguf_file), "--to", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: --to {tmp_path} is not empty: choose a new "
                                                  "directory, or add --overwrite"]
    result = runner.invoke(app, ["convert", str(tiny_gguf_file), "--to", str(tmp_path), "--overwrite"])
    assert result.exit_code == 0, result.stderr
    assert (tmp_path / "keep.txt").exists() and (tmp_path / "model.safetensors").exists()


def test_a_non_gguf_model_is_a_usage_error(tmp_path, tiny_model_dir):
    result = runner.invoke(app, ["convert", str(tiny_model_dir("llama")), "--to", str(tmp_path / "x")])
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "is not a GGUF file" in result.stderr
    assert not (tmp_path / "x").exists()
