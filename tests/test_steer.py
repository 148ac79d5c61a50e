"""`anatomy steer`: the vector against a hand computation from transformers' output_hidden_states, repeng's PCA
against scikit-learn's, the llama.cpp control-vector GGUF read back with gguf's reader, and (where
llama-cpp-python is installed) the same file applied in llama.cpp to the same SmolLM2 GGUF."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses.steering import directions
from anatomy_cli.cli.main import app
from anatomy_cli.engine import steering
from anatomy_cli.errors import UsageError

runner = CliRunner()
POS = ["I love this so much", "What a joy it is"]
NEG = ["I hate this so much", "What a pain it is"]


def invoke(*args):
    return runner.invoke(app, list(args))


def _sides(flag_pos=POS, flag_neg=NEG):
    return [a for p in flag_pos for a in ("--positive", p)] + [a for n in flag_neg for a in ("--negative", n)]


def _hidden(model, tok, text: str, layer: int, reduce: str) -> torch.Tensor:
    with torch.no_grad():
        hs = model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states
    h = hs[layer + 1][0].double()  # hidden_states[l + 1] is block l's output (before the final norm unless last)
    return h[-1] if reduce == "last" else h.mean(0)


@pytest.mark.parametrize("reduce", ["last", "mean"])
def test_vector_is_the_mean_difference_of_output_hidden_states(tiny_model_dir, tiny_lm, cached_load, tmp_path,
                                                               reduce):
    model_dir = tiny_model_dir("llama")
    out = tmp_path / "v.safetensors"
    result = invoke("steer", "-m", str(model_dir), *_sides(), "--layer", "0", "--reduce", reduce,
                    "--out", str(out), "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    lm = tiny_lm("llama")
    tok = lm.tokenizer.hf
    want = (torch.stack([_hidden(lm.model, tok, t, 0, reduce) for t in POS]).mean(0)
            - torch.stack([_hidden(lm.model, tok, t, 0, reduce) for t in NEG]).mean(0))
    vector = steering.load(out)
    torch.testing.assert_close(vector.directions[0].double(), want, atol=1e-5, rtol=0)
    assert data["layers"][0]["norm"] == pytest.approx(float(want.norm()), rel=1e-5)
    assert vector.meta["model"] == {"name": model_dir.name, "model_type": "llama", "n_layers": 2, "d_model": 32}
    assert vector.meta["site"] == "resid_post" and vector.meta["reduce"] == reduce
    assert vector.meta["positive"] == POS and vector.meta["norms"]["0"] == pytest.approx(float(want.norm()),
                                                                                          rel=1e-5)


def test_pca_is_sklearns_first_component_with_repengs_sign():
    from sklearn.decomposition import PCA

    g = torch.Generator().manual_seed(0)
    pos = torch.randn(6, 1, 16, generator=g, dtype=torch.float64) + 2.0
    neg = torch.randn(6, 1, 16, generator=g, dtype=torch.float64)
    (d,) = directions(pos, neg, [3], "pca")
    diff = (pos - neg)[:, 0].numpy()
    ref = PCA(n_components=1, whiten=False).fit(diff).components_[0]
    if np.mean((pos[:, 0].numpy() @ ref) < (neg[:, 0].numpy() @ ref)) > 0.5:
        ref = -ref
    np.testing.assert_allclose(d.vector.numpy(), ref, atol=1e-10)
    assert d.norm == pytest.approx(1.0) and d.layer == 3
    (m,) = directions(pos, neg, [3], "mean")
    np.testing.assert_allclose(m.vector.numpy(), pos[:, 0].mean(0).numpy() - neg[:, 0].mean(0).numpy())


def test_control_vector_gguf_reads_back_and_steers_like_the_safetensors(tiny_model_dir, cached_load, tmp_path):
    import gguf

    model = str(tiny_model_dir("llama"))
    out, cv = tmp_path / "v.safetensors", tmp_path / "v.gguf"
    result = invoke("steer", "-m", model, *_sides(), "--layer", "1", "--out", str(out),
                    "--save-control-vector", str(cv))
    assert result.exit_code == 0, result.output
    assert "--control-vector-scaled" in result.output and "--control-vector-layer-range 1 1" in result.output
    assert "Ollama Modelfile (released Ollama does NOT apply control vectors" in result.output
    assert "  FROM MODEL.gguf" in result.output and "ollama/ollama#8148 (open, unmerged)" in result.output
    reader = gguf.GGUFReader(str(cv))
    field = reader.get_field("general.architecture")
    assert bytes(field.parts[field.data[0]]).decode() == "controlvector"
    hint = reader.get_field("controlvector.model_hint")
    assert bytes(hint.parts[hint.data[0]]).decode() == "llama"
    assert int(reader.get_field("controlvector.layer_count").parts[-1][0]) == 1
    assert [(t.name, tuple(int(x) for x in t.shape)) for t in reader.tensors] == [("direction.1", (32,))]
    np.testing.assert_array_equal(np.asarray(reader.tensors[0].data),
                                  steering.load(out).directions[1].numpy())
    runs = [json.loads(invoke("generate", "I think", "-m", model, "--max-new-tokens", "2", "--steer", str(f), "--coef", "4",
                              "--format", "json").stdout)["steps"] for f in (out, cv)]
    assert runs[0] == runs[1]


def test_usage_errors(tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("llama"))
    bad_pairs = tmp_path / "pairs.tsv"
    bad_pairs.write_text("only one side\n")
    cases = [
        ([*_sides(), "--layer", "5"], "blocks 0..1"),
        ([*_sides(), "--layer", "x"], "--layer"),
        ([*_sides(NEG[:1]), "--layer", "1", "--method", "pca"], "needs pairs"),
        (["--positive", "a", "--layer", "1"], "give both sides"),
        (["--pairs", str(bad_pairs), "--layer", "1"], "POSITIVE<TAB>NEGATIVE"),
        ([*_sides(), "--layer", "0", "--save-control-vector", str(tmp_path / "x.gguf")], "layer 0"),
    ]
    for args, text in cases:
        result = invoke("steer", "-m", model, *args)
        assert result.exit_code == 2, (args, result.output)
        line = result.output.strip().splitlines()[-1]
        assert line.startswith("error: ") and text in line, (args, line)


# ---------------------------------------------------------------- llama.cpp round trip (SmolLM2)

SENTIMENT_POS = ["I love this. It is wonderful", "What a happy, joyful day", "This is great, I am delighted"]
SENTIMENT_NEG = ["I hate this. It is terrible", "What a sad, miserable day", "This is awful, I am furious"]


def test_llama_cpp_applies_the_control_vector_as_anatomy_does(smollm2_gguf, smollm2_lm, tmp_path):
    from anatomy_cli.analyses.verify.llamacpp import unusable

    why = unusable(str(smollm2_gguf))  # a build this CPU cannot run dies with SIGILL: only in a child process
    if why is not None:
        pytest.skip(why)
    import llama_cpp

    from anatomy_cli.analyses.generate import kl
    from anatomy_cli.engine import control_vector
    from anatomy_cli.engine.generate import generate
    from anatomy_cli.engine.steering import SteeringVector
    from anatomy_cli.tasks.steer import make

    lm, layer, coef = smollm2_lm, 15, 8.0
    enc = lm.tokenizer.encode(SENTIMENT_POS + SENTIMENT_NEG)
    vector, _ = make(lm, enc[:3], enc[3:], [layer], "resid_post", "last", "mean", 8, SENTIMENT_POS, SENTIMENT_NEG)
    path = tmp_path / "joy.gguf"
    control_vector.write({k: coef * v.numpy() for k, v in vector.directions.items()}, path, model_hint="llama")
    ids = lm.tokenizer.hf("Today I feel")["input_ids"]
    ours = {c: generate(lm, ids, max_new_tokens=1, hooks=vector.hooks(c)).logits[0] for c in (0.0, coef)}

    def llama_logits(cvec: bool) -> torch.Tensor:
        # logits_all: llama-cpp-python 0.3.x keeps llm.scores only then (sampling happens inside its sampler)
        llm = llama_cpp.Llama(model_path=str(smollm2_gguf), n_ctx=64, logits_all=True, verbose=False, seed=0)
        if cvec:
            written, _ = control_vector.read(path)  # the file's direction.N, as llama_control_vector_load reads it
            data = np.zeros(lm.d_model * (lm.n_layers - 1), dtype=np.float32)  # layers 1..n-1, layer 1 first
            for n, d in written.items():
                data[(n - 1) * lm.d_model:n * lm.d_model] = d
            # llama.h's name since 0.3.3x; llama_apply_adapter_cvec before that (now a deprecated wrapper)
            apply = getattr(llama_cpp, "llama_set_adapter_cvec", None) or llama_cpp.llama_apply_adapter_cvec
            rc = apply(llm.ctx, data.ctypes.data_as(llama_cpp.ctypes.POINTER(llama_cpp.ctypes.c_float)),
                       data.size, lm.d_model, 1, lm.n_layers - 1)
            assert rc == 0
        llm.eval(ids)
        return torch.tensor(np.asarray(llm.scores[len(ids) - 1]), dtype=torch.float64)

    theirs = {0.0: llama_logits(False), coef: llama_logits(True)}
    base_kl = kl(ours[0.0], theirs[0.0])
    steered_kl = kl(ours[coef], theirs[coef])
    assert int(ours[coef].argmax()) == int(theirs[coef].argmax())
    assert kl(ours[coef], ours[0.0]) > 10 * max(base_kl, 1e-4)   # the vector moves the distribution
    assert steered_kl < 5 * max(base_kl, 1e-3)                   # and llama.cpp moves it the same way
    # the numbering: the same vector one block later in anatomy is much further from llama.cpp's direction.L
    shifted = SteeringVector({layer + 1: vector.directions[layer]}, site="resid_post")
    off_by_one = generate(lm, ids, max_new_tokens=1, hooks=shifted.hooks(coef)).logits[0]
    assert kl(off_by_one, theirs[coef]) > 10 * steered_kl


def test_usage_errors_come_before_the_weights(tiny_model_dir, tmp_path, monkeypatch):
    # Issue 47 / 51 item 4: what needs no weights is refused before they load.
    from anatomy_cli.cli.commands import steer as command

    def refuse(*_a, **_k):
        raise AssertionError("the weights were loaded before the usage error")
    monkeypatch.setattr(command, "load_weights", refuse)
    model = str(tiny_model_dir("llama"))
    cases = [
        ([*_sides(), "--layer", "1", "--out", str(tmp_path / "no" / "v.safetensors")], "no such directory"),
        ([*_sides(), "--layer", "0", "--save-control-vector", str(tmp_path / "x.gguf")], "layer 0"),
        ([*_sides(), "--layer", "1", "--site", "attn_out", "--save-control-vector", str(tmp_path / "x.gguf")],
         "resid_post"),
        ([*_sides(), "--layer", "5"], "blocks 0..1"),
        ([*_sides(), "--layer", "1", "--site", "head"], "--site 'head'"),
    ]
    for args, text in cases:
        result = invoke("steer", "-m", model, *args)
        assert result.exit_code == 2, (args, result.output)
        line = result.output.strip().splitlines()[-1]
        assert line.startswith("error: ") and text in line, (args, line)
    result = invoke("steer", "-m", str(tiny_model_dir("bert")), *_sides(), "--layer", "1")
    assert result.exit_code == 2 and "`steer` needs a decoder-only model" in result.output, result.output


def test_a_string_is_one_prompt(tiny_model_dir, tiny_lm, cached_load):
    # anatomy.steer(lm, positive="I love it", negative="I hate it") takes each string as one prompt (issue 51
    # item 5); the direction is the difference of the two prompts' last-token outputs of block 0 (HF's
    # hidden_states[1]).
    import anatomy_cli as anatomy

    got = anatomy.steer(str(tiny_model_dir("llama")), positive="I love it", negative="I hate it", layer=[0])
    assert got.to_dict()["n_positive"] == got.to_dict()["n_negative"] == 1
    lm = tiny_lm("llama")
    want = _hidden(lm.model, lm.tokenizer.hf, "I love it", 0, "last") - _hidden(lm.model, lm.tokenizer.hf,
                                                                               "I hate it", 0, "last")
    torch.testing.assert_close(got.result.vector.directions[0].double(), want, atol=1e-5, rtol=0)


def test_the_llama_cpp_line_names_the_gguf_behind_the_spec(tiny_model_dir):
    # (issue 47 e) the .gguf behind an ollama:/lmstudio:/packaged name is ModelInfo.source, set by engine.open
    import dataclasses
    import types

    from anatomy_cli.engine import open_model
    from anatomy_cli.tasks import steer as task

    opened = open_model(str(tiny_model_dir("llama")))
    opts = task.SteerOptions(positive=POS, negative=NEG, layer="1")
    assert task.check(opened, opts).gguf_model == "MODEL.gguf"  # a directory: no .gguf to name
    blob = "/home/u/.ollama/models/blobs/sha256-0123"  # a GGUF file without the suffix
    behind = types.SimpleNamespace(info=dataclasses.replace(opened.info, source=blob), name="ollama:smollm2")
    assert task.check(behind, opts).gguf_model == blob


def test_a_control_vector_with_direction_0_is_refused(tmp_path):
    # issue 51 item 5: llama.cpp keeps no vector for layer 0 and refuses such a file; so does `generate --steer`
    import gguf

    path = tmp_path / "zero.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", "llama")
    writer.add_uint32("controlvector.layer_count", 2)
    for layer in (0, 1):
        writer.add_tensor(f"direction.{layer}", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UsageError, match="has a direction.0"):
        steering.load(path)
