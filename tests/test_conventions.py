"""Each model's own conventions (issue 26): the BOS default, padded vocabularies, short labels."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()
PROMPT = "Thank you very"  # GPT-2 ids [10449, 345, 845]; its BOS is <|endoftext|> 50256


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def run_json(*args) -> dict:
    result = invoke(*args, "--format", "json")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def table(*args) -> str:
    result = invoke(*args, "--format", "table")
    assert result.exit_code == 0, result.stderr
    return " ".join(result.stdout.split())  # rich may wrap a heading


# ---------------------------------------------------------------- BOS

@pytest.fixture(scope="module")
def bos_llama_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny LLaMA model with a tokenizer whose convention is to add its BOS (add_bos_token=True)."""
    from transformers import GPT2TokenizerFast

    from anatomy_cli.data import gpt2_merges
    from anatomy_cli.data import gpt2_vocab

    out = tmp_path_factory.mktemp("tiny-llama-bos")
    for f in Path(tiny_model_dir("llama")).iterdir():
        if "token" not in f.name and f.name not in ("vocab.json", "merges.txt"):
            shutil.copy(f, out / f.name)
    tok = GPT2TokenizerFast(vocab=dict(gpt2_vocab()), merges=gpt2_merges(), add_bos_token=True)
    assert tok("a", add_special_tokens=True)["input_ids"][0] == 50256  # transformers' own encode adds it
    tok.save_pretrained(out)
    return out


def test_bos_default_follows_the_tokenizer(bos_llama_dir, cached_load):
    import models

    data = run_json("next", PROMPT, "-m", bos_llama_dir, "--k", "3")
    assert data["token_ids"] == [50256, 10449, 345, 845]
    assert (data["bos"], data["bos_source"]) == (True, "model default")
    assert data["tokens"][0] == "<|endoftext|>"
    # The probabilities are those of the model run on the BOS and the prompt (independent forward).
    with torch.no_grad():
        logits = models.build_model("llama")(torch.tensor([[50256, 10449, 345, 845]])).logits[0, -1]
    probs = torch.softmax(logits.double(), -1)
    assert [t["token_id"] for t in data["top"]] == torch.topk(probs, 3).indices.tolist()
    assert data["top"][0]["probability"] == pytest.approx(probs.max().item(), abs=1e-6)

    no = run_json("next", PROMPT, "-m", bos_llama_dir, "--k", "3", "--no-bos")
    assert no["token_ids"] == [10449, 345, 845] and (no["bos"], no["bos_source"]) == (False, "--no-bos")
    assert "· bos: true (model default) ·" in table("next", PROMPT, "-m", bos_llama_dir)
    assert "· bos: false (--no-bos) ·" in table("trace", PROMPT, "-m", bos_llama_dir, "--no-bos")
    # tokens --model shows the ids the commands run, and takes the same override
    toks = run_json("tokens", PROMPT, "--model", bos_llama_dir)
    assert [t["token_id"] for t in toks["tokens"]] == data["token_ids"] and toks["bos"] is True
    assert toks["tokens"][0]["special"] and (toks["tokens"][0]["start"], toks["tokens"][0]["end"]) == (0, 0)
    assert [t["token_id"] for t in run_json("tokens", PROMPT, "--model", bos_llama_dir, "--no-bos")["tokens"]] \
        == no["token_ids"]


def test_drift_contexts_follow_the_same_rule(bos_llama_dir, cached_load):
    data = run_json("drift", "bank", "-m", bos_llama_dir)
    assert (data["bos"], data["bos_source"]) == (True, "model default")
    assert "bos: true (model default)" in table("drift", "bank", "-m", bos_llama_dir)
    assert run_json("drift", "bank", "-m", bos_llama_dir, "--no-bos")["bos"] is False


def test_a_prompt_that_starts_with_the_bos_keeps_one(bos_llama_dir, cached_load):
    data = run_json("next", "<|endoftext|>Thank", "-m", bos_llama_dir, "--allow-special")
    assert data["token_ids"] == [50256, 10449] and data["bos"] is True
    toks = run_json("tokens", "<|endoftext|>Thank", "--model", bos_llama_dir, "--allow-special")
    assert [t["token_id"] for t in toks["tokens"]] == [50256, 10449]


def test_gpt2_gets_no_bos_by_default_and_one_with_bos(tiny_model_dir, cached_load):
    d = tiny_model_dir("gpt2")
    data = run_json("next", PROMPT, "-m", d)
    assert data["token_ids"] == [10449, 345, 845] and (data["bos"], data["bos_source"]) == (False, "model default")
    forced = run_json("lens", PROMPT, "-m", d, "--bos")
    assert forced["token_ids"] == [50256, 10449, 345, 845] and forced["bos_source"] == "--bos"
    toks = run_json("tokens", PROMPT, "--model", d)
    assert [t["token_id"] for t in toks["tokens"]] == [10449, 345, 845] and toks["bos"] is False
    # tiktoken has no BOS to add
    result = invoke("tokens", PROMPT, "--bos")
    assert result.exit_code == 2 and "--model" in result.stderr


