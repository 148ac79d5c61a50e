"""GGUF files: a tiny LLaMA written here with gguf.GGUFWriter (F32), then the real SmolLM2 Q4_1 file.

The tiny file holds the weights of tests/models.py's tiny llama (q/k permuted as llama.cpp's
converter does, so transformers' loader must undo it) and the real GPT-2 vocabulary: loading
it must give back that model's logits, computed independently by transformers on the
save_pretrained directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import models
import numpy as np
import pytest
import torch
from torch.testing import assert_close
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import UnsupportedArchitecture
from anatomy_cli.models.headers import read_gguf

runner = CliRunner()


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp convert_hf_to_gguf.py LlamaModel.permute: rotary halves -> interleaved pairs
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def add_gpt2_vocab(w) -> None:
    """The GPT-2 BPE vocabulary (tests/models.py's decoders use it) into GGUFWriter ``w``, as llama.cpp writes it."""
    import gguf
    from conftest import build_gpt2_tokenizer

    tok = build_gpt2_tokenizer()
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, (list, tuple)) else m
              for m in json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(vocab)
    w.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t in vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(models.EOS)
    w.add_eos_token_id(models.EOS)


def write_gguf(path, arch: str, name: str, cfg, tensors: dict[str, np.ndarray], quant: str = "F32", more=None):
    """A GGUF file of llama.cpp's architecture ``arch`` holding ``tensors`` (``{gguf name: array}``), with the
    header keys llama.cpp's convert_hf_to_gguf.py writes for every LLaMA-like ``cfg`` (a transformers config) and
    the GPT-2 vocabulary; ``more(writer)`` adds the architecture's own keys. F32, or with ``quant="Q8_0"`` the
    matrices whose rows are whole blocks of 32 quantized to Q8_0 (the rest, norms and biases, stay F32, as
    llama.cpp falls back)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                         else 10000.0)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    if more is not None:
        more(w)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if quant == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    add_gpt2_vocab(w)
    q8 = gguf.GGMLQuantizationType.Q8_0
    for gg, data in tensors.items():
        data = np.ascontiguousarray(data, dtype=np.float32)
        if quant == "Q8_0" and data.ndim >= 2 and data.shape[-1] % 32 == 0:
            w.add_tensor(gg, gguf.quants.quantize(data, q8), raw_dtype=q8)
        else:
            w.add_tensor(gg, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_tiny_gguf(path, quant: str = "F32"):
    """tests/models.py's tiny llama as a GGUF file (GPT-2 BPE vocabulary): F32 tensors, or with
    ``quant="Q8_0"`` the 2-D weights quantized to Q8_0 as llama.cpp does (norms stay F32)."""
    model = models.build_model("llama")
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
             "lm_head.weight": "output.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in parts.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"
    tensors = {}
    for hf, gg in names.items():
        data = sd[hf]
        if gg.endswith("attn_q.weight"):
            data = _permute(data, cfg.num_attention_heads)
        elif gg.endswith("attn_k.weight"):
            data = _permute(data, cfg.num_key_value_heads)
        tensors[gg] = data
    return write_gguf(path, "llama", "tiny-llama", cfg, tensors, quant)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny-llama.F32.gguf")


@pytest.fixture(scope="session")
def tiny_gguf_lm(tiny_gguf):
    return engine.load(str(tiny_gguf), device="cpu")


def _one_line(exc) -> str:
    text = str(exc.value)
    assert text and "\n" not in text
    return text


# --- the header ----------------------------------------------------------------------------------


def gguf_reader_view(path: Path) -> dict:
    """What ``gguf.GGUFReader`` reads of a file: per tensor its name, type, element and byte counts and shape; every
    key's value (``contents()``) but the reader's own ``GGUF.*`` entries."""
    from gguf import GGUFReader

    ref = GGUFReader(str(path))
    return {"tensors": [(b.name, b.tensor_type.name, int(b.n_elements), int(b.n_bytes), tuple(int(s) for s in b.shape))
                        for b in ref.tensors],
            "fields": {key: field.contents() for key, field in ref.fields.items() if not key.startswith("GGUF.")}}


def test_header_reader_agrees_with_gguf_reader(tiny_gguf, smollm2_gguf):
    """anatomy's header reader against gguf's own; SmolLM2's view of gguf's reader (4 s: a numpy view of every
    vocabulary string) is kept once per machine (conftest's ``cached_value``, keyed by the file's SHA-256 and the
    gguf version)."""
    from importlib.metadata import version

    from conftest import cached_value

    from anatomy_cli.models.identity import file_sha256

    for path in (tiny_gguf, smollm2_gguf):
        ours = read_gguf(path)
        ref = gguf_reader_view(path) if path == tiny_gguf else cached_value(
            f"gguf-reader-{file_sha256(path)[:16]}-gguf{version('gguf')}", lambda p=path: gguf_reader_view(p))
        assert [t.name for t in ours.tensors] == [t[0] for t in ref["tensors"]]
        for a, b in zip(ours.tensors, ref["tensors"]):
            assert (a.name, a.dtype, a.n_params, a.n_bytes, a.shape) == b
        for key, value in ref["fields"].items():
            if key in ours.array_lengths:
                assert ours.array_lengths[key] == len(value)
            else:
                assert ours.fields[key] == pytest.approx(value) if isinstance(value, float) else \
                    ours.fields[key] == value, key


def test_tiny_header_counts_equal_the_model(tiny_gguf):
    header = read_gguf(tiny_gguf)
    assert header.architecture == "llama" and header.quantization == "F32"
    assert sum(t.n_params for t in header.tensors) == models.expected_params("llama")


# --- loading the tiny file --------------------------------------------------------------------------


def test_quantized_gguf_is_dequantized_to_the_dtype_asked_for(tmp_path):
    """Q8_0 weights come back as dense bf16 tensors equal to gguf's own dequantization of the whole tensor
    (anatomy fills them a block of rows at a time), with no GGUF quantizer left on the model."""
    import gguf

    path = write_tiny_gguf(tmp_path / "tiny-llama.Q8_0.gguf", quant="Q8_0")
    assert read_gguf(path).quantization == "Q8_0"
    lm = engine.load(str(path), device="cpu", dtype="bf16")
    assert lm.dequantized_from == "Q8_0" and lm.dtype == torch.bfloat16
    assert getattr(lm.model, "hf_quantizer", None) is None
    assert {p.dtype for p in lm.model.parameters()} == {torch.bfloat16}
    reader = gguf.GGUFReader(str(path))
    stored = next(t for t in reader.tensors if t.name == "blk.0.ffn_down.weight")
    want = torch.from_numpy(gguf.quants.dequantize(stored.data, stored.tensor_type).copy())
    got = lm.model.model.layers[0].mlp.down_proj.weight.detach().float()
    assert_close(got, want.to(torch.bfloat16).float(), atol=0, rtol=0)
    ref = models.build_model("llama").model.layers[0].mlp.down_proj.weight.detach().float()
    assert 0 < float((got - ref).abs().max()) < 0.02  # quantized: close to the original, not equal


def test_tiny_gguf_loads_to_the_same_model(tiny_gguf_lm, tiny_lm):
    lm, ref = tiny_gguf_lm, tiny_lm("llama")
    assert lm.dequantized_from == "F32" and not lm.untrained
    assert (lm.n_layers, lm.d_model, lm.n_heads, lm.d_head) == (ref.n_layers, ref.d_model, ref.n_heads, ref.d_head)
    text = "The capital of Germany is"
    enc = engine.encode(lm, [text])
    assert enc[0].ids == engine.encode(ref, [text])[0].ids  # the GGUF vocabulary is GPT-2's
    with torch.no_grad():
        want = ref.model(torch.tensor([enc[0].ids]), output_hidden_states=True)
    cache = engine.run(lm, enc, engine.residual_names(lm) + ["logits"])[0]
    # transformers' last hidden state is after the final norm; the residual stream's is before it
    assert_close(cache.residual_stream()[:-1], torch.stack(want.hidden_states)[:-1, 0], atol=1e-5, rtol=1e-5)
    assert_close(cache.logits, want.logits[0], atol=1e-4, rtol=1e-4)


def test_open_reads_no_weight_of_a_gguf(tiny_gguf, monkeypatch):
    from anatomy_cli.engine import load_gguf

    def no_weights(*args, **kwargs):
        raise AssertionError("opening must read no weight")

    monkeypatch.setattr(load_gguf, "load_weights", no_weights)
    opened = engine.open_model(str(tiny_gguf), device="cpu")
    assert (type(opened.tokenizer).__name__, opened.config.model_type, opened.info.n_layers) == (
        "Tokenizer", "llama", models.LAYERS)


def test_next_heading_says_dequantized_from(tiny_gguf, tiny_gguf_lm, monkeypatch, fixed_load):
    fixed_load(tiny_gguf_lm)
    result = runner.invoke(app, ["next", "Thank you very", "--model", str(tiny_gguf), "--format", "table"])
    assert result.exit_code == 0, result.stderr
    # named by the file's stem (the path stays in JSON)
    assert "next · tiny-llama.F32 (weights dequantized from F32)" in " ".join(result.stdout.split())


def test_tokens_and_params_take_a_gguf_file(tiny_gguf):
    result = runner.invoke(app, ["tokens", "Thank you very", "--model", str(tiny_gguf), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    assert [t["token_id"] for t in json.loads(result.stdout)["tokens"]] == [10449, 345, 845]
    result = runner.invoke(app, ["params", str(tiny_gguf), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["total"] == models.expected_params("llama") and data["source"] == "gguf"
    rows = {r["key"]: r for r in data["rows"]}
    d, v = models.D, models.GPT2_VOCAB
    assert rows["lm_head"]["parameters"] == rows["token_embedding"]["parameters"] == v * d  # untied: own row
    assert rows["token_embedding"]["dtypes"] == ["F32"] and rows["token_embedding"]["bits_per_weight"] == 32


# --- errors: one line each ----------------------------------------------------------------------------


def test_truncated_gguf(tiny_gguf, tmp_path):
    size = tiny_gguf.stat().st_size
    for cut in (size - 1000, 200, 10):
        bad = tmp_path / f"cut{cut}.gguf"
        bad.write_bytes(tiny_gguf.read_bytes()[:cut])
        with pytest.raises(CheckpointError) as err:
            engine.load(str(bad), device="cpu")
        assert str(bad) in _one_line(err) and ("truncated" in str(err.value) or "not a GGUF" in str(err.value))


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not gguf at all" * 10)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        engine.load(str(bad), device="cpu")


def test_missing_gguf_path_fails_before_torch(tmp_path):
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelNotFound, match=f"no such file: {missing}"):
        engine.load(str(missing), device="cpu")
    code = ("import sys; from typer.testing import CliRunner; from anatomy_cli.cli.main import app\n"
            f"r = CliRunner().invoke(app, ['next', 'hi', '--model', {str(missing)!r}])\n"
            "assert r.exit_code == 2, r.stderr\n"
            f"assert r.stderr == 'error: no such file: {missing}\\n', r.stderr\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def _patched(src, dst, old: bytes, new: bytes):
    data = src.read_bytes()
    at = data.index(old)
    dst.write_bytes(data[:at] + new + data[at + len(old):])
    return dst


def test_unsupported_architecture_names_the_readable_ones(tiny_gguf, tmp_path):
    # general.architecture "llama" -> "rwkv6" (same length, so the rest of the file stays valid)
    path = _patched(tiny_gguf, tmp_path / "rwkv.gguf", b"llama", b"rwkv6")
    assert read_gguf(path).architecture == "rwkv6"
    with pytest.raises(UnsupportedArchitecture) as err:
        engine.load(str(path), device="cpu")
    text = _one_line(err)
    assert "GGUF architecture 'rwkv6' cannot be read by transformers" in text
    for arch in ("llama", "qwen2", "gpt2", "mistral"):
        assert arch in text


def test_type_gguf_cannot_dequantize(tiny_gguf, tmp_path):
    import struct

    # blk.0.ffn_up.weight: F32 (0) -> I32 (26), the same 4 bytes per element; gguf cannot dequantize I32
    name = b"blk.0.ffn_up.weight"
    info = name + struct.pack("<IQQI", 2, models.D, models.FFN, 0)
    path = _patched(tiny_gguf, tmp_path / "i32.gguf", info, info[:-4] + struct.pack("<I", 26))
    assert {t.name: t.dtype for t in read_gguf(path).tensors}["blk.0.ffn_up.weight"] == "I32"
    with pytest.raises(CheckpointError) as err:
        engine.load(str(path), device="cpu")
    assert "tensor type I32 cannot be dequantized" in _one_line(err) and "Q4_1" in str(err.value)
    result = runner.invoke(app, ["next", "hi", "--model", str(path)])
    assert result.exit_code == 1 and result.stderr.startswith("error: ") and result.stderr.count("\n") == 1


# --- the real trained decoder: SmolLM2-135M-Instruct, Q4_1 ----------------------------------------


def test_smollm2_params_from_the_header_equal_the_dequantized_model(smollm2_gguf, smollm2_hf):
    model, _ = smollm2_hf
    result = runner.invoke(app, ["params", str(smollm2_gguf), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["total"] == sum(p.numel() for p in model.parameters()) == 134_515_008
    assert data["quantization"] == "Q4_1 (Q4_1, Q8_0)" and data["read_from"] == "gguf_header"
    rows = {r["key"]: r for r in data["rows"]}
    assert "lm_head" not in rows  # tied
    assert rows["token_embedding"]["parameters"] == model.model.embed_tokens.weight.numel()
    assert rows["token_embedding"]["dtypes"] == ["Q8_0"] and rows["token_embedding"]["bits_per_weight"] == 8.5
    assert rows["attention"]["dtypes"] == ["Q4_1"] and rows["attention"]["bits_per_weight"] == 5.0
    attn = sum(p.numel() for n, p in model.named_parameters() if ".self_attn." in n)
    assert rows["attention"]["parameters"] == attn
    assert data["disk_bytes"] < smollm2_gguf.stat().st_size
    assert data["dequantized_bytes"] == {"fp32": 4 * 134_515_008, "bf16": 2 * 134_515_008, "fp16": 2 * 134_515_008}


def test_smollm2_next_token(smollm2_lm, smollm2_hf):
    model, tok = smollm2_hf
    for prompt, word, p in (("One, two, three,", " four", 0.581), ("The capital of Germany is", " Berlin", 0.796)):
        enc = engine.encode(smollm2_lm, [prompt])
        probs = engine.run(smollm2_lm, enc, ["logits"])[0].logits[-1].softmax(-1)
        with torch.no_grad():
            want = model(torch.tensor([tok(prompt)["input_ids"]])).logits[0, -1].softmax(-1)
        assert_close(probs, want)
        top = int(probs.argmax())
        assert tok.decode([top]) == word and float(probs[top]) == pytest.approx(p, abs=5e-3)


def _close(a, b, path="", tol=1e-5):
    """Every number of two JSON values within ``tol`` (absolute), the rest equal."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _close(a[k], b[k], f"{path}.{k}", tol)
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{path}[{i}]", tol)
    elif isinstance(a, float) or isinstance(b, float):
        assert abs(a - b) <= tol, (path, a, b)
    else:
        assert a == b, (path, a, b)


def test_smollm2_trace_from_gguf_equals_trace_from_saved_directory(smollm2_gguf, smollm2_lm, smollm2_dir,
                                                                    monkeypatch, fixed_load):
    args = ["trace", "The capital of Germany is", "--device", "cpu", "--format", "json"]
    from_dir = runner.invoke(app, [*args, "--model", str(smollm2_dir)])  # a real load of the directory
    assert from_dir.exit_code == 0, from_dir.stderr
    fixed_load(smollm2_lm)
    from_gguf = runner.invoke(app, [*args, "--model", str(smollm2_gguf)])
    assert from_gguf.exit_code == 0, from_gguf.stderr
    a, b = json.loads(from_gguf.stdout), json.loads(from_dir.stdout)
    a.pop("model"), b.pop("model")
    assert (a.pop("dequantized_from"), b.pop("dequantized_from")) == ("Q4_1 (Q4_1, Q8_0)", None)
    _close(a, b)
    assert a["top"][0]["token"] == "·Berlin" and a["top"][0]["probability"] == pytest.approx(0.796, abs=5e-3)
