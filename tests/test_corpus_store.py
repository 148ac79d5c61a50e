"""`corpus --out DIR`: a resume never mixes two models or two sources, never trusts a damaged shard, and
every Parquet file has one explicit schema (issue 41, items 1, 4, 5, 10)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
TEXT = (ROOT / "docs" / "article.md").read_text()[:4000]
runner = CliRunner()


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def corpus(src, model, out, *extra):
    return invoke("corpus", src, "--model", model, "--ctx", 16, "--shard-windows", 2, "--max-tokens", 160,
                  "--format", "json", "--out", out, *extra)


def test_a_resume_across_changed_weights_is_refused(tiny_model_dir, tmp_path):
    """A fine-tune writing into the same directory between two runs: the second refuses to merge (item 1)."""
    from transformers import AutoModelForCausalLM

    model = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir("gpt2"), model)
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    out = tmp_path / "run"
    first = corpus(src, model, out)
    assert first.exit_code == 0, first.output
    manifest = json.loads((out / "manifest.json").read_text())
    names = {Path(f["path"]).name for f in manifest["model"]["files"]}
    assert "config.json" in names and any(n.endswith(".safetensors") for n in names)
    assert len(manifest["model"]["tokenizer"]) == 64
    # the same files touched, not changed: still the same run (the digest decides)
    for f in model.iterdir():
        os.utime(f)
    assert corpus(src, model, out).exit_code == 0
    lm = AutoModelForCausalLM.from_pretrained(model)
    with __import__("torch").no_grad():
        next(lm.parameters()).add_(0.5)
    lm.save_pretrained(model)
    again = corpus(src, model, out)
    assert again.exit_code == 2, again.output
    assert "holds another run (the model's files changed: model.safetensors)" in again.stderr
    assert corpus(src, model, out, "--overwrite").exit_code == 0


def test_a_resume_across_a_changed_tokenizer_is_refused(tiny_model_dir, tmp_path):
    model = tmp_path / "ckpt"
    shutil.copytree(tiny_model_dir("llama"), model)
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    out = tmp_path / "run"
    assert corpus(src, model, out).exit_code == 0
    tok = json.loads((model / "tokenizer.json").read_text())
    tok["normalizer"] = {"type": "Lowercase"}
    (model / "tokenizer.json").write_text(json.dumps(tok))
    again = corpus(src, model, out)
    assert again.exit_code == 2 and "the model's files changed: tokenizer.json" in again.stderr


def test_a_path_spelled_differently_is_the_same_run(tiny_model_dir, tmp_path, cached_load, monkeypatch):
    """docs/ and its absolute path, a model directory through a symlink: one run (item 10)."""
    model = tiny_model_dir("gpt2")
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.md").write_text(TEXT)
    (tmp_path / "m").symlink_to(model)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    first = corpus("d/", model, out)
    assert first.exit_code == 0, first.output
    again = corpus(tmp_path / "d", tmp_path / "m", out)
    assert again.exit_code == 0, again.output
    assert "resumed: 5 of 5 shards" in again.stderr
    assert json.loads(again.stdout)["layers"] == json.loads(first.stdout)["layers"]
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "a.md").write_text(TEXT)  # the same bytes elsewhere: another source
    other = corpus(tmp_path / "e", model, out)
    assert other.exit_code == 2 and "the source changed: resolved" in other.stderr


def test_summary_columns_are_float64_never_null_typed(tiny_model_dir, tmp_path, cached_load):
    """One window and --no-lens: the columns not measured are float64 full of nulls (item 4)."""
    model = tiny_model_dir("gpt2")
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    res = invoke("corpus", src, "--model", model, "--ctx", 16, "--max-tokens", 16, "--no-lens", "--heads",
                 "--out", tmp_path / "a", "--format", "json")
    assert res.exit_code == 0, res.output
    for name, key in (("summary.parquet", "kl_nats"), ("heads.parquet", "entropy_nats")):
        table = pq.read_table(tmp_path / "a" / name)
        assert pa.types.is_null(table.schema.field(f"{key}_se").type) is False
        for field in table.schema:
            assert field.type in (pa.int64(), pa.float64()) or (name, field.name) == ("summary.parquet", "layer")
        assert name == "heads.parquet" or table.schema.field("layer").type == pa.string()
        assert table.schema.field(f"{key}_se").type == pa.float64()
    layers = pq.read_table(tmp_path / "a" / "summary.parquet")
    assert layers.schema.field("kl_nats").type == pa.float64() and layers.column("kl_nats").null_count == 3
    # another run's summary reads with this one as one dataset
    assert invoke("corpus", src, "--model", model, "--ctx", 16, "--max-tokens", 64, "--out", tmp_path / "b"
                  ).exit_code == 0
    both = pa.concat_tables([pq.read_table(tmp_path / d / "summary.parquet") for d in "ab"])
    assert both.num_rows == 6 and both.schema.field("kl_nats").type == pa.float64()


def test_a_damaged_shard_is_computed_again(tiny_model_dir, tmp_path, cached_load):
    """Truncated, emptied, or rewritten with other figures: recomputed, said so, same result (item 5)."""
    model = tiny_model_dir("gpt2")
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    out = tmp_path / "run"
    first = corpus(src, model, out)
    assert first.exit_code == 0, first.output
    shard = out / "shards"
    data = (shard / "shard-00001.parquet").read_bytes()
    (shard / "shard-00001.parquet").write_bytes(data[: len(data) // 2])
    (shard / "shard-00003.parquet").write_bytes(b"")
    shutil.copy(shard / "shard-00000.parquet", shard / "shard-00004.parquet")  # parses, wrong figures
    again = corpus(src, model, out)
    assert again.exit_code == 0, again.output
    for i in (1, 3, 4):
        assert f"shard {i}: damaged (its checksum is not the manifest's); computed again" in again.stderr
    assert "resumed: 2 of 5 shards" in again.stderr
    assert json.loads(again.stdout)["layers"] == json.loads(first.stdout)["layers"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert all(len(s["sha256"]) == 64 and s["rows"] > 0 for s in manifest["shards"])
    assert corpus(src, model, out).stderr.count("computed again") == 0


def test_a_run_directory_of_the_old_numbering_resumes_with_the_new_labels(tiny_model_dir, tmp_path, cached_load):
    """Issue 47: summary.parquet once held `layer` int64 0..L (0 the embedding). Shards hold partial sums by row
    index, which did not change: a directory written then resumes, reads every shard, and its summary is written
    again with `row` (int64) and the string `layer` (embed, 0..L-1), never the old numbers under the new name."""
    model = tiny_model_dir("gpt2")
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    first = corpus(src, model, tmp_path / "a")
    assert first.exit_code == 0, first.output
    path = tmp_path / "a" / "summary.parquet"
    old = pq.read_table(path).drop(["layer"]).rename_columns(["layer", *pq.read_table(path).column_names[2:]])
    pq.write_table(old, path)  # the old form: layer = row, int64
    assert pq.read_table(path).column("layer").to_pylist() == [0, 1, 2]
    again = corpus(src, model, tmp_path / "a")
    assert again.exit_code == 0, again.output
    assert "resumed: 5 of 5 shards" in again.stderr
    table = pq.read_table(path)
    assert table.column("row").to_pylist() == [0, 1, 2] and table.column("layer").to_pylist() == ["embed", "0", "1"]
    assert json.loads(again.stdout)["layers"] == json.loads(first.stdout)["layers"]
