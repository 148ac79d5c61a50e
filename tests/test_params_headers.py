"""`anatomy params` from safetensors headers and the per-config cache: the same counts as the meta
device, without importing torch.

Each header count is checked against the meta-device count of the same config (a copy of the
directory with config.json only) and against tests/models.py's formula.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import models
import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()


def _json(*args: str) -> dict:
    result = runner.invoke(app, ["params", *args, "--format", "json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2_moe", "gpt_neox", "bert"])
def test_safetensors_header_equals_meta_count(arch, tiny_model_dir, tmp_path):
    d = tiny_model_dir(arch)
    config_only = tmp_path / "config-only"
    config_only.mkdir()
    shutil.copy(d / "config.json", config_only / "config.json")
    header, meta = _json(str(d)), _json(str(config_only))
    assert header["read_from"] == "safetensors_header" and meta["read_from"] == "meta"
    assert header["total"] == meta["total"] == models.expected_params(arch)
    assert {r["key"]: r["parameters"] for r in header["rows"]} == {r["key"]: r["parameters"] for r in meta["rows"]}
    assert header["non_embedding"] == meta["non_embedding"]
    assert header["disk_bytes"] == 4 * header["total"]  # fp32 on disk, each unique tensor once
    assert all(r["dtypes"] in (["F32"], []) for r in header["rows"])


def test_sharded_checkpoint_and_stored_buffers(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir("gpt2"))
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="500KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    data = _json(str(sharded))
    shards = len(set(json.loads((sharded / "model.safetensors.index.json").read_text())["weight_map"].values()))
    assert shards > 1 and data["total"] == models.expected_params("gpt2")
    assert data["notes"][0].startswith(f"Read from the safetensors headers ({shards} files)")
    # An old-style checkpoint: causal-mask buffers and the tied head stored as tensors of their own.
    old = tmp_path / "old"
    shutil.copytree(tiny_model_dir("gpt2"), old)
    state = load_file(old / "model.safetensors")
    state["transformer.h.0.attn.bias"] = __import__("torch").ones(1, 1, 64, 64)
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    save_file(state, old / "model.safetensors", metadata={"format": "pt"})
    data = _json(str(old))
    assert data["total"] == models.expected_params("gpt2")


def test_truncated_safetensors_header_is_one_line(tiny_model_dir, tmp_path):
    d = tmp_path / "cut"
    shutil.copytree(tiny_model_dir("llama"), d)
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    result = runner.invoke(app, ["params", str(d)])
    assert result.exit_code == 1 and result.stderr.count("\n") == 1
    assert result.stderr.startswith(f"error: {weights}: ")


def _no_torch(runs: list[list[str]], env: dict) -> list[str]:
    """Each of ``runs`` (a command's arguments) invoked in turn in one fresh interpreter: each one's stdout, and
    after it whether torch or transformers had been imported by then (``NO TORCH``/``TORCH``). One interpreter
    for all: a module imported once stays in ``sys.modules``, so the last run's ``NO TORCH`` covers the runs
    before it (a fresh interpreter each cost a second)."""
    code = ("import sys; from typer.testing import CliRunner; from anatomy_cli.cli.main import app\n"
            f"for args in {runs!r}:\n"
            "    r = CliRunner().invoke(app, args)\n"
            "    assert r.exit_code == 0, r.stderr\n"
            "    print(r.stdout, end='')\n"
            "    print('TORCH' if 'torch' in sys.modules or 'transformers' in sys.modules else 'NO TORCH')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    outs = proc.stdout.splitlines(keepends=True)
    ends = [i for i, line in enumerate(outs) if line in ("TORCH\n", "NO TORCH\n")]
    assert len(ends) == len(runs), proc.stdout
    return ["".join(outs[start + 1 if start >= 0 else 0:end + 1]) for start, end in zip([-1, *ends], ends)]


def test_headers_and_cache_hits_import_no_torch(tiny_model_dir, tmp_path, monkeypatch):
    env = {**os.environ, "ANATOMY_CACHE_DIR": str(tmp_path / "cache")}
    # A config-only directory of gpt2-medium's shape is counted on the meta device once (here: it imports torch,
    # as this process has), then cached; in a fresh interpreter, the headers, the presets (the counts shipped with
    # the package) and that cache hit import neither torch nor transformers.
    cfg = tmp_path / "gpt2-medium-config"
    cfg.mkdir()
    (cfg / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"],
                                                 "n_embd": 1024, "n_layer": 24, "n_head": 16, "vocab_size": 50257,
                                                 "n_positions": 1024}))
    monkeypatch.setenv("ANATOMY_CACHE_DIR", env["ANATOMY_CACHE_DIR"])
    first = _json(str(cfg))
    assert first["read_from"] == "meta"  # counted on the meta device, then cached
    assert list((tmp_path / "cache" / "params").glob("*.pickle"))
    header, preset, again = _no_torch([["params", str(tiny_model_dir("llama")), "--format", "json"],
                                       ["params", "gpt2-medium", "--format", "json"],
                                       ["params", str(cfg), "--format", "json"]], env)
    assert again.endswith("NO TORCH\n")  # and so after the two before it
    assert json.loads(header.rsplit("\n", 2)[0])["total"] == models.expected_params("llama")
    assert json.loads(again.rsplit("\n", 2)[0]) == first
    assert json.loads(again.rsplit("\n", 2)[0])["total"] == 354_823_168
    assert json.loads(preset.rsplit("\n", 2)[0])["total"] == 354_823_168


def test_cache_is_keyed_by_config_content(tmp_path, monkeypatch):
    from transformers import LlamaConfig

    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "cfg"
    LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, vocab_size=100).save_pretrained(d)
    first = _json(str(d))
    LlamaConfig(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, vocab_size=100).save_pretrained(d)
    second = _json(str(d))
    assert second["total"] - first["total"] == 2 * 1024 + 2 * 512 + 3 * 32 * 64 + 64
    assert len(list((tmp_path / "cache" / "params").glob("*.pickle"))) == 2


def test_per_layer_rows_come_in_block_order(smollm2_gguf):
    # A GGUF file lists its tensors blk.0, blk.1, blk.10, ..., blk.19, blk.2: the rows are by block number.
    from anatomy_cli.analyses.params.headers import from_gguf

    result = from_gguf("smollm2", str(smollm2_gguf), per_layer=True)
    assert [row.name for row in result.layers] == [f"blk.{i}" for i in range(30)]


# ---- issue 61, item 8: --per-layer gives each block's storage from the header --------------------------------

def test_per_layer_storage_of_a_gguf_block_from_the_header(smollm2_gguf):
    """Block 3's types, bytes and bits per weight, and the token embedding's, against the gguf package's own
    reading of the file's tensors."""
    from gguf import GGUFReader

    reader = GGUFReader(str(smollm2_gguf))
    block = [t for t in reader.tensors if t.name.startswith("blk.3.")]
    n_bytes, n_params = sum(int(t.n_bytes) for t in block), sum(int(t.n_elements) for t in block)
    types = {t.tensor_type.name for t in block}
    data = _json(str(smollm2_gguf), "--per-layer")
    layer = data["layers"][3]
    assert layer["index"] == 3 and layer["total"] == n_params
    assert layer["disk_bytes"] == n_bytes == 2_216_448
    assert layer["bits_per_weight"] == pytest.approx(8 * n_bytes / n_params)
    assert set(layer["dtypes"]) == types == {"Q4_1", "F32"} and layer["dtypes"][0] == "Q4_1"  # most parameters first
    embed = next(t for t in reader.tensors if t.name == "token_embd.weight")
    outside = {r["key"]: r for r in data["outside_layers"]}
    assert outside["token_embedding"]["dtypes"] == [embed.tensor_type.name]
    assert outside["token_embedding"]["disk_bytes"] == int(embed.n_bytes)
    # every byte once: the blocks and the rows outside them add up to the file's tensors
    assert sum(r["disk_bytes"] for r in data["layers"] + data["outside_layers"]) == data["disk_bytes"] \
        == sum(int(t.n_bytes) for t in reader.tensors)
    tsv = runner.invoke(app, ["params", str(smollm2_gguf), "--per-layer", "--format", "tsv"]).stdout.splitlines()
    header = tsv[0].split("\t")
    row = dict(zip(header, next(line for line in tsv if line.startswith("layer_3\t")).split("\t")))
    assert (row["dtypes"], int(row["disk_bytes"])) == ("Q4_1, F32", n_bytes)


def test_per_layer_storage_of_a_safetensors_block(tiny_model_dir):
    """A tiny fp32 checkpoint: each block's tensors stored as F32 (the file's own header, read with the
    safetensors package), 4 bytes a parameter, 32 bits per weight."""
    from safetensors import safe_open

    d = tiny_model_dir("gpt2")
    with safe_open(str(d / "model.safetensors"), framework="numpy") as f:
        stored = {f.get_slice(name).get_dtype() for name in f.keys() if ".h.1." in name}
    assert stored == {"F32"}
    data = _json(str(d), "--per-layer")
    for layer in data["layers"]:
        assert layer["dtypes"] == ["F32"] and layer["disk_bytes"] == 4 * layer["total"]
        assert layer["bits_per_weight"] == 32.0
    assert all(r["disk_bytes"] == 4 * r["parameters"] for r in data["outside_layers"])


def test_a_preset_per_layer_has_no_storage():
    """Counted on the meta device, nothing is stored: the per-layer storage is empty, not invented."""
    data = _json("gpt2", "--per-layer")
    assert all(layer["dtypes"] == [] and layer["disk_bytes"] is None and layer["bits_per_weight"] is None
               for layer in data["layers"])
