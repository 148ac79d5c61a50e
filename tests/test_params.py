"""`anatomy params`: exact published counts in every output format, options and errors.

Everything is counted on the meta device from presets or config.json files
written by the tests; nothing touches the network (conftest sets HF_HUB_OFFLINE).
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()

GPT2_ROWS = {  # key: (label, parameters, share as printed with one decimal)
    "token_embedding": ("Token Embedding", 38_597_376, "31.0%"),
    "position_embedding": ("Position Embedding", 786_432, "0.6%"),
    "attention": ("Attention (12 layers)", 28_348_416, "22.8%"),
    "ffn": ("FFN (12 layers)", 56_669_184, "45.5%"),
    "norm_other": ("LayerNorm + other", 38_400, "0.0%"),
}
GPT2_TOTAL = 124_439_808


def run(*args: str, env: dict | None = None):
    result = runner.invoke(app, ["params", *args], env=env)
    return result


def run_json(*args: str) -> dict:
    result = run(*args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def gpt2_json() -> dict:
    return run_json()  # MODEL defaults to gpt2


# --- the article's GPT-2 table, in every format ---------------------------------------------


def test_gpt2_json_exact(gpt2_json):
    data = gpt2_json
    assert data["model"] == "gpt2" and data["source"] == "preset" and data["architecture"] == "GPT2LMHeadModel"
    rows = {r["key"]: r for r in data["rows"]}
    assert list(rows) == list(GPT2_ROWS)  # no LM head row: it is tied
    for key, (label, n, pct) in GPT2_ROWS.items():
        assert rows[key]["label"] == label
        assert rows[key]["parameters"] == n
        assert f"{100 * rows[key]['share']:.1f}%" == pct
    assert data["total"] == GPT2_TOTAL
    assert sum(r["parameters"] for r in data["rows"]) == GPT2_TOTAL
    assert data["tied"] == [{"name": "lm_head.weight", "shares": "transformer.wte.weight"}]
    assert data["non_embedding"] == GPT2_TOTAL - 38_597_376 - 786_432 == 85_056_000
    assert data["non_embedding_excludes"] == ["transformer.wte.weight", "transformer.wpe.weight"]
    assert data["active"] is None and data["moe"] is None and data["unrecognised"] == []
    assert any("shares the token embedding" in n for n in data["notes"])
    assert any("Non-embedding parameters: 85,056,000" in n and "transformer.wpe.weight" in n for n in data["notes"])


def test_gpt2_table_exact():
    result = run("--format", "table")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for label, n, pct in GPT2_ROWS.values():
        line = next(line for line in out.splitlines() if line.strip().startswith(label))
        assert f"{n:,}" in line and pct in line, line
    total = next(line for line in out.splitlines() if line.strip().startswith("Total"))
    assert "124,439,808" in total and "100.0%" in total and "█" in total
    assert not any(line.strip().startswith("LM head") for line in out.splitlines())  # tied: no row
    assert "The LM head shares the token embedding" in out
    assert out.splitlines()[0].startswith("gpt2 · GPT2LMHeadModel (model_type gpt2) · built-in preset")


@pytest.mark.parametrize("fmt", ["csv", "tsv"])
def test_gpt2_delimited_exact(fmt):
    result = run("gpt2", "--format", fmt)
    assert result.exit_code == 0, result.stderr
    if fmt == "csv":
        raw = result.stdout_bytes.decode()
        assert raw.count("\r\n") == len(GPT2_ROWS) + 2  # RFC 4180: CRLF after the header and every row
        rows = list(csv.DictReader(io.StringIO(raw, newline="")))
    else:
        rows = list(csv.DictReader(io.StringIO(result.stdout), delimiter="\t", quoting=csv.QUOTE_NONE))
    assert [r["key"] for r in rows] == [*GPT2_ROWS, "total"]
    for r in rows[:-1]:
        label, n, pct = GPT2_ROWS[r["key"]]
        assert r["component"] == label and int(r["parameters"]) == n
        assert f"{100 * float(r['share']):.1f}%" == pct
    assert int(rows[-1]["parameters"]) == GPT2_TOTAL and float(rows[-1]["share"]) == 1.0
    assert "█" not in result.stdout and "\x1b" not in result.stdout


def test_tsv_first_line_is_the_header():
    result = run("--format", "tsv")
    assert result.stdout.splitlines()[0] == "key\tcomponent\tparameters\tshare"


def test_piped_default_is_tsv_and_head_is_quiet():
    proc = subprocess.run(f"{sys.executable} -m anatomy_cli params | head -1", shell=True, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout == "key\tcomponent\tparameters\tshare\n"
    assert proc.stderr == ""


@pytest.mark.parametrize("fmt", ["tsv", "csv"])
def test_machine_formats_keep_stderr_empty(fmt):
    result = run("gpt2", "--format", fmt)
    assert result.exit_code == 0 and result.stderr == ""


# --- published totals -----------------------------------------------------------------------


@pytest.mark.parametrize("name,total", [
    ("gpt2-medium", 354_823_168), ("gpt2-large", 774_030_080), ("gpt2-xl", 1_557_611_200)])
def test_gpt2_family_totals(name, total):
    data = run_json(name)
    assert data["total"] == total == sum(r["parameters"] for r in data["rows"])


def test_llama_7b_exact_in_json_and_table():
    data = run_json("llama-7b")
    rows = {r["key"]: r for r in data["rows"]}
    assert data["total"] == 6_738_415_616
    assert rows["token_embedding"]["parameters"] == 131_072_000
    assert round(100 * rows["token_embedding"]["share"], 2) == 1.95
    assert rows["lm_head"]["parameters"] == 131_072_000  # untied
    assert "position_embedding" not in rows  # rotary: no learned positions
    assert data["tied"] == []
    assert not any("shares the token embedding" in n for n in data["notes"])
    out = run("llama-7b", "--format", "table").stdout
    assert re.search(r"Token Embedding\s+131,072,000\s+1\.95%", out)
    assert re.search(r"LM head\s+131,072,000\s+1\.95%", out)
    assert re.search(r"Total\s+6,738,415,616\s+100\.00%", out)


def test_mixtral_preset_total_and_active():
    data = run_json("mixtral-8x7b")
    assert data["total"] == 46_702_792_704
    assert data["active"] == 12_879_925_248
    assert data["moe"] == {"n_experts": 8, "top_k": 2, "moe_layers": 32, "dense_layers": 0,
                           "active": 12_879_925_248, "unselected": 46_702_792_704 - 12_879_925_248}
    rows = {r["key"]: r for r in data["rows"]}
    # 32 layers x 8 experts x SwiGLU(4096 -> 14336); top-2 run per token.
    assert rows["routed_experts"]["parameters"] == 32 * 8 * 3 * 4096 * 14336
    assert rows["routed_experts"]["active"] == 32 * 2 * 3 * 4096 * 14336
    assert rows["router"]["parameters"] == 32 * 8 * 4096
    assert "ffn" not in rows
    assert sum(r["active"] for r in data["rows"]) == data["active"]
    assert any(n.startswith("Active = parameters used for one token") and "top-2 of 8" in n for n in data["notes"])
    out = run("mixtral-8x7b", "--format", "table").stdout
    assert re.search(r"Total\s+46,702,792,704\s+100\.0+%.*12,879,925,248", out)


# --- a 70B config from a local directory -----------------------------------------------------


def test_70b_llama_config_exact(tmp_path):
    from transformers import LlamaConfig

    d, L, ff, heads, kv, V = 8192, 80, 28672, 64, 8, 32000
    LlamaConfig(hidden_size=d, num_hidden_layers=L, intermediate_size=ff, num_attention_heads=heads,
                num_key_value_heads=kv, vocab_size=V, tie_word_embeddings=False).save_pretrained(tmp_path)
    head_dim = d // heads
    attention = L * (2 * d * d + 2 * d * kv * head_dim)  # q, o full; k, v grouped
    ffn = L * 3 * d * ff  # gate, up, down
    norms = L * 2 * d + d
    expected = 2 * V * d + attention + ffn + norms
    assert expected == 68_976_648_192
    data = run_json(str(tmp_path))
    assert data["source"] == "directory"
    rows = {r["key"]: r["parameters"] for r in data["rows"]}
    assert data["total"] == expected
    assert rows == {"token_embedding": V * d, "attention": attention, "ffn": ffn, "norm_other": norms,
                    "lm_head": V * d}


# --- options ---------------------------------------------------------------------------------


def test_per_layer_rows_sum_to_total():
    data = run_json("gpt2", "--per-layer")
    layers = data["layers"]
    assert [lr["index"] for lr in layers] == list(range(12))
    d = 768
    per_block = (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d) + 4 * d
    assert all(lr["total"] == per_block == 7_087_872 for lr in layers)
    assert all(lr["attention"] == 2_362_368 and lr["ffn"] == 4_722_432 and lr["norm_other"] == 3072
               for lr in layers)
    outside = {r["key"]: r["parameters"] for r in data["outside_layers"]}
    assert outside == {"token_embedding": 38_597_376, "position_embedding": 786_432, "norm_other": 2 * d}
    assert sum(lr["total"] for lr in layers) + sum(outside.values()) == GPT2_TOTAL
    tsv = run("gpt2", "--per-layer", "--format", "tsv").stdout.splitlines()
    assert tsv[0].split("\t") == ["key", "component", "attention", "ffn", "norm_other", "parameters", "share"]
    assert tsv[1].split("\t")[:6] == ["layer_0", "layer 0", "2362368", "4722432", "3072", "7087872"]
    assert tsv[-1].split("\t") == ["total", "Total", "", "", "", "124439808", "1.0"]


@pytest.mark.parametrize("dtype,bytes_per", [("fp32", 4), ("fp16", 2), ("bf16", 2), ("int8", 1), ("int4", 0.5)])
def test_dtype_memory_column(dtype, bytes_per):
    data = run_json("gpt2", "--dtype", dtype)
    assert data["dtype"] == dtype
    assert data["memory_bytes"] == math.ceil(GPT2_TOTAL * bytes_per)
    for r in data["rows"]:
        assert r["memory_bytes"] == math.ceil(r["parameters"] * bytes_per)
    assert any(n.startswith(f"Memory: parameters x {bytes_per:g} bytes ({dtype})") for n in data["notes"])


def test_dtype_in_table_and_csv():
    out = run("gpt2-xl", "--dtype", "bf16", "--format", "table").stdout
    assert re.search(r"Total\s+1,557,611,200\s+100\.00%.*2\.9 GiB", out)  # 3,115,222,400 bytes
    rows = list(csv.DictReader(io.StringIO(run("gpt2-xl", "--dtype", "bf16", "-f", "csv").stdout, newline="")))
    assert rows[-1]["memory_bytes"] == str(2 * 1_557_611_200)


def test_mixtral_memory_counts_every_expert():
    data = run_json("mixtral-8x7b", "--dtype", "bf16")
    assert data["memory_bytes"] == 2 * 46_702_792_704
    assert any("every expert included" in n for n in data["notes"])


def test_help_has_an_example():
    result = runner.invoke(app, ["params", "--help"])
    assert result.exit_code == 0
    assert "anatomy params gpt2-medium --dtype bf16" in result.stdout
    assert "--per-layer" in result.stdout and "--max-memory" in result.stdout


def test_trust_remote_code_reaches_autoconfig(tmp_path, monkeypatch):
    from transformers import AutoConfig
    from transformers import GPT2Config

    GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=100).save_pretrained(tmp_path)
    seen = []
    original = AutoConfig.from_pretrained.__func__

    def spy(cls, path, **kwargs):
        seen.append(kwargs.get("trust_remote_code"))
        return original(cls, path, **kwargs)

    monkeypatch.setattr(AutoConfig, "from_pretrained", classmethod(spy))
    assert run(str(tmp_path), "-f", "json").exit_code == 0
    assert run(str(tmp_path), "-f", "json", "--trust-remote-code").exit_code == 0
    assert seen == [False, True]


# --- placement (accelerate's planner) --------------------------------------------------------


def test_placement_everything_fits_one_gpu():
    data = run_json("gpt2", "--max-memory", "0=1GiB,cpu=2GiB")
    placement = data["placement"]
    assert placement["device_map"] == {"": "0"}
    assert placement["max_memory"] == {"0": 2**30, "cpu": 2 * 2**30}
    assert [(d["device"], d["parameters"]) for d in placement["devices"]] == [("0", GPT2_TOTAL)]
    assert placement["devices"][0]["modules"] == ["(whole model)"]  # accelerate's "" named


def test_placement_spills_blocks_to_cpu_and_disk():
    data = run_json("gpt2", "--max-memory", "0=100MiB,cpu=150MiB", "--dtype", "bf16")
    placement = data["placement"]
    devices = {d["device"]: d for d in placement["devices"]}
    assert set(devices) == {"0", "cpu", "disk"}
    assert sum(d["parameters"] for d in devices.values()) == GPT2_TOTAL
    for name in ("0", "cpu"):
        assert devices[name]["memory_bytes"] == 2 * devices[name]["parameters"] <= devices[name]["budget_bytes"]
    # blocks are never split: each transformer.h.<i> sits whole on one device
    blocks = [k for k in placement["device_map"] if k.startswith("transformer.h.")]
    assert blocks and all(re.fullmatch(r"transformer\.h\.\d+", k) for k in blocks)
    assert devices["0"]["modules"][0] == "transformer.wte"
    table = run("gpt2", "--max-memory", "0=100MiB,cpu=150MiB", "--dtype", "bf16", "-f", "table").stdout
    assert "Placement (accelerate infer_auto_device_map, bf16)" in table and "transformer.h." in table


def test_placement_balanced_over_two_gpus():
    data = run_json("gpt2", "--max-memory", "0=1GiB,1=1GiB,cpu=1GiB")
    placement = data["placement"]
    assert placement["balanced"] is True
    used = {d["device"] for d in placement["devices"] if d["parameters"]}
    assert {"0", "1"} <= used
    assert sum(d["parameters"] for d in placement["devices"]) == GPT2_TOTAL


@pytest.mark.parametrize("spec", ["0=lots", "gpu0=1GiB", "0=1GiB,0=2GiB", "=1GiB", ",", "cpu=-1GiB"])
def test_bad_max_memory_is_a_usage_error(spec):
    result = run("gpt2", "--max-memory", spec)
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: --max-memory") and result.stderr.count("\n") == 1


# --- errors ----------------------------------------------------------------------------------


def test_unknown_model_offline_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = run("no-such/model")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: no-such/model is not in the local Hugging Face cache")
    assert "HF_HUB_OFFLINE" in result.stderr


def test_hub_id_resolves_from_the_hf_cache_offline(tmp_path, monkeypatch):
    """Only config.json, from the cache, with HF_HUB_OFFLINE set: the Hub is never contacted."""
    from huggingface_hub import constants
    from transformers import LlamaConfig

    repo = tmp_path / "models--tiny-org--tiny-llama"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                intermediate_size=64, vocab_size=100).save_pretrained(snapshot)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = run_json("tiny-org/tiny-llama")
    assert data["source"] == "hub" and data["location"] == str(snapshot / "config.json")
    # embed + 2 x (q,o 32x32; k,v 32x16; SwiGLU 3x32x64; 2 norms) + final norm + untied head
    assert data["total"] == 100 * 32 + 2 * (2 * 1024 + 2 * 512 + 3 * 32 * 64 + 64) + 32 + 100 * 32 == 24_992


def test_invalid_model_id_is_one_line():
    result = run("not a model!")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: no model 'not a model!'") and result.stderr.count("\n") == 1


def test_missing_local_directory(tmp_path):
    result = run(str(tmp_path / "nope"))
    assert result.exit_code == 2  # a model path that does not exist: a usage error, as a missing corpus is
    assert result.stderr == f"error: no such directory: {tmp_path / 'nope'}\n"


def test_directory_without_config(tmp_path):
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr == f"error: {tmp_path} has no config.json; expected a directory written by save_pretrained\n"


def test_broken_config_json(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2", "n_embd": ', encoding="utf-8")
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {tmp_path}: ") and "config.json" in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("text,message", [
    ('{"model_type": "no-such-architecture"}', "model_type 'no-such-architecture' is unknown to transformers"),
    ('{"hidden_size": 32}', "config.json has no model_type"),
    ('{"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4}',
     "config.json is inconsistent: The hidden size (30) is not a multiple of the number of attention heads (4)"),
])
def test_unusable_config_json(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text, encoding="utf-8")
    result = run(str(tmp_path))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: {tmp_path}: {message}")
    assert result.stderr.count("\n") == 1


def test_bad_dtype_is_a_usage_error():
    result = run("gpt2", "--dtype", "fp8")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ")
