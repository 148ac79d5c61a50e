"""GGUF loading read once: the config from the header, the tokenizer cache, weights streamed into the model, the
quantization label; checked against transformers' own GGUF loader on SmolLM2 (Q4_1) and Gemma 3 (Q4_K_M)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_gguf import write_tiny_gguf
from torch.testing import assert_close
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.cli.main import app
from anatomy_cli.engine import load_gguf
from anatomy_cli.models import gguf
from anatomy_cli.models import gguf_tokenizer
from anatomy_cli.models.headers import read_gguf

runner = CliRunner()
TEXTS = ["The capital of Germany is", "  two  spaces\n\ttab", "naïve café 日本語 🤖", "<|endoftext|> x", "<bos>hi"]


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf-load") / "tiny-llama.F32.gguf")


# --- the config and the label, from the header alone ---------------------------------------------------------


def test_config_from_the_header_equals_transformers(smollm2_gguf, tiny_gguf):
    for path, cached in ((smollm2_gguf, True), (tiny_gguf, False)):
        ours = gguf.read_config(read_gguf(path), str(path))
        assert ours.to_dict() == transformers_config(path, cached).to_dict(), path


def transformers_config(path, cached: bool):
    """transformers' own config reader on a GGUF file (``AutoConfig.from_pretrained(gguf_file=...)``: it reads the
    whole header with gguf's reader, 7 s for SmolLM2). ``cached``: the config it returned pickled once per machine
    (conftest's ``cached_value``, keyed by the file's SHA-256 and the transformers version) and read back after."""
    import transformers
    from conftest import cached_value
    from transformers import AutoConfig

    from anatomy_cli.models.identity import file_sha256

    def read():
        return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)

    if not cached:
        return read()
    config = cached_value(f"config-{file_sha256(path)[:16]}-transformers{transformers.__version__}", read)
    config._name_or_path = str(path.parent)  # the one field that names where it was read (the cache: another checkout)
    return config


def test_quantization_label(smollm2_gguf, gemma3_gguf, tiny_gguf, tmp_path):
    assert gguf.quantization_label(read_gguf(smollm2_gguf)) == "Q4_1 (Q4_1, Q8_0)"
    assert gguf.quantization_label(read_gguf(gemma3_gguf)) == "Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)"
    assert gguf.quantization_label(read_gguf(tiny_gguf)) == "F32"
    # the same file without general.file_type: the types of its matrices alone
    data = tiny_gguf.read_bytes()
    key = b"general.file_type"
    at = data.index(key)
    renamed = tmp_path / "no-file-type.gguf"
    renamed.write_bytes(data[:at] + b"general.file_typX" + data[at + len(key):])
    assert gguf.quantization_label(read_gguf(renamed)) == "F32"
    q8 = write_tiny_gguf(tmp_path / "q8.gguf", quant="Q8_0")
    assert gguf.quantization_label(read_gguf(q8)) == "Q8_0"


def test_weights_map_equals_transformers(tiny_gguf):
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import get_gguf_hf_weights_map

    header = read_gguf(tiny_gguf)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(gguf.read_config(header, "tiny"))
    processor = load_gguf._processor(header)
    assert load_gguf.weights_map(model, processor) == get_gguf_hf_weights_map(model, processor)


# --- the tokenizer cache ------------------------------------------------------------------------------------


@pytest.fixture
def converted(monkeypatch, tmp_path):
    """Counts transformers' conversions; a fresh cache directory for the test."""
    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(tmp_path / "cache"))
    calls = []
    real = gguf_tokenizer._convert

    def spy(*args):
        calls.append(args[0].path)
        return real(*args)

    monkeypatch.setattr(gguf_tokenizer, "_convert", spy)
    return calls


def _tokenizer(path):
    header = read_gguf(path)
    return gguf_tokenizer.load(header, gguf.read_config(header, str(path)), str(path))


def _same_tokenizer(a, b):
    for text in TEXTS:
        assert a(text)["input_ids"] == b(text)["input_ids"], text
        assert a.decode(a(text)["input_ids"]) == b.decode(b(text)["input_ids"])
    for attr in ("add_bos_token", "add_eos_token", "bos_token", "eos_token", "unk_token", "pad_token",
                 "all_special_ids", "chat_template"):
        assert getattr(a, attr, None) == getattr(b, attr, None), attr
    assert len(a) == len(b)


