"""`anatomy diff` on tiny random models: weights tensor by tensor, activations layer by layer.

Reference figures are computed here independently: numpy on the safetensors files for the weights,
transformers' own forward (``output_hidden_states``, logits) for the activations.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()
PROMPT = "Thank you very"  # GPT-2 ids [10449, 345, 845]


def invoke(*args, input=None):
    return runner.invoke(app, ["diff", *map(str, args)], input=input)


def diff_json(*args, input=None):
    result = invoke(*args, "--device", "cpu", "--format", "json", input=input) if len(args) > 2 else \
        invoke(*args, "--format", "json", input=input)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


@pytest.fixture(scope="session")
def llama_seed1(tmp_path_factory) -> Path:
    """The tiny llama of tests/models.py with other random weights (seed 1): the same shape, other values."""
    import conftest
    import models

    out = tmp_path_factory.mktemp("tiny-llama-seed1")
    models.build_model("llama", seed=1).save_pretrained(out)
    conftest.build_gpt2_tokenizer().save_pretrained(out)
    return out


# ---------------------------------------------------------------- weights

def _component(name: str) -> tuple[int | None, str]:
    """The llama family's grouping, written out here independently of the params rules."""
    m = re.match(r"model\.layers\.(\d+)\.", name)
    layer = int(m.group(1)) if m else None
    if "self_attn" in name:
        return layer, "attention"
    if ".mlp." in name:
        return layer, "ffn"
    if "embed_tokens" in name:
        return layer, "token_embedding"
    if name.startswith("lm_head"):
        return layer, "lm_head"
    return layer, "norm_other"


def _numpy_rows(dir_a: Path, dir_b: Path) -> dict[tuple[int | None, str], dict[str, float]]:
    from safetensors.numpy import load_file

    a, b = load_file(str(dir_a / "model.safetensors")), load_file(str(dir_b / "model.safetensors"))
    groups: dict = {}
    for name in a:
        groups.setdefault(_component(name), []).append(name)
    out = {}
    for key, names in groups.items():
        x = np.concatenate([a[n].astype(np.float64).ravel() for n in names])
        y = np.concatenate([b[n].astype(np.float64).ravel() for n in names])
        out[key] = {"rel_change": np.linalg.norm(y - x) / np.linalg.norm(x),
                    "cosine": float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y))),
                    "max_abs_delta": float(np.abs(y - x).max()), "n_params": x.size, "n_tensors": len(names)}
    return out


def test_weights_of_a_model_against_itself_are_exactly_equal(tiny_model_dir):
    d = tiny_model_dir("llama")
    data = diff_json(d, d)
    assert data["mode"] == "weights" and data["rows"]
    for row in data["rows"] + [data["total"]]:
        assert (row["rel_change"], row["cosine"], row["max_abs_delta"]) == (0.0, 1.0, 0.0), row
    assert data["total"]["n_params"] == sum(t["n_params"] for t in data["tensors"])


def test_weights_against_other_random_weights_equal_numpy_on_the_files(tiny_model_dir, llama_seed1):
    d = tiny_model_dir("llama")
    data = diff_json(d, llama_seed1)
    reference = _numpy_rows(d, llama_seed1)
    assert {(r["layer"], r["component"]) for r in data["rows"]} == set(reference)
    for row in data["rows"]:
        ref = reference[(row["layer"], row["component"])]
        assert row["rel_change"] == pytest.approx(ref["rel_change"], rel=1e-12)
        assert row["cosine"] == pytest.approx(ref["cosine"], abs=1e-12)
        assert row["max_abs_delta"] == ref["max_abs_delta"]
        assert (row["n_params"], row["n_tensors"]) == (ref["n_params"], ref["n_tensors"])
        assert row["b_types"] == ["F32"]
        if row["component"] != "norm_other":  # norms start at 1 in both: unchanged
            assert 1.0 < row["rel_change"] < 2.0  # two independent random draws: about sqrt(2)
    # the blocks in order, each block's components in the params order, then embedding, final norm, head
    assert [(r["layer"], r["component"]) for r in data["rows"]][:3] == [(0, "attention"), (0, "ffn"),
                                                                        (0, "norm_other")]
    assert [r["component"] for r in data["rows"] if r["layer"] is None] == ["token_embedding", "norm_other",
                                                                            "lm_head"]


def test_a_tied_head_is_compared_once(tiny_model_dir):
    d = tiny_model_dir("gpt2")  # lm_head is wte
    data = diff_json(d, d)
    assert data["tied_head"] is True
    names = [t["name"] for t in data["tensors"]]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    assert not any(n.endswith((".attn.bias", ".attn.masked_bias")) for n in names)  # buffers are not weights