def test_smollm2_ids_unchanged(smollm2_gguf):
    from anatomy_cli.analyses.tokens import tokenize_hf

    result = tokenize_hf("The capital of Germany is", str(smollm2_gguf))
    # The, Ġcapital, Ġof, ĠGermany, Ġis in the file's tokenizer.ggml.tokens (read with gguf.GGUFReader)
    assert [t.token_id for t in result.tokens] == [504, 3575, 282, 4521, 314]
    assert (result.bos, result.bos_source) == (False, "model default")


@pytest.fixture(scope="module")
def gemma_lm(gemma3_lm):
    """Gemma 3 270M (Q4_K_M GGUF): conftest's session model (assembled once per machine, loaded once)."""
    return gemma3_lm


def test_gemma_bos_default_gives_a_sensible_continuation(gemma_lm):
    from anatomy_cli import engine
    from anatomy_cli.models.headers import read_gguf

    assert read_gguf(gemma_lm.name).fields["tokenizer.ggml.add_bos_token"] is True
    assert gemma_lm.tokenizer.add_bos and gemma_lm.tokenizer.bos_id == 2
    assert gemma_lm.label == "gemma-3-270m-Q4_K_M"  # the file stem (issue 42)
    top = {}
    for bos in (None, False):
        [enc] = engine.encode(gemma_lm, [PROMPT], bos=bos)
        assert (enc.ids[0] == 2) is (bos is None)
        # the model's own forward, outside the engine
        with torch.no_grad():
            logits = gemma_lm.model(torch.tensor([enc.ids])).logits[0, -1]
        probs = torch.softmax(logits.double(), -1)
        p, i = probs.max(0)
        top[bos] = (gemma_lm.tokenizer.piece(int(i)), float(p))
        cache = engine.run(gemma_lm, [enc], ["logits"], positions=[[-1]])[0]
        assert torch.softmax(cache.logits[0].double(), -1)[i].item() == pytest.approx(float(p), abs=1e-4)
    assert top[None][0] == "·much" and top[None][1] > 0.9
    assert top[False][0] != "·much"  # without its BOS, Gemma repeats the last word


def test_gemma_commands_say_which_bos_applied(gemma_lm, monkeypatch, fixed_load):
    from anatomy_cli.analyses import tokens as tokens_analysis

    fixed_load(gemma_lm)  # the module's model, not a second 80-second load
    data = run_json("next", PROMPT, "-m", gemma_lm.name, "--k", "1")
    assert data["token_ids"][0] == 2 and (data["bos"], data["bos_source"]) == (True, "model default")
    assert data["top"][0]["token"] == "·much" and data["top"][0]["probability"] > 0.9
    assert data["model"] == gemma_lm.name  # the path; the heading has the short name
    assert table("next", PROMPT, "-m", gemma_lm.name).startswith("next · gemma-3-270m-Q4_K_M (weights dequantized from ")
    # tokens --model reads the BOS convention from the file's metadata, and shows the ids next ran
    monkeypatch.setattr(tokens_analysis, "load_tokenizer", lambda source, **kw: gemma_lm.tokenizer.hf)
    toks = run_json("tokens", PROMPT, "--model", gemma_lm.name)
    assert [t["token_id"] for t in toks["tokens"]] == data["token_ids"] and toks["tokens"][0]["token"] == "<bos>"


# ---------------------------------------------------------------- padded vocabularies

PADDED, UNUSED = 50304, 50290  # Pythia's LM head rows; an id past GPT-2's 50,257 tokens


@pytest.fixture(scope="module")
def padded_dir(tmp_path_factory) -> Path:
    """A tiny GPT-NeoX (Pythia-shaped) model whose head has 50,304 rows for GPT-2's 50,257 tokens, with
    row 50290 made the most probable next token everywhere."""
    import models
    import transformers
    from conftest import build_gpt2_tokenizer

    config = transformers.GPTNeoXConfig(**{**models.config_kwargs("gpt_neox"), "vocab_size": PADDED})
    torch.manual_seed(0)
    model = transformers.GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():
        model.gpt_neox.final_layer_norm.bias.fill_(1.0)
        model.lm_head.weight[UNUSED] = 0.5
    out = tmp_path_factory.mktemp("tiny-padded")
    model.save_pretrained(out)
    build_gpt2_tokenizer().save_pretrained(out)
    return out


def _reference_probs(padded_dir, ids) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(padded_dir).eval()
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([ids])).logits[0, -1].double(), -1)


