"""`anatomy next`: the next-token distribution (analysis on synthetic logits, then the CLI on tiny models)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from anatomy_cli.analyses.next_token import log_probs
from anatomy_cli.analyses.next_token import next_tokens
from anatomy_cli.analyses.next_token import rank_of
from anatomy_cli.analyses.next_token import top_k


def _describe(token_id: int) -> tuple[str, str]:
    return f"·t{token_id}", f" t{token_id}"


# ---------------------------------------------------------------- analysis (synthetic logits)

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_probabilities_sum_to_one_over_the_full_vocabulary(dtype):
    logits = (torch.randn(50257, generator=torch.Generator().manual_seed(0)) * 8).to(dtype)
    logp = log_probs(logits)
    assert logp.dtype == torch.float64
    assert abs(float(logp.exp().sum()) - 1.0) < 1e-5
    # The reported top-k probabilities are those of an independent float32 softmax.
    ref = torch.softmax(logits.float(), dim=-1)
    ref_p, ref_i = torch.topk(ref, 5)
    top = top_k(logp, 5, _describe)
    assert [t.token_id for t in top] == ref_i.tolist()
    assert [t.probability for t in top] == pytest.approx(ref_p.tolist(), abs=1e-6)


def test_top_k_rows_rank_probability_and_logprob():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])
    result = next_tokens(logits, 3, _describe)
    z = sum(math.exp(v) for v in (0.0, 3.0, 1.0, 2.0))
    assert [(t.rank, t.token_id, t.token, t.text) for t in result.top] == [
        (1, 1, "·t1", " t1"), (2, 3, "·t3", " t3"), (3, 2, "·t2", " t2")]
    assert result.top[0].probability == pytest.approx(math.exp(3.0) / z, abs=1e-12)
    assert result.top[0].logprob == pytest.approx(3.0 - math.log(z), abs=1e-12)
    assert result.target is None
    assert json.loads(json.dumps(result.to_dict()))["top"][1]["token_id"] == 3


def test_k_larger_than_the_vocabulary_is_clamped():
    assert len(next_tokens(torch.tensor([1.0, 2.0]), 10, _describe).top) == 2


def test_target_rank_and_probability():
    logits = torch.tensor([0.5, 3.0, 1.0, 2.0, 1.0])
    result = next_tokens(logits, 1, _describe, target_id=2)
    assert result.target is not None
    assert result.target.rank == 3  # tokens 1 and 3 are more probable; token 4 ties and does not count
    assert result.target.probability == pytest.approx(float(torch.softmax(logits, -1)[2]), abs=1e-7)
    assert rank_of(log_probs(logits), 1) == 1
    assert rank_of(log_probs(logits), 0) == 5


# ---------------------------------------------------------------- CLI on tiny random models

from typer.testing import CliRunner  # noqa: E402

from anatomy_cli.cli.main import app  # noqa: E402

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("cached_load")  # each tiny model loads once
PROMPT = "Thank you very"  # GPT-2 ids [10449, 345, 845]; " much" is 881


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def next_json(model_dir, *args, prompt=PROMPT):
    result = invoke("next", prompt, "--model", str(model_dir), "--device", "cpu", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def error_lines(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_top_k_and_target_equal_an_independent_hf_forward(arch, tiny_model_dir):
    import models

    data = next_json(tiny_model_dir(arch), "--k", "5", "--target", " much")
    assert data["token_ids"] == [10449, 345, 845] and data["tokens"] == ["Thank", "·you", "·very"]
    with torch.no_grad():
        logits = models.build_model(arch)(torch.tensor([[10449, 345, 845]])).logits[0, -1]
    probs = torch.softmax(logits, -1)
    ref_p, ref_i = torch.topk(probs, 5)
    assert [t["token_id"] for t in data["top"]] == ref_i.tolist()
    assert [t["probability"] for t in data["top"]] == pytest.approx(ref_p.tolist(), abs=1e-6)
    assert [t["logprob"] for t in data["top"]] == pytest.approx(torch.log(ref_p).tolist(), abs=1e-4)
    assert [t["rank"] for t in data["top"]] == [1, 2, 3, 4, 5]
    target = data["target"]
    assert (target["token_id"], target["token"], target["text"]) == (881, "·much", " much")
    assert target["probability"] == pytest.approx(probs[881].item(), abs=1e-7)
    assert target["rank"] == int((probs > probs[881]).sum()) + 1


def test_full_distribution_sums_to_one(tiny_model_dir):
    result = invoke("next", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--format", "jsonl", "--k", "60000")
    data = json.loads(result.stdout)  # --k is clamped to the vocabulary
    top = data["top"]
    assert len(top) == 50257 and len({t["token_id"] for t in top}) == 50257
    assert abs(math.fsum(t["probability"] for t in top) - 1.0) < 1e-5
    assert all(a["probability"] >= b["probability"] for a, b in zip(top, top[1:]))


def test_target_that_is_not_one_token_is_a_usage_error(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("next", PROMPT, "--model", model, "--target", "much more")
    assert result.exit_code == 2 and result.stdout == ""
    assert error_lines(result) == [
        f"error: --target 'much more' is 2 tokens for {model}: much + ·more (ids 29482, 517); "
        "give exactly one token, e.g. ' much' with its space, or --first-token to take the first"]
    result = invoke("next", PROMPT, "--model", model, "--target", "")
    assert result.exit_code == 2 and error_lines(result)[0].startswith("error: --target is empty")


def test_tsv_sections_and_table_text(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("next", PROMPT, "--model", model, "--format", "tsv", "--k", "2", "--target", " much")
    assert result.exit_code == 0, result.stderr
    top, target = result.stdout.split("\n\n")
    assert top.splitlines()[0] == "rank\ttoken\ttoken_id\tprobability\tlogprob"
    assert len(top.splitlines()) == 3
    assert target.splitlines()[1].split("\t")[1:3] == ["·much", "881"]
    result = invoke("next", "[red]Thank[/red] you", "--model", model, "--format", "table", "--init", "random")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "(untrained: random weights)" in text and "prompt '[red]Thank[/red] you' · " in text


def test_stdin_batched_equals_single_and_jsonl_parses(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    prompts = ["Thank you very", "The capital of France is", "a"]
    result = invoke("next", "-", "--model", model, "--format", "jsonl", "--batch-size", "3", "--k", "3",
                    input="\n".join(prompts) + "\n")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["prompt"] for d in lines] == prompts
    for batched, prompt in zip(lines, prompts):
        single = next_json(model, "--k", "3", prompt=prompt)
        assert batched["token_ids"] == single["token_ids"]
        assert [t["token_id"] for t in batched["top"]] == [t["token_id"] for t in single["top"]]
        assert [t["probability"] for t in batched["top"]] == pytest.approx(
            [t["probability"] for t in single["top"]], rel=1e-5)
    result = invoke("next", "-", "--model", model, "--format", "csv", "--k", "1", input="Hi\nThank you very\n")
    assert result.stdout.splitlines()[:3][0] == "prompt,rank,token,token_id,probability,logprob"
    assert [line.split(",")[0] for line in result.stdout.splitlines()[1:]] == ["Hi", "Thank you very"]


def test_bad_input(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    assert invoke("next", "", "--model", model).exit_code == 2
    assert invoke("next", PROMPT, "--model", model, "--k", "0").exit_code == 2
    result = invoke("next", "-", "--model", model, input=b"ok\n\n\xc3\x28\n")
    assert result.exit_code == 2 and error_lines(result)[0].startswith("error: stdin line 3 is not valid UTF-8")
    long = " ".join(["word"] * 80)
    result = invoke("next", long, "--model", model)
    assert result.exit_code == 2 and "80 tokens" in error_lines(result)[0]
    data = next_json(model, "--truncate", "left", "--k", "1", prompt=long)
    assert len(data["token_ids"]) == 64 and data["truncated_tokens"] == 16


def test_prompt_that_looks_like_an_option_after_double_dash(tiny_model_dir):
    result = invoke("next", "--model", str(tiny_model_dir("gpt2")), "--format", "json", "--", "-5 degrees")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["prompt"] == "-5 degrees"


def test_encoders_are_refused(tiny_model_dir):
    result = invoke("next", "the bank", "--model", str(tiny_model_dir("bert")))
    assert result.exit_code == 2
    assert error_lines(result)[0].endswith("is an encoder (bert), not a next-token predictor: `next` needs a "
                                           "decoder-only model such as gpt2 (`trace`, `lens` and `attn` work "
                                           "with encoders)")


def test_bos_is_prepended_only_when_asked(tiny_model_dir):
    model = tiny_model_dir("gpt2")
    assert next_json(model, "--k", "1")["token_ids"] == [10449, 345, 845]
    data = next_json(model, "--k", "1", "--bos")
    assert data["token_ids"] == [50256, 10449, 345, 845] and data["tokens"][0] == "<|endoftext|>"


def test_dtype_is_in_the_record_and_in_a_heading_that_is_not_fp32(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    name = tiny_model_dir("gpt2").name  # headings name a directory by its own name; JSON keeps the path
    for dtype, label in (("fp32", name), ("bf16", f"{name} (bf16)")):
        data = json.loads(runner.invoke(app, ["next", "Thank you very", "--model", model, "--device", "cpu",
                                              "--dtype", dtype, "--format", "json"]).stdout)
        assert (data["dtype"], data["dequantized_from"]) == (dtype, None)
        table = runner.invoke(app, ["next", "Thank you very", "--model", model, "--device", "cpu", "--dtype", dtype,
                                    "--format", "table"], env={"COLUMNS": "200"}).stdout
        assert table.splitlines()[0].startswith(f"next · {label}") and (("bf16" in table) == (dtype == "bf16"))