def test_a_tied_head_against_an_untied_one_is_the_embedding(tiny_model_dir, tmp_path):
    import models
    from safetensors.numpy import load_file
    from transformers import GPT2Config
    from transformers import GPT2LMHeadModel

    torch.manual_seed(3)
    untied = GPT2LMHeadModel(GPT2Config(**models.config_kwargs("gpt2"), tie_word_embeddings=False))
    untied.save_pretrained(tmp_path)
    tied = tiny_model_dir("gpt2")
    data = diff_json(tied, tmp_path)
    assert data["tied_head"] is False
    [head] = [r for r in data["rows"] if r["component"] == "lm_head"]
    a, b = load_file(str(tied / "model.safetensors")), load_file(str(tmp_path / "model.safetensors"))
    x, y = a["transformer.wte.weight"].astype(np.float64), b["lm_head.weight"].astype(np.float64)
    assert head["rel_change"] == pytest.approx(np.linalg.norm(y - x) / np.linalg.norm(x), rel=1e-12)
    assert head["n_tensors"] == 1 and head["layer"] is None


def test_different_architectures_or_shapes_fail_in_one_line(tiny_model_dir, tmp_path):
    result = invoke(tiny_model_dir("llama"), tiny_model_dir("gpt2"))
    assert result.exit_code == 2
    # Told from the two headers, before any tensor is listed (issue 42 item 4).
    assert error_lines(result) == [
        f"error: {tiny_model_dir('llama').name} is a llama model and {tiny_model_dir('gpt2').name} a gpt2 model "
        f"(from their headers): the two models differ in architecture"]
    import models
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    wider = LlamaForCausalLM(LlamaConfig(**{**models.config_kwargs("llama"), "intermediate_size": 80}))
    wider.save_pretrained(tmp_path)
    result = invoke(tiny_model_dir("llama"), tmp_path)
    assert result.exit_code == 2
    assert error_lines(result) == [f"error: model.layers.0.mlp.down_proj.weight: shape [32, 64] in "
                                   f"{tiny_model_dir('llama')}, [32, 80] in {tmp_path}: the two models differ "
                                   f"in shape"]


def test_usage_errors(tiny_model_dir, tmp_path):
    d = tiny_model_dir("llama")
    result = invoke(d, d, PROMPT, "--weights")
    assert result.exit_code == 2 and error_lines(result) == [
        "error: --weights compares the files and takes no PROMPT; drop one of them"]
    result = invoke(d, d, "--target", " much")
    assert result.exit_code == 2 and error_lines(result) == [
        "error: --target needs a PROMPT (it compares next-token probabilities)"]
    result = invoke(d, d, PROMPT, "--position", "3", "--device", "cpu")
    assert result.exit_code == 2 and error_lines(result) == [
        "error: --position 3 is out of range: the prompt has 3 tokens (use 0..2, or -3..-1 from the end)"]
    bert = tiny_model_dir("bert")
    result = invoke(bert, bert, PROMPT, "--device", "cpu")
    assert result.exit_code == 2 and len(error_lines(result)) == 1 and error_lines(result)[0].endswith(
        " is an encoder (bert), not a next-token predictor: `diff` needs a decoder-only model such as "
        "gpt2 (`trace`, `lens` and `attn` work with encoders)")  # the one wording (models.capabilities)
    result = invoke(d, tmp_path / "missing")
    assert result.exit_code != 0 and len(error_lines(result)) == 1
    result = invoke(d, "gpt2", "--format", "json")  # not cached here, and a preset has no weight files
    assert result.exit_code == 1 and len(error_lines(result)) == 1 and result.stdout == ""


def test_weights_plot_and_table(tiny_model_dir, llama_seed1, tmp_path):
    png = tmp_path / "w.png"
    result = invoke(tiny_model_dir("llama"), llama_seed1, "--plot", png, "--format", "tsv")
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header, *rows = result.stdout.strip().splitlines()
    assert header.split("\t") == ["layer", "component", "n_tensors", "n_params", "rel_change", "cosine",
                                  "max_abs_delta", "b_types"]
    assert rows[-1].split("\t")[1] == "total"


# ---------------------------------------------------------------- activations

def _hf_reference(arch_dir: Path, ids: list[int]):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(arch_dir).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    return [h[0].double() for h in out.hidden_states], torch.log_softmax(out.logits[0, -1].double(), -1)


