"""One description of a model (anatomy_cli.models.info.ModelInfo), opened before the weights load.

The crashes it fixed: RoBERTa's position offset (514 position rows hold 512 tokens) ignored by the check before
the weights, and multimodal Gemma 3 directories (the decoder's sizes nested under ``text_config``) ending in
AttributeError in lens / next / ablate / drift with the context check skipped. Expected values come from
transformers' own config objects and a forward, not from ModelInfo.
"""

from __future__ import annotations

import json
import sys

import models
import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def _words(n: int) -> str:
    """A text GPT-2's BPE splits into exactly ``n`` tokens ("a" then " a" n-1 times)."""
    return "a" + " a" * (n - 1)


# ---------------------------------------------------------------- ModelInfo against transformers' configs

@pytest.mark.parametrize("arch", ["gpt2", "llama", "roberta", "gemma3_mm", "bert"])
def test_info_equals_transformers_config_and_model(arch, tiny_model_dir):
    import transformers

    from anatomy_cli.engine.opening import open_exact
    from anatomy_cli.engine.opening import open_model
    from anatomy_cli.models.spec import ModelSpec

    d = tiny_model_dir(arch)
    spec = ModelSpec(str(d), device="cpu")
    exact = open_exact(spec).info
    config = transformers.AutoConfig.from_pretrained(d)
    text = config.get_text_config()
    assert exact.n_layers == text.num_hidden_layers == models.LAYERS
    assert exact.d_model == text.hidden_size == models.D
    assert exact.lm_head_rows == text.vocab_size
    offset = 2 if arch == "roberta" else 0  # RoBERTa: positions start at pad_token_id + 1
    assert exact.n_ctx == text.max_position_embeddings - offset == models.CTX
    assert exact.is_causal == (arch not in models.ENCODERS)
    # The light open (config.json as JSON, no transformers) says the same where it answers.
    assert open_model(spec).info == exact


def test_loaded_model_reads_the_opened_info(tiny_model_dir):
    from anatomy_cli import engine

    opened = engine.open_model(str(tiny_model_dir("gemma3_mm")), device="cpu")
    lm = engine.load_weights(opened)
    assert lm.info == opened.info
    blocks = lm.model.base_model.get_submodule(lm.adapter.blocks)
    assert lm.n_layers == len(blocks)  # the config's count is the module list's
    assert lm.vocab_size == lm.model.get_output_embeddings().weight.shape[0]
    assert lm.d_model == lm.model.get_input_embeddings().weight.shape[1]
    assert lm.n_ctx == opened.n_ctx == models.CTX
    with pytest.raises(AttributeError):  # read from info, never set beside it
        lm.n_layers = 7
    assert lm.n_layers == len(blocks)


def test_an_attribute_from_info_names_a_field_of_model_info():
    from anatomy_cli.models.info import FromInfo

    with pytest.raises((TypeError, RuntimeError)) as caught:  # Python < 3.12 wraps it in a RuntimeError
        type("Holder", (), {"n_blocks": FromInfo[int]()})
    assert "ModelInfo has no field n_blocks" in str(caught.value.__cause__ or caught.value)


def test_open_is_torch_free_for_a_directory(tiny_model_dir):
    import subprocess

    code = ("import sys; from anatomy_cli import engine; o = engine.open_model(sys.argv[1]); "
            "print(o.light, o.info.n_ctx, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir("gpt2"))], capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["True", str(models.CTX), "False"]


# ---------------------------------------------------------------- RoBERTa at its real limit

def test_roberta_prompt_at_the_limit_runs_and_one_past_is_a_usage_error(tiny_model_dir, cached_load):
    d = tiny_model_dir("roberta")
    at_limit = _words(models.CTX - 2)  # + <s> and </s> = CTX tokens
    code, out, err = invoke("trace", at_limit, "--model", d, "--device", "cpu", "-f", "json")
    assert code == 0, err
    assert len(json.loads(out)["token_ids"]) == models.CTX
    for extra in (1, 2):
        code, out, err = invoke("trace", _words(models.CTX - 2 + extra), "--model", d, "--device", "cpu")
        assert code == 2, err
        assert err.strip() == (f"error: prompt is {models.CTX + extra} tokens; {d} takes at most {models.CTX} "
                               f"(--truncate left keeps the last {models.CTX})")
        assert "internal error" not in err and out == ""


def test_roberta_truncate_left_keeps_exactly_the_limit(tiny_model_dir, cached_load):
    d = tiny_model_dir("roberta")
    code, out, err = invoke("trace", _words(models.CTX + 5), "--model", d, "--device", "cpu", "--truncate", "left",
                            "-f", "json")
    assert code == 0, err
    data = json.loads(out)
    assert len(data["token_ids"]) == models.CTX and data["truncated_tokens"] == 7


# ---------------------------------------------------------------- multimodal Gemma 3

@pytest.mark.parametrize("args", [
    ["lens", "Thank you very"],
    ["next", "Thank you very", "--target", " much"],
    ["ablate", "Thank you very", "--target", " much", "--layer", "1"],
    ["drift", "bank", "--matrix", "1"],
    ["attn", "Thank you very", "--layer", "1", "--head", "0"],
])
def test_multimodal_gemma3_commands_run(args, tiny_model_dir, cached_load):
    code, out, err = invoke(*args, "--model", tiny_model_dir("gemma3_mm"), "--device", "cpu", "-f", "json")
    assert code == 0, err
    assert "internal error" not in err and json.loads(out)


def test_multimodal_gemma3_refuses_out_of_range_and_too_long_before_the_weights(tiny_model_dir, monkeypatch):
    from anatomy_cli.engine import loader

    def no_weights(opened):
        raise AssertionError("the weights must not load")

    monkeypatch.setattr(loader.DIRECT, "load_weights", no_weights)
    d = tiny_model_dir("gemma3_mm")
    code, _, err = invoke("ablate", "Thank you very", "--target", " much", "--layer", "5", "--model", d)
    assert code == 2 and err.strip() == (f"error: --layer 5 is out of range: this model has blocks 0..{models.LAYERS - 1} "
                                            "(negative counts from the last)")
    code, _, err = invoke("drift", "bank", "--matrix", "9", "--model", d)
    assert code == 2 and err.strip() == f"error: --matrix 9 is out of range: this model has blocks 0..{models.LAYERS - 1}"
    code, _, err = invoke("lens", _words(models.CTX + 1), "--model", d)
    assert code == 2 and f"takes at most {models.CTX}" in err


# ---------------------------------------------------------------- one BOS rule

def test_trace_and_corpus_apply_the_same_bos_default(tmp_path, tiny_model_dir, cached_load):
    from anatomy_cli.engine.opening import open_model

    d = tiny_model_dir("llama")
    (tmp_path / "doc.txt").write_text("Thank you very much. " * 20, encoding="utf-8")
    code, out, err = invoke("trace", "Thank you very", "--model", d, "--device", "cpu", "-f", "json")
    assert code == 0, err
    trace_bos = json.loads(out)["bos"]
    code, out, err = invoke("corpus", tmp_path / "doc.txt", "--model", d, "--device", "cpu", "--ctx", "16",
                            "--no-lens", "-f", "json")
    assert code == 0, err
    corpus_bos = json.loads(out)["settings"]["bos"]
    assert trace_bos == corpus_bos == open_model(str(d)).tokenizer.add_bos