def test_padded_head_next_and_target_id(padded_dir, cached_load):
    data = run_json("next", PROMPT, "-m", padded_dir, "--k", "60000", "--target-id", UNUSED + 1)
    probs = _reference_probs(padded_dir, data["token_ids"])
    assert len(probs) == PADDED and len(data["top"]) == PADDED  # every row of the head, not the tokenizer's
    top = data["top"][0]
    assert (top["token_id"], top["token"], top["text"]) == (UNUSED, f"<unused id {UNUSED}>", None)
    assert top["probability"] == pytest.approx(probs[UNUSED].item(), abs=1e-6)
    assert sum(t["probability"] for t in data["top"]) == pytest.approx(1.0, abs=1e-6)
    target = data["target"]
    assert target["token"] == f"<unused id {UNUSED + 1}>"
    assert target["probability"] == pytest.approx(probs[UNUSED + 1].item(), abs=1e-7)
    assert target["rank"] == int((probs > probs[UNUSED + 1]).sum()) + 1
    result = invoke("next", PROMPT, "-m", padded_dir, "--target-id", PADDED)
    assert result.exit_code == 2 and f"ids 0..{PADDED - 1}" in result.stderr


def test_padded_head_trace_and_lens(padded_dir, cached_load):
    trace = run_json("trace", PROMPT, "-m", padded_dir, "--target-id", UNUSED)
    assert trace["top"][0]["token"] == f"<unused id {UNUSED}>"
    lens = run_json("lens", PROMPT, "-m", padded_dir, "--target-id", UNUSED)
    assert lens["target"]["token"] == f"<unused id {UNUSED}>"
    assert f"<unused id {UNUSED}>" in table("lens", PROMPT, "-m", padded_dir)


def test_unused_ids_in_the_tokenizer_wrapper():
    from conftest import build_gpt2_tokenizer

    from anatomy_cli.text.tokenization import Tokenizer

    tok = Tokenizer(build_gpt2_tokenizer())
    assert not tok.known(UNUSED) and tok.known(881)
    assert tok.piece(UNUSED) == f"<unused id {UNUSED}>" and tok.token_bytes(UNUSED) == b""


# ---------------------------------------------------------------- labels

def test_labels_are_short_and_json_keeps_the_path(tiny_model_dir, cached_load, tmp_path):
    d = tiny_model_dir("gpt2")
    text = table("next", PROMPT, "-m", d)
    assert text.startswith(f"next · {d.name} prompt ") and str(d) not in text
    assert run_json("next", PROMPT, "-m", d)["model"] == str(d)
    from anatomy_cli.models.resolve import Source
    from anatomy_cli.models.resolve import label
    from anatomy_cli.models.resolve import short_name

    assert label(Source("hub", "openai-community/gpt2", "openai-community/gpt2")) == "openai-community/gpt2"
    assert short_name(str(d) + "/") == d.name and short_name("gpt2") == "gpt2"


def test_gguf_label_is_its_stem_else_its_general_name(smollm2_gguf, tmp_path):
    # issue 42: the file stem names a file; general.name only where the stem names nothing (an Ollama blob)
    import shutil

    from anatomy_cli.models.resolve import short_name

    assert short_name(str(smollm2_gguf)) == "SmolLM2-135M-Instruct.Q4_1"
    blob = tmp_path / ("sha256-" + "ab" * 32)
    shutil.copy(smollm2_gguf, blob)
    assert short_name(str(blob)) == "Smollm2 135M 8k Lc100K Mix1 Ep2"
    import gguf

    path = tmp_path / "nameless.Q8_0.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("x", torch.zeros(4).numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert short_name(str(path)) == "nameless.Q8_0"


def test_plot_caption_uses_the_label(tiny_model_dir, cached_load, tmp_path, monkeypatch):
    from anatomy_cli.output import plots

    seen = []
    real = plots.Caption.of

    def spy(*args, **kwargs):
        seen.append(real(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(plots.Caption, "of", spy)
    d = tiny_model_dir("gpt2")
    result = invoke("lens", PROMPT, "-m", d, "--plot", tmp_path / "lens.png")
    assert result.exit_code == 0, result.stderr
    assert seen and seen[0].model == d.name


def test_attribute_report_and_diff_follow_the_model_default_too(bos_llama_dir, cached_load, tmp_path):
    # These three commands defaulted to --no-bos once (a new user found it on Gemma).
    att = run_json("attribute", PROMPT, "-m", bos_llama_dir, "--target", " much", "--method", "saliency")
    assert (att["bos"], att["bos_source"]) == (True, "model default") and att["token_ids"][0] == 50256
    diff = run_json("diff", bos_llama_dir, bos_llama_dir, PROMPT)
    assert diff["token_ids"][0] == 50256, diff.get("token_ids")
    out = tmp_path / "r.html"
    result = invoke("report", PROMPT, "-m", bos_llama_dir, "-o", out, "--sections", "tokens")
    assert result.exit_code == 0, result.stderr
    assert "bos: true (model default)" in out.read_text(encoding="utf-8")