@pytest.mark.usefixtures("cached_load")  # each tiny model loads once
def test_activations_against_itself_are_identical(tiny_model_dir):
    d = tiny_model_dir("llama")
    data = diff_json(d, d, PROMPT, "--target", " much")
    assert data["mode"] == "activations" and data["token_ids"] == [10449, 345, 845]
    for row in data["layers"]:
        assert row["cos"] == pytest.approx(1.0, abs=1e-12) and row["cos_mean"] == pytest.approx(1.0, abs=1e-12)
        assert (row["rel_delta"], row["lens_kl_nats"], row["lens_agree"]) == (0.0, 0.0, True)
    assert data["kl_nats"] == 0.0 and data["a_top1_rank_in_b"] == 1
    assert data["top_a"] == data["top_b"] and data["target_a"] == data["target_b"]


@pytest.mark.usefixtures("cached_load")  # each tiny model loads once
def test_activations_equal_transformers_hidden_states_of_both_models(tiny_model_dir, llama_seed1):
    d = tiny_model_dir("llama")
    data = diff_json(d, llama_seed1, PROMPT, "--target", " much", "--k", "3")
    ids = data["token_ids"]
    ha, la = _hf_reference(d, ids)
    hb, lb = _hf_reference(llama_seed1, ids)
    cos = torch.nn.functional.cosine_similarity
    # rows named embed, 0..L-1: the row named N is block N's output, transformers' hidden_states[N + 1]
    # (transformers' last hidden state is after the final norm; the engine's last row is before it)
    assert [r["layer"] for r in data["layers"]] == ["embed", *range(len(ha) - 1)]
    by_name = {r["layer"]: r for r in data["layers"]}
    for layer in range(len(ha) - 1):
        row = by_name["embed" if layer == 0 else layer - 1]
        assert row["cos"] == pytest.approx(float(cos(ha[layer][-1], hb[layer][-1], dim=0)), abs=1e-5)
        assert row["cos_mean"] == pytest.approx(float(cos(ha[layer], hb[layer], dim=-1).mean()), abs=1e-5)
        rel = float((ha[layer][-1] - hb[layer][-1]).norm() / ha[layer][-1].norm())
        assert row["rel_delta"] == pytest.approx(rel, rel=1e-5)
        assert row["rel_delta"] > 0.5  # independent random weights differ at every layer
    kl = float((la.exp() * (la - lb)).sum())
    assert data["kl_nats"] == pytest.approx(kl, rel=1e-4) and data["kl_nats"] > 0
    assert data["layers"][-1]["lens_kl_nats"] == pytest.approx(kl, rel=1e-4)  # the lens at L is the output
    assert [t["token_id"] for t in data["top_a"]] == torch.topk(la, 3).indices.tolist()
    assert [t["token_id"] for t in data["top_b"]] == torch.topk(lb, 3).indices.tolist()
    top1 = int(la.argmax())
    assert data["a_top1_rank_in_b"] == int((lb > lb[top1]).sum()) + 1
    assert data["target_a"]["probability"] == pytest.approx(float(la[881].exp()), rel=1e-5)
    assert data["target_b"]["probability"] == pytest.approx(float(lb[881].exp()), rel=1e-5)


