"""`anatomy generate`: KV-cache decoding against transformers' own generate and forward, sampling, the lens,
steering hooks against a hand-written hook, and the CLI (keys, sweep, bad vector files)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses.generate import kl
from anatomy_cli.analyses.generate import sampler
from anatomy_cli.cli.main import app
from anatomy_cli.engine.generate import generate
from anatomy_cli.engine.generate import replay
from anatomy_cli.engine.generate import stop_ids
from anatomy_cli.engine.steering import SteeringVector
from anatomy_cli.engine.steering import save

runner = CliRunner()
PROMPT_IDS = [464, 3139, 286, 4881, 318]  # "The capital of France is" (GPT-2 BPE)


def invoke(*args):
    return runner.invoke(app, list(args))


def _hf_greedy(model, ids: list[int], n: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                         do_sample=False, max_new_tokens=n, min_new_tokens=0, pad_token_id=0, num_beams=1,
                         repetition_penalty=1.0, temperature=None, top_p=None, top_k=None)
    return out[0, len(ids):].tolist()


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_greedy_equals_transformers_generate_and_each_step_a_full_forward(tiny_lm, arch):
    lm = tiny_lm(arch)
    g = generate(lm, PROMPT_IDS, max_new_tokens=6, stop=stop_ids(lm))
    assert list(g.tokens) == _hf_greedy(lm.model, PROMPT_IDS, 6)[:len(g.tokens)]
    with torch.no_grad():
        for s in range(len(g.tokens)):
            ref = lm.model(torch.tensor([PROMPT_IDS + list(g.tokens[:s])]), use_cache=False).logits[0, -1]
            torch.testing.assert_close(torch.log_softmax(g.logits[s].double(), -1),
                                       torch.log_softmax(ref.double(), -1), atol=2e-5, rtol=0)


def test_greedy_equals_transformers_on_smollm2(smollm2_lm):
    ids = smollm2_lm.tokenizer.hf("The capital of France is")["input_ids"]
    g = generate(smollm2_lm, ids, max_new_tokens=4, stop=stop_ids(smollm2_lm))
    assert list(g.tokens) == _hf_greedy(smollm2_lm.model, ids, 4)[:len(g.tokens)]
    assert smollm2_lm.tokenizer.hf.decode(list(g.tokens)).startswith(" Paris")


def test_lens_last_layer_is_the_model_and_first_top1_layer(tiny_lm):
    lm = tiny_lm("llama")
    g = generate(lm, PROMPT_IDS, max_new_tokens=3, lens=True)
    assert g.lens_logprob is not None and g.lens_top is not None
    assert g.lens_logprob.shape == (3, lm.n_layers)
    for s, token in enumerate(g.tokens):
        ref = torch.log_softmax(g.logits[s].double(), -1)[token]
        assert float(g.lens_logprob[s, -1]) == pytest.approx(float(ref), abs=1e-5)
        assert int(g.lens_top[s, -1]) == token  # greedy: the last layer ranks the chosen token first


def test_sampler_seed_nucleus_and_temperature():
    logits = torch.tensor([4.0, 3.5, 0.0, -1.0, -2.0])
    draws = [sampler(seed=7)(logits) for _ in range(3)]
    assert len(set(draws)) == 1  # same seed, same first draw
    s = sampler(top_p=0.9, seed=0)   # p = [.59, .36, .016, ...]: the nucleus is the first two tokens
    assert {s(logits) for _ in range(200)} <= {0, 1}
    tiny = sampler(top_p=1e-9, seed=0)
    assert {tiny(logits) for _ in range(20)} == {0}
    cold = sampler(temperature=1e-3, seed=0)
    assert {cold(logits) for _ in range(20)} == {0}


def _block_output_hook(coef: float, v: torch.Tensor):
    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (output[0] + coef * v, *output[1:])
        return output + coef * v
    return hook


def test_steered_step_equals_a_hand_written_hook_and_coef_zero_is_exact(tiny_lm):
    lm = tiny_lm("llama")
    v = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(1))
    vector = SteeringVector({1: v, 0: -v}, site="resid_post")
    coef = 3.0
    g = generate(lm, PROMPT_IDS, max_new_tokens=3, hooks=vector.hooks(coef))
    handles = [lm.model.model.layers[layer].register_forward_hook(_block_output_hook(coef, d))
               for layer, d in vector.directions.items()]
    try:
        with torch.no_grad():
            for s in range(len(g.tokens)):
                ref = lm.model(torch.tensor([PROMPT_IDS + list(g.tokens[:s])]), use_cache=False).logits[0, -1]
                torch.testing.assert_close(g.logits[s], ref.float(), atol=1e-4, rtol=0)
    finally:
        for h in handles:
            h.remove()
    plain = generate(lm, PROMPT_IDS, max_new_tokens=3)
    zero = generate(lm, PROMPT_IDS, max_new_tokens=3, hooks=vector.hooks(0.0))
    assert zero.tokens == plain.tokens and torch.equal(zero.logits, plain.logits)
    uncached = generate(lm, PROMPT_IDS, max_new_tokens=3, hooks=vector.hooks(coef), choose=replay(g.tokens),
                        use_cache=False)
    assert float((uncached.logits - g.logits).abs().max()) < 1e-4
    assert kl(g.logits[0], plain.logits[0]) > 0


# ---------------------------------------------------------------- CLI

def test_cli_json_jsonl_and_sweep(tiny_model_dir, cached_load, tmp_path):
    model = str(tiny_model_dir("llama"))
    result = invoke("generate", "The capital of France is", "-m", model, "--max-new-tokens", "3", "--lens", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sampling"] == {"method": "greedy"} and data["steer"] is None
    assert len(data["steps"]) == len(data["generated_ids"]) <= 3
    step = data["steps"][0]
    assert {"step", "token_id", "token", "probability", "rank", "top", "lens", "first_top1_layer"} <= set(step)
    assert step["rank"] == 1 and len(step["lens"]) == 2
    result = invoke("generate", "The capital of France is", "-m", model, "--max-new-tokens", "3", "--format", "jsonl")
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["step"] for r in rows] == list(range(len(rows)))
    path = tmp_path / "v.safetensors"
    lm = cached_load.load_weights(cached_load.open(_spec(model)))
    save(SteeringVector({1: torch.randn(lm.d_model)}, meta={"model": {"model_type": "llama"}}), path)
    result = invoke("generate", "The capital of France is", "-m", model, "--max-new-tokens", "2", "--steer", str(path),
                    "--coef", "-4,0,4", "--target", " Paris", "--check", "--format", "json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["coef"] for r in data["sweep"]] == [-4.0, 0.0, 4.0]
    assert data["sweep"][1]["kl"] == 0.0 and data["sweep"][1]["target_shift"] == 0.0
    assert data["check"]["max_abs_logit_diff"] < 1e-4


def _spec(model: str):
    from anatomy_cli.models.spec import ModelSpec

    return ModelSpec(model=model, device="cpu")


@pytest.mark.parametrize("case", ["d_model", "hint", "nan", "layer"])
def test_bad_vector_files_are_one_line_errors(tiny_model_dir, cached_load, tmp_path, case):
    model = str(tiny_model_dir("llama"))
    v = torch.ones(32)
    vector = {"d_model": SteeringVector({1: torch.ones(48)}),
              "hint": SteeringVector({1: v}, meta={"model": {"model_type": "gpt2", "name": "gpt2"}}),
              "nan": SteeringVector({1: torch.full((32,), float("nan"))}),
              "layer": SteeringVector({7: v})}[case]
    path = tmp_path / "bad.safetensors"
    save(vector, path)
    result = invoke("generate", "Hello", "-m", model, "--max-new-tokens", "1", "--steer", str(path))
    assert result.exit_code == 2, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("error: ") and "Traceback" not in result.output
    assert {"d_model": "d_model 32", "hint": "made for a gpt2 model", "nan": "NaN", "layer": "layer 7"}[case] in line


def test_usage_errors(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    for args in (["--coef", "2"], ["--temperature", "0.5"], ["--steer", "missing.safetensors"]):
        result = invoke("generate", "Hello", "-m", model, *args)
        assert result.exit_code == 2, (args, result.output)
        assert result.output.strip().splitlines()[-1].startswith("error: ")


def test_the_nested_sampling_and_steering_options_are_declared_once(tiny_model_dir):
    # Issue 59: generate's sampling and steering options are fields of their own dataclasses, offered by the CLI
    # and the API at their fields' places; a declared limit or a check of theirs reads in the caller's words.
    import inspect

    import anatomy_cli as anatomy
    from anatomy_cli.errors import UsageError

    names = list(inspect.signature(anatomy.generate).parameters)
    assert names[2:8] == ["max_new_tokens", "sample", "temperature", "top_p", "seed", "k"]
    assert names[9:13] == ["steer", "coef", "steer_feature", "sae"]
    model = str(tiny_model_dir("llama"))
    result = invoke("generate", "Hello", "-m", model, "--steer-feature", "-1", "--sae", "x")
    assert result.exit_code == 2 and "error: --steer-feature takes a whole number of at least 0" in result.output
    with pytest.raises(UsageError, match="^temperature=, top_p= and seed= need sample=$"):
        anatomy.generate(model, "Hello", temperature=0.5)
    with pytest.raises(UsageError, match="^steer_feature= takes a whole number of at least 0$"):
        anatomy.generate(model, "Hello", steer_feature=-1, sae="x")


def _no_weights(monkeypatch, module):
    def refuse(*_a, **_k):
        raise AssertionError("the weights were loaded before the usage error")
    monkeypatch.setattr(module, "load_weights", refuse)


def test_usage_errors_come_before_the_weights(tiny_model_dir, tmp_path, monkeypatch):
    # Issue 47 / 51 item 4: what needs no weights is refused before they load, with one error line.
    from anatomy_cli.cli.commands import generate as command

    _no_weights(monkeypatch, command)
    model = str(tiny_model_dir("llama"))
    broken = tmp_path / "broken.safetensors"
    broken.write_bytes(b"not safetensors")
    save(SteeringVector({1: torch.ones(48)}), tmp_path / "wide.safetensors")
    cases = [
        (["--sample", "--temperature", "0"], "--temperature must be > 0"),
        (["--sample", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--max-new-tokens", "100000"], "is past"),
        (["--steer", str(tmp_path / "missing.safetensors")], "does not exist"),
        (["--steer", str(broken)], "is not a steering vector file"),
        (["--steer", str(tmp_path / "wide.safetensors")], "d_model 32"),
        (["--steer", str(tmp_path / "wide.safetensors"), "--coef", "1,,2"], "--coef takes a number"),
        (["--first-token"], "--first-token applies to a --target TEXT"),
    ]
    for args, text in cases:
        result = invoke("generate", "Hello", "-m", model, *args)
        assert result.exit_code == 2, (args, result.output)
        line = result.output.strip().splitlines()[-1]
        assert line.startswith("error: ") and text in line, (args, line)


def test_an_encoder_is_refused_with_the_one_wording(tiny_model_dir, monkeypatch):
    from anatomy_cli.cli.commands import generate as command

    _no_weights(monkeypatch, command)
    result = invoke("generate", "Hello", "-m", str(tiny_model_dir("bert")))
    assert result.exit_code == 2, result.output
    # capabilities.require's sentence
    assert "is an encoder" in result.output and "`generate` needs a decoder-only model" in result.output


def test_sampling_never_touches_the_global_rng():
    # Issue 51 item 10: a sampler with no seed has its own generator; torch's global state is left alone.
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    sampler()(torch.tensor([1.0, 2.0, 3.0]))
    assert torch.equal(torch.rand(3), expected)


def test_first_token_is_a_flag_and_a_keyword(tiny_model_dir, cached_load, tmp_path):
    # `--first-token` (the API's first_token=): a several-token --target TEXT stands for its first token.
    import anatomy_cli as anatomy

    model = str(tiny_model_dir("gpt2"))
    path = tmp_path / "v.safetensors"
    save(SteeringVector({1: torch.ones(32)}), path)
    args = ["--max-new-tokens", "1", "--steer", str(path), "--coef", "-1,0,1", "--target", " Paris France"]
    result = invoke("generate", "Hello", "-m", model, *args, "--first-token", "--format", "json")
    assert result.exit_code == 0, result.output
    api = anatomy.generate(model, "Hello", max_new_tokens=1, steer=path, coef=[-1, 0, 1], target=" Paris France",
                           first_token=True)
    assert json.loads(result.stdout) == json.loads(json.dumps(api.to_dict()))


def test_a_zero_vector_is_said(tiny_model_dir, tmp_path):
    # issue 51 item 5: a vector of zeros is applied (it is coefficient 0 in effect) with a warning
    path = tmp_path / "zero.safetensors"
    save(SteeringVector({1: torch.zeros(32)}), path)
    result = invoke("generate", "Hello", "-m", str(tiny_model_dir("llama")), "--max-new-tokens", "1", "--steer",
                    str(path))
    assert result.exit_code == 0, result.output
    assert "warning: " in result.stderr and "direction.1 is all zeros" in result.stderr


def test_a_steered_heading_names_the_vector_and_an_overflow_is_said(tiny_model_dir, tmp_path):
    # issue 51 item 5: the heading says what steered (file, site, block, coefficient); --coef 1e30 makes the
    # residual's mean square overflow in float32 (the next norm turns it into zeros: a uniform distribution)
    path = tmp_path / "v.safetensors"
    v = torch.randn(32, generator=torch.Generator().manual_seed(0))
    save(SteeringVector({1: v}), path)
    assert not torch.isfinite((1e30 * v).float().pow(2).mean())  # the overflow, computed apart
    base = ["generate", "Hello", "-m", str(tiny_model_dir("llama")), "--max-new-tokens", "2", "--steer", str(path)]
    result = invoke(*base, "--coef", "2", "--format", "table")
    assert result.exit_code == 0, result.output
    said = f"steered by vector {path} · resid_post of block 1 · coefficient 2"
    assert "".join(said.split()) in "".join(result.stdout.split())  # a long path may wrap anywhere in the table
    assert "non-finite" not in result.stderr
    result = invoke(*base, "--coef", "1e30")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("non-finite") == 1 and "coefficient 1e+30 made the activations non-finite" in result.stderr
    result = invoke(*base, "--coef", "-1e30,0,1e30", "--format", "json")
    assert result.exit_code == 0, result.output
    assert result.stderr.count("non-finite") == 1 and "coefficients -1e+30, 1e+30" in result.stderr
