"""Big models: --device-map / --max-memory / --offload-folder (accelerate's big-model inference).

On CPU, offload is forced with a ``max_memory`` too small for the tiny models, so
accelerate keeps the embedding (and for LLaMA the first block) in RAM and reads the
rest from disk at every forward. ``trace``, ``next`` and ``drift`` must then equal the
in-memory run, and ``params``' placement estimate must be what loading really does.

Sizes behind the budgets (fp32): the tiny models' token embedding is 50257 x 32 x 4 =
6,432,896 bytes; a GPT-2 block 50,816, a LLaMA block 37,120. accelerate also keeps
room for the largest layer on the main device, hence the odd numbers.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app
from anatomy_cli.errors import AnatomyError
from anatomy_cli.errors import UsageError
from anatomy_cli.models import bigmodel

# cpu budget -> the expected split (checked below, so a change in the tiny models shows up here)
BUDGETS = {
    "gpt2": ("6500000", {"transformer.wte": "cpu", "lm_head": "cpu", "transformer.wpe": "cpu",
                         "transformer.drop": "cpu", "transformer.ln_f": "disk", "transformer.h": "disk"}),
    "llama": ("12910000", {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk",
                           "model.norm": "disk", "model.rotary_emb": "disk", "lm_head": "disk"}),
}
PROMPTS = "Thank you very\nThe capital of France is\n"
TOL = 1e-5


def invoke(*args: str, input: str | None = None):
    return CliRunner().invoke(app, list(args), input=input)


def run_json(*args: str, input: str | None = None) -> dict:
    result = invoke(*args, "--format", "json", input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def offload_args(arch: str) -> list[str]:
    return ["--device-map", "auto", "--max-memory", f"cpu={BUDGETS[arch][0]}"]


def assert_json_close(a, b, path="$"):
    """Numbers within TOL, everything else (tokens, ids, keys) exactly equal."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=TOL), path
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_json_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_json_close(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


# ---------------------------------------------------------------- the weights really are offloaded

@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_budget_too_small_offloads_blocks_to_disk(arch, tiny_model_dir):
    budget, expected = BUDGETS[arch]
    lm = engine.load(str(tiny_model_dir(arch)), device_map="auto", max_memory=f"cpu={budget}")
    assert lm.model.hf_device_map == expected
    assert lm.device == torch.device("cpu")
    blocks = lm.model.base_model.get_submodule(lm.adapter.blocks)
    last = next(blocks[-1].parameters())
    assert last.device.type == "meta"  # not resident: read from the checkpoint at each forward
    assert lm.model.get_input_embeddings().weight.device.type == "cpu"
    summary = {d["device"]: d for d in bigmodel.device_summary(lm.model)}
    assert set(summary) == {"cpu", "disk"}
    total = sum(p.numel() for p in lm.model.parameters())
    assert summary["cpu"]["parameters"] + summary["disk"]["parameters"] == total
    assert summary["cpu"]["bytes"] <= int(budget)
    assert sum(d["bytes"] for d in summary.values()) == total * 4


# ---------------------------------------------------------------- results equal the in-memory run

@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_trace_offloaded_equals_in_memory(arch, tiny_model_dir):
    model = str(tiny_model_dir(arch))
    ref = run_json("trace", "-", "-m", model, "--device", "cpu", input=PROMPTS)
    result = invoke("trace", "-", "-m", model, *offload_args(arch), "--format", "json", input=PROMPTS)
    assert result.exit_code == 0, result.stderr
    placement = next(line for line in result.stderr.splitlines() if line.startswith("placement: "))
    assert " disk " in placement and "read from disk at every forward" in placement
    off = json.loads(result.stdout)
    assert len(off["results"]) == 2 and len(off["results"][0]["layers"]) == 3
    assert_json_close(off, ref)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_next_offloaded_equals_in_memory(arch, tiny_model_dir):
    model = str(tiny_model_dir(arch))
    args = ["next", "Thank you very", "-m", model, "--k", "20", "--target", " much"]
    ref = run_json(*args, "--device", "cpu")
    off = run_json(*args, *offload_args(arch))
    assert off["target"]["token_id"] == 881
    assert_json_close(off, ref)


def test_drift_offloaded_equals_in_memory(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    args = ["drift", "bank", "-c", "I paid at the bank today.", "-c", "We swam to the river bank.", "-m", model]
    ref = run_json(*args, "--device", "cpu")
    off = run_json(*args, *offload_args("llama"))
    assert len(off["layers"]) == 3
    assert_json_close(off, ref)


def test_sequential_device_map_with_everything_resident(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    ref = run_json("next", "Thank you very", "-m", model, "--device", "cpu")
    result = invoke("next", "Thank you very", "-m", model, "--device-map", "sequential", "--format", "json")
    assert result.exit_code == 0, result.stderr
    assert "placement: cpu " in result.stderr and "(all)" in result.stderr and "disk" not in result.stderr
    assert_json_close(json.loads(result.stdout), ref)


# ---------------------------------------------------------------- the offload folder

def test_moe_offload_needs_a_folder_then_uses_it(tiny_model_dir, tmp_path):
    # Mixtral's experts are fused while loading, so transformers cannot read them in place
    # from model.safetensors: the offloaded ones must be re-saved in the offload folder.
    model = str(tiny_model_dir("mixtral"))
    args = ["next", "Thank you very", "-m", model, "--device-map", "auto", "--max-memory", "cpu=13MB"]
    result = invoke(*args)
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1].startswith("error: ") and "pass --offload-folder DIR" in result.stderr
    assert "Traceback" not in result.stderr

    folder = tmp_path / "offload"
    off = run_json(*args, "--offload-folder", str(folder))
    assert sorted(p.name for p in folder.iterdir()) == [
        "model.layers.1.mlp.experts.down_proj.safetensors", "model.layers.1.mlp.experts.gate_up_proj.safetensors"]
    assert_json_close(off, run_json("next", "Thank you very", "-m", model, "--device", "cpu"))


def test_safetensors_offload_reads_in_place(tiny_model_dir, tmp_path):
    folder = tmp_path / "offload"
    run_json("next", "Thank you very", "-m", str(tiny_model_dir("gpt2")), *offload_args("gpt2"),
             "--offload-folder", str(folder))
    assert list(folder.iterdir()) == []  # nothing copied: the checkpoint's own file is read


# ---------------------------------------------------------------- option errors (before any weights load)

@pytest.mark.parametrize("args, code, message", [
    (["--max-memory", "cpu=1GB"], 2, "error: --max-memory needs --device-map (auto, balanced, sequential)"),
    (["--offload-folder", "x"], 2, "error: --offload-folder needs --device-map (auto, balanced, sequential)"),
    (["--device-map", "auto", "--max-memory", "gpu=1GB"], 2, "error: --max-memory: 'gpu=1GB' is not DEVICE=SIZE"),
    (["--device-map", "auto", "--max-memory", "cpu=lots"], 2, "error: --max-memory: 'lots' is not a size"),
    (["--device-map", "auto", "--max-memory", "cpu=1GB,cpu=2GB"], 2, "error: --max-memory: device 'cpu' given twice"),
    (["--device-map", "auto", "--init", "random"], 2, "error: --device-map places a checkpoint's weights"),
    (["--device-map", "everywhere"], 2, "error: Invalid value for '--device-map'"),
])
@pytest.mark.parametrize("command", [["trace", "Thank you very"], ["next", "Thank you very"], ["drift", "bank"]])
def test_bad_placement_options(command, args, code, message):
    result = invoke(*command, "-m", "gpt2", *args)
    assert result.exit_code == code
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_budget_for_a_missing_gpu_is_a_one_line_error(tiny_model_dir):
    result = invoke("next", "Thank you", "-m", str(tiny_model_dir("gpt2")), "--device-map", "auto",
                    "--max-memory", "0=1GiB,cpu=1GiB")
    assert result.exit_code == 1
    assert result.stderr == ("error: --max-memory names GPU 0 but this machine has no CUDA GPU; "
                             "budget cpu=SIZE (and disk) instead\n")


def test_offload_folder_that_is_a_file(tmp_path):
    afile = tmp_path / "f"
    afile.write_text("x")
    result = invoke("trace", "x", "--device-map", "auto", "--offload-folder", str(afile))
    assert result.exit_code == 2 and "is a file" in result.stderr
    with pytest.raises(UsageError, match="is a file"):
        bigmodel.placement_kwargs("auto", None, afile)


def test_placement_kwargs():
    assert bigmodel.placement_kwargs() == {}
    assert bigmodel.placement_kwargs("balanced", "cpu=1GiB, disk=20GB", "~/off") == {
        "device_map": "balanced", "max_memory": {"cpu": 2**30, "disk": 20 * 10**9},
        "offload_folder": str(Path("~/off").expanduser())}
    with pytest.raises(UsageError, match="unknown --device-map"):
        bigmodel.placement_kwargs("everywhere")
    if not torch.backends.mps.is_available():
        with pytest.raises(AnatomyError, match="mps"):
            bigmodel.placement_kwargs("auto", "mps=1GiB")


def test_compress_names():
    assert bigmodel.compress_names(["h.0", "h.1", "h.2", "ln_f", "h.4", "h.6", "h.7"]) == [
        "h.0-2", "ln_f", "h.4", "h.6-7"]


# ---------------------------------------------------------------- params: the placement estimate

@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_params_placement_is_what_loading_does(arch, tiny_model_dir):
    budget, expected = BUDGETS[arch]
    data = run_json("params", str(tiny_model_dir(arch)), "--max-memory", f"cpu={budget}")
    assert data["placement"]["device_map"] == expected
    by_device = {d["device"]: d for d in data["placement"]["devices"]}
    assert by_device["cpu"]["memory_bytes"] <= int(budget) < data["total"] * 4
    assert by_device["cpu"]["parameters"] + by_device["disk"]["parameters"] == data["total"]


LLAMA_70B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=8192, intermediate_size=28672,
                 num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, vocab_size=32000,
                 max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="float16")


def test_params_placement_of_a_70b_config_agrees_with_accelerate(tmp_path):
    import transformers
    from accelerate import init_empty_weights
    from accelerate.utils import get_balanced_memory
    from accelerate.utils import infer_auto_device_map

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B))
    gib = 2**30
    data = run_json("params", str(tmp_path), "--max-memory", "0=40GiB,1=40GiB,cpu=40GiB", "--dtype", "fp16")
    assert data["total"] == 68_976_648_192  # Llama-2-70B
    placement = data["placement"]
    devices = {d["device"]: d for d in placement["devices"]}
    assert list(devices) == ["0", "1", "cpu", "disk"]
    assert sum(d["parameters"] for d in devices.values()) == data["total"]  # every parameter placed
    for name in ("0", "1", "cpu"):
        assert devices[name]["memory_bytes"] <= 40 * gib
    # 128.5 GiB of fp16 weights for 120 GiB of budget: the last blocks go to disk
    assert sum(d["memory_bytes"] for d in devices.values()) == 2 * data["total"]
    assert 2 * data["total"] - 120 * gib <= devices["disk"]["memory_bytes"] < 16 * gib

    # the same plan straight from accelerate, on a meta model built independently
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    with init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float16)
    budget = {0: 40 * gib, 1: 40 * gib, "cpu": 40 * gib}
    quiet = logging.getLogger("accelerate.utils.modeling")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # absent GPUs: accelerate warns
    try:
        balanced = get_balanced_memory(model, max_memory=budget, no_split_module_classes=["LlamaDecoderLayer"])
        expected = infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=["LlamaDecoderLayer"])
    finally:
        quiet.setLevel(level)
    assert placement["device_map"] == {k: str(v) for k, v in expected.items()}
    assert placement["device_map"]["model.layers.79"] == "disk"