def test_a_is_freed_before_b_loads(tiny_model_dir, llama_seed1, monkeypatch):
    """Issue 51 item 13: at B's load nothing of A is alive (its LoadedModel, its model, any of its parameters: what
    A leaves is the residual stream and the lens, copies), and A's pages have been handed back to the system."""
    from anatomy_cli.engine import loader
    from anatomy_cli.engine.loader import DIRECT
    from anatomy_cli.engine.loader import using_loader

    events: list[str] = []
    alive_at_b: list[int] = []
    refs: list[weakref.ref] = []

    class Watching:  # opens as usual; at B's weights, count what is still alive of A
        open = staticmethod(DIRECT.open)

        @staticmethod
        def load_weights(opened):
            if refs:
                alive_at_b.append(sum(r() is not None for r in refs))
            events.append(f"load {opened.spec.model}")
            lm = DIRECT.load_weights(opened)
            if not refs:
                refs.extend(weakref.ref(x) for x in (lm, lm.model, *lm.model.parameters()))
            return lm

    release = loader.release_memory
    monkeypatch.setattr(loader, "release_memory", lambda: (events.append("release"), release()))
    with using_loader(Watching()):
        data = diff_json(tiny_model_dir("llama"), llama_seed1, PROMPT)
    assert data["layers"] and len(refs) > 2
    assert alive_at_b == [0], f"{alive_at_b} objects of model A (LoadedModel, model, parameters) alive at B's load"
    assert events == [f"load {tiny_model_dir('llama')}", "release", f"load {llama_seed1}"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim: Linux only")
def test_release_memory_hands_freed_heap_pages_back():
    """What diff does between A and B: blocks freed inside the heap (below glibc's mmap threshold, as a GGUF
    model's dequantized tensors leave them) stay in the process's RSS until release_memory. Own process."""
    code = """if True:
        import sys
        from anatomy_cli.engine.loader import release_memory

        def rss():
            return next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))

        blocks = [bytearray(b"x" * 65536) for _ in range(4096)]   # 256 MiB in 64 KiB heap blocks, touched
        kept = blocks[::64]                                       # a few stay: the heap cannot shrink from the top
        del blocks
        freed = rss()
        release_memory()
        print(freed - rss(), freed)
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    dropped, before = map(int, out.stdout.split())
    assert dropped > 128 * 1024, (dropped, before)   # KiB: most of the 252 MiB freed left the RSS


@pytest.mark.usefixtures("cached_load")  # each tiny model loads once
def test_stdin_prompts_and_different_tokenizers(tiny_model_dir, tmp_path):
    import shutil

    d = tiny_model_dir("llama")
    data = diff_json(d, d, "-", input="Thank you very\nThe cat\n")
    assert [r["prompt"] for r in data["results"]] == ["Thank you very", "The cat"]
    # llama weights with BERT's WordPiece tokenizer: the same text gives other ids
    other = tmp_path / "other-tokenizer"
    shutil.copytree(d, other)
    for f in other.iterdir():
        if f.name.startswith(("tokenizer", "vocab", "merges", "special_tokens")):
            f.unlink()
    import models

    models.bert_tokenizer().save_pretrained(other)
    result = invoke(d, other, "Thank you", "--device", "cpu")
    assert result.exit_code == 2
    [line] = error_lines(result)
    assert line.startswith(f"error: the two tokenizers split the prompt differently: {d}: Thank(10449) ·you(345); "
                           f"{other}: ")


@pytest.mark.usefixtures("cached_load")  # each tiny model loads once
def test_activations_plot(tiny_model_dir, llama_seed1, tmp_path):
    png = tmp_path / "a.png"
    result = invoke(tiny_model_dir("llama"), llama_seed1, PROMPT, "--device", "cpu", "--plot", png)
    assert result.exit_code == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_activations_of_another_width_fail_before_b_loads(tiny_model_dir, tmp_path):
    import conftest
    import models
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    d = tiny_model_dir("llama")
    LlamaForCausalLM(LlamaConfig(**{**models.config_kwargs("llama"), "hidden_size": 48})).save_pretrained(tmp_path)
    conftest.build_gpt2_tokenizer().save_pretrained(tmp_path)
    result = invoke(d, tmp_path, PROMPT, "--device", "cpu")
    assert result.exit_code == 2
    assert error_lines(result) == [f"error: the residual streams differ in shape: {d} has {models.LAYERS} layers of "
                                   f"width 32, {tmp_path} {models.LAYERS} of width 48"]


def test_padded_lm_heads_compare_over_the_shared_rows(tiny_model_dir, tmp_path):
    """50,257 and 50,304 rows, one tokenizer (issue 41 item 6): KL over the shared rows, mass on the extra ones."""
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    d = tiny_model_dir("llama")
    model = AutoModelForCausalLM.from_pretrained(d)
    torch.manual_seed(3)
    model.resize_token_embeddings(50304, mean_resizing=False)
    with torch.no_grad():
        model.lm_head.weight[50257:].normal_(0, 0.2)  # the padding rows carry some probability
        model.model.layers[0].mlp.down_proj.weight.mul_(1.5)  # and the shared rows differ too
    padded = tmp_path / "padded"
    model.save_pretrained(padded)
    AutoTokenizer.from_pretrained(d).save_pretrained(padded)
    data = diff_json(d, padded, PROMPT, "--k", "3")
    _, la = _hf_reference(d, data["token_ids"])
    _, lb = _hf_reference(padded, data["token_ids"])
    assert la.shape[0] == 50257 and lb.shape[0] == 50304
    extra_b = float(lb[50257:].exp().sum())
    assert data["shared_rows"] == 50257 and data["extra_mass_a"] == 0.0
    assert data["extra_mass_b"] == pytest.approx(extra_b, rel=1e-5) and extra_b > 1e-4
    shared = lb[:50257] - torch.logsumexp(lb[:50257], 0)
    kl = float((la.exp() * (la - shared)).sum())
    assert data["kl_nats"] == pytest.approx(kl, rel=1e-4) and kl > 0
    assert [t["token_id"] for t in data["top_b"]] == torch.topk(lb[:50257], 3).indices.tolist()
    assert data["top_b"][0]["probability"] == pytest.approx(float(lb[:50257].max().exp()), rel=1e-5)
    table = invoke(d, padded, PROMPT, "--device", "cpu", "--format", "table")
    assert table.exit_code == 0 and "the LM heads differ in size" in table.stdout