def test_tokenizer_is_cached_and_rebuilt_when_the_file_changes(converted, tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    first = _tokenizer(path)
    tokenizer_json, entry = gguf_tokenizer.entry_paths(read_gguf(path))
    assert tokenizer_json.is_file() and entry.is_file() and converted == [str(path)]
    second = _tokenizer(path)
    assert converted == [str(path)]  # from the cache
    _same_tokenizer(first, second)
    assert second("Thank you very")["input_ids"] == [10449, 345, 845]
    # touched: another mtime, another key
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    _tokenizer(path)
    assert len(converted) == 2
    # rewritten with the same size and mtime but another header byte: the digest changes the key
    data = bytearray(path.read_bytes())
    at = data.index(b"tiny-llama")
    data[at:at + 10] = b"tiny-lamba"
    st = path.stat()
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert gguf_tokenizer.entry_paths(read_gguf(path))[0] != tokenizer_json
    _tokenizer(path)
    assert len(converted) == 3


@pytest.mark.parametrize("damage", ["truncated tokenizer.json", "garbage entry", "entry missing"])
def test_corrupt_cache_entry_is_rebuilt(converted, tmp_path, damage):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    fresh = _tokenizer(path)
    tokenizer_json, entry = gguf_tokenizer.entry_paths(read_gguf(path))
    if damage == "truncated tokenizer.json":
        tokenizer_json.write_bytes(tokenizer_json.read_bytes()[:1000])
    elif damage == "garbage entry":
        entry.write_bytes(b"\x00{not json")
    else:
        entry.unlink()
    again = _tokenizer(path)
    assert len(converted) == 2
    _same_tokenizer(fresh, again)
    assert json.loads(entry.read_text())["sha256"]  # the entry is whole again
    _tokenizer(path)
    assert len(converted) == 2


def test_unwritable_cache_still_gives_the_tokenizer(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(blocker))
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert _tokenizer(path)("Thank you very")["input_ids"] == [10449, 345, 845]


def test_gemma_cached_tokenizer_equals_the_converted_one(gemma3_gguf, gemma3_lm, gemma3_tokenizer_cache,
                                                        monkeypatch):
    # gemma3_lm was loaded with an empty cache: its tokenizer is the conversion, and the cache holds what it stored
    monkeypatch.setenv("ANATOMY_CACHE_DIR", str(gemma3_tokenizer_cache))
    header = read_gguf(gemma3_gguf)
    cached = gguf_tokenizer._from_cache(*gguf_tokenizer.entry_paths(header), header)
    assert cached is not None
    _same_tokenizer(gemma3_lm.tokenizer.hf, cached)
    assert cached.add_bos_token is True and cached("Hi")["input_ids"][0] == 2


# --- weights: equal to transformers' own GGUF loader ------------------------------------------------------------


def _hidden_states_close(lm, ref, ids, atol=1e-4, rtol=1e-4, relative=False):
    """anatomy's residual stream and logits against transformers' ``output_hidden_states``. ``relative``: each
    layer's largest difference within ``atol`` x that layer's largest magnitude (Gemma's residual stream
    reaches the hundreds, where float32 sums in another order differ past 1e-4 absolute)."""
    cache = engine.run(lm, [engine.attention.encode_ids(lm, ids)], engine.residual_names(lm) + ["logits"])[0]
    with torch.no_grad():
        want = ref(torch.tensor([ids]), output_hidden_states=True)
    # transformers' last hidden state is after the final norm; the residual stream's is before it
    ours, theirs = cache.residual_stream()[:-1], torch.stack(want.hidden_states)[:-1, 0]
    if relative:
        scale = theirs.abs().amax(dim=(1, 2))
        err = (ours - theirs).abs().amax(dim=(1, 2)) / scale
        assert float(err.max()) <= atol, err
        assert float((cache.logits - want.logits[0]).abs().max()) <= atol * float(want.logits.abs().max())
    else:
        assert_close(ours, theirs, atol=atol, rtol=rtol)
        assert_close(cache.logits, want.logits[0], atol=atol, rtol=rtol)
    return want


def _same_weights(model, ref):
    ours, theirs = dict(model.named_parameters()), dict(ref.named_parameters())
    assert sorted(ours) == sorted(theirs)
    for name, p in ours.items():
        assert p.dtype == theirs[name].dtype and torch.equal(p, theirs[name]), name
    ours, theirs = dict(model.named_buffers()), dict(ref.named_buffers())
    assert sorted(ours) == sorted(theirs)
    for name, b in ours.items():
        assert torch.equal(b, theirs[name].to(b.dtype)), name
    assert not model.training


def test_smollm2_weights_and_trace_equal_transformers(smollm2_gguf, smollm2_lm):
    from conftest import transformers_reference
    from transformers import AutoModelForCausalLM
    from transformers import GgufConfig

    def load():
        return AutoModelForCausalLM.from_pretrained(str(smollm2_gguf.parent), gguf_file=smollm2_gguf.name,
                                                    config=smollm2_lm.model.config, dtype=torch.float32,
                                                    quantization_config=GgufConfig(dequantize=True),
                                                    local_files_only=True)

    ref = transformers_reference("smollm2", smollm2_gguf, load).eval()  # transformers' own load, cached
    _same_weights(smollm2_lm.model, ref)
    assert smollm2_lm.dequantized_from == "Q4_1 (Q4_1, Q8_0)"
    _hidden_states_close(smollm2_lm, ref, engine.encode(smollm2_lm, ["The capital of Germany is"])[0].ids)


def test_gemma_weights_equal_transformers(gemma3_lm, gemma3_hf):
    _same_weights(gemma3_lm.model, gemma3_hf)
    assert gemma3_lm.model.lm_head.weight is gemma3_lm.model.model.embed_tokens.weight  # tied
    c = gemma3_lm.model.config  # the model card's shape
    assert (c.model_type, c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
            c.head_dim, c.sliding_window, c.vocab_size, c.tie_word_embeddings) == (
        "gemma3_text", 18, 640, 4, 1, 256, 512, 262_144, True)
    assert c.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert gemma3_lm.dequantized_from == "Q4_K_M (Q4_K, Q5_0, Q6_K, Q8_0)"


def test_gemma_trace_equals_transformers(gemma3_lm, gemma3_hf):
    ids = engine.encode(gemma3_lm, ["The capital of Germany is"], bos=True)[0].ids
    assert ids[0] == 2  # Gemma's BOS
    # the same attention kernel as anatomy's model (sdpa) for this one comparison
    gemma3_hf.set_attn_implementation("sdpa")
    try:
        want = _hidden_states_close(gemma3_lm, gemma3_hf, ids)
    finally:
        gemma3_hf.set_attn_implementation("eager")
    assert int(want.logits[0, -1].argmax()) == int(engine.run(gemma3_lm, [engine.attention.encode_ids(
        gemma3_lm, ids)], ["logits"])[0].logits[-1].argmax())


def test_gemma_attention_past_the_sliding_window_equals_eager(gemma3_lm, gemma3_hf):
    """The header's window (512) is read; the attention past a window is checked with both models' window set to
    32 for the test (transformers builds the sliding mask from ``config.sliding_window`` at each forward), so
    that a prompt of ~90 tokens reaches past it: the same code path as 600 tokens past 512, at a tenth of the cost
    (the 262k-row LM head dominates)."""
    config = gemma3_lm.model.config
    assert config.sliding_window == 512 and "sliding_attention" in config.layer_types
    assert gemma3_hf.config._attn_implementation == "eager"
    text = " ".join(f"Item {i} is on shelf {i % 7}." for i in range(12))
    ids = engine.encode(gemma3_lm, [text], bos=True)[0].ids
    assert len(ids) > 80
    configs = (config, gemma3_hf.config)
    try:
        for c in configs:
            c.sliding_window = 32
        # A wrong window (full attention, or none) changes positions past 32 by O(1) of the layer's scale.
        want = _hidden_states_close(gemma3_lm, gemma3_hf, ids, atol=1e-4, relative=True)
        for c in configs:
            c.sliding_window = 4096                     # no window within the prompt: the test can fail
        with torch.no_grad():
            full = gemma3_hf(torch.tensor([ids]), output_hidden_states=True)
    finally:
        for c in configs:
            c.sliding_window = 512
    late = (torch.stack(want.hidden_states) - torch.stack(full.hidden_states))[1:-1, 0, 40:]
    assert float(late.abs().amax()) > 1e-2 * float(torch.stack(full.hidden_states).abs().amax())


def test_gemma_params_from_the_header_equal_the_dequantized_model(gemma3_gguf, gemma3_lm):
    result = runner.invoke(app, ["params", str(gemma3_gguf), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["total"] == sum(p.numel() for p in gemma3_lm.model.parameters()) == 268_098_176
    assert data["read_from"] == "gguf_header"


def test_device_map_goes_through_transformers_and_gives_the_same_weights(tiny_gguf):
    """A placement is transformers' from_pretrained(gguf_file=...) with anatomy's config: the same weights as the
    streamed load."""
    streamed = engine.load(str(tiny_gguf), device="cpu")
    placed = engine.load(str(tiny_gguf), device_map="auto")
    a, b = dict(streamed.model.named_parameters()), dict(placed.model.named_parameters())
    assert sorted(a) == sorted(b) and all(torch.equal(a[n], b[n]) for n in a)
    assert placed.dequantized_from == streamed.dequantized_from == "F32"


def test_verify_against_llamacpp_on_gemma(gemma3_lm, gemma3_gguf, fixed_load):
    """`verify --against llama.cpp` on the real Gemma 3 file (issue 37): llama.cpp's own forward of the same ids
    agrees within the documented tolerances (docs/commands/verify.md). Here because gemma3_lm is loaded here."""
    from anatomy_cli.analyses.verify import llamacpp

    why = llamacpp.unusable(str(gemma3_gguf))
    if why is not None:
        pytest.skip(why)
    fixed_load(gemma3_lm)
    out = runner.invoke(app, ["verify", "--model", str(gemma3_gguf), "--device", "cpu", "--against", "llama.cpp",
                              "--format", "json"])
    assert out.exit_code == 0, out.stderr
    section = json.loads(out.stdout)["sections"][-1]
    assert section["name"] == "llama.cpp" and section["status"] == "passed", section
    kl = [c for c in section["checks"] if "kl" in json.dumps(c).lower()]
    assert kl, section  # the KL rows were measured, not skipped
