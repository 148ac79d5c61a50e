"""Usage errors before torch (issue 32, item 4): config.json read as JSON and tokenizer.json through the
`tokenizers` library give the same tokens as transformers, so prompt-level arguments are checked (exit 2)
without importing torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anatomy_cli.models import light
from anatomy_cli.text.fast import BackendTokenizer
from anatomy_cli.text.tokenization import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["Thank you very", " leading  spaces\tand\nnewlines", "我爱你 🤖 naïve café", "<|endoftext|> after",
         "x" * 40, "", "[CLS] [MASK] <s> </s> <mask>"]


def _same_encodings(ours: Tokenizer, theirs: Tokenizer) -> None:
    assert len(ours) == len(theirs)
    assert sorted(ours.special_ids) == sorted(theirs.special_ids)
    assert (ours.bos_id, ours.eos_id, ours.pad_id) == (theirs.bos_id, theirs.eos_id, theirs.pad_id)
    for allow_special in (False, True):
        for bos in (False, True):
            assert ours.encode(TEXTS, bos=bos, allow_special=allow_special) == \
                theirs.encode(TEXTS, bos=bos, allow_special=allow_special), (allow_special, bos)


@pytest.mark.parametrize("arch", ["gpt2", "llama", "bert", "roberta"])
def test_tokenizer_json_through_tokenizers_equals_transformers(arch, tiny_model_dir):
    from transformers import AutoConfig
    from transformers import AutoTokenizer

    from anatomy_cli.models.adapters import for_config

    path = tiny_model_dir(arch)
    found = light.read(str(path))
    assert found is not None
    config, backend, special = found
    real = AutoConfig.from_pretrained(path)
    for key in ("num_hidden_layers", "max_position_embeddings", "vocab_size", "model_type"):
        assert getattr(config, key) == getattr(real, key), key
    assert for_config(config) is for_config(real)
    add = not for_config(real).causal
    _same_encodings(Tokenizer(BackendTokenizer(backend, special), add_special_tokens=add),
                    Tokenizer(AutoTokenizer.from_pretrained(path), add_special_tokens=add))


def test_real_smollm2_tokenizer_equals_transformers(smollm2_hf, tmp_path):
    _, hf = smollm2_hf
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 30}))
    config, backend, special = light.read(str(tmp_path))
    assert config.num_hidden_layers == 30
    _same_encodings(Tokenizer(BackendTokenizer(backend, special)), Tokenizer(hf))


def test_gpt2_preset_tokenizer_from_the_package_files(monkeypatch):
    from anatomy_cli.models import resolve
    from anatomy_cli.models.model_files import gpt2_tokenizer

    monkeypatch.setattr(resolve, "in_cache", lambda repo, filename="config.json": None)
    config, backend, special = light.read("gpt2", init="random")
    assert (config.num_hidden_layers, config.max_position_embeddings) == (12, 1024)
    assert light.read("gpt2") is None  # pretrained weights: where they come from is the full load's business
    _same_encodings(Tokenizer(BackendTokenizer(backend, special)), Tokenizer(gpt2_tokenizer()))


def test_what_it_cannot_read_exactly_is_left_to_the_full_load(tiny_model_dir, tmp_path):
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tiny_model_dir("gpt2") / name).read_bytes())
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": "LlamaTokenizer"}))
    assert light.read(str(tmp_path)) is None
    assert light.read("openai-community/gpt2") is None  # a Hub id
    config = light.JsonConfig({"model_type": "gpt2", "n_layer": 3})
    assert config.num_hidden_layers == 3 and getattr(config, "max_position_embeddings", None) is None


def _run(runs: list[list[str]], tmp_path: Path) -> list[list[str]]:
    """Each of ``runs`` (a command's arguments) in turn in one fresh interpreter: each one's stderr lines, the last
    ``exit CODE TORCH`` (whether torch had been imported by then). One interpreter for all (one each cost ~1 s): a
    module imported stays imported, so the last run's ``False`` covers the runs before it."""
    code = ("import json, sys\nfrom anatomy_cli.cli.main import app\n"
            "for args in json.loads(sys.argv[1]):\n"
            "    code = app(args, standalone_mode=False)\n"
            "    print('exit', code, 'torch' in sys.modules, file=sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "ANATOMY_CACHE_DIR": str(tmp_path),
           "ANATOMY_SERVER": str(tmp_path / "no-server.sock")}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(runs)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    lines, each = done.stderr.splitlines(), []
    for _ in runs:
        end = next(i for i, line in enumerate(lines) if line.startswith("exit "))
        each.append(lines[:end + 1])
        lines = lines[end + 1:]
    return each


USAGE_ERRORS = [
    (["trace", "x y z", "--position", "99"], "--position 99 is out of range: the prompt has 3 tokens"),
    (["patch", "a b c", "a b", "--target", " much"], "CLEAN and CORRUPT must have the same number of tokens"),
    (["next", "hi", "--target", "much more"], "--target 'much more' is 2 tokens"),
    (["lens", "hi", "--layers", "0,9"], "--layers 9 is out of range"),
    (["dla", "hi", "--target", " much", "--position", "5"], "--position 5 is out of range"),
    (["attn", "hi", "--layer", "7"], "--layer 7 is out of range"),
    (["ablate", "hi", "--target", " much", "--layer", "5"], "--layer 5 is out of range"),
]


def test_usage_errors_exit_2_without_importing_torch(tiny_model_dir, tmp_path):
    """Each command's usage error, and a preset with random weights too, in one interpreter: none imports torch."""
    model = ["--model", str(tiny_model_dir("gpt2"))]
    each = _run([*([*args, *model] for args, _ in USAGE_ERRORS),
                 ["trace", "x y z", "--position", "99", "--init", "random"]], tmp_path)
    for (args, message), lines in zip(USAGE_ERRORS, each):
        assert lines[0].startswith(f"error: {message}"), (args, lines)
        assert lines[-1].startswith("exit 2 "), (args, lines)
    assert each[-1][-1] == "exit 2 False", each  # and so for every run before it


def test_a_good_command_prints_its_notes_once(tiny_model_dir):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    done = CliRunner().invoke(app, ["next", "Thank you very", "--target", "much", "--top", "1", "--format", "tsv",
                                    "--model", str(tiny_model_dir("gpt2"))])
    assert done.exit_code == 0, done.stderr
    assert done.stderr.count("note: --target 'much' is much (29482), with no leading space") == 1


def test_backend_tokenizer_reads_the_bos_convention_of_its_post_processor():
    # One text (a str) gives flat lists as transformers does, so adds_bos sees a template that puts BOS first.
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models
    from tokenizers import pre_tokenizers
    from tokenizers import processors

    from anatomy_cli.text.fast import BackendTokenizer
    from anatomy_cli.text.tokenization import Tokenizer
    from anatomy_cli.text.tokenization import adds_bos

    rust = RustTokenizer(models.WordLevel({"<s>": 0, "a": 1, "b": 2}, unk_token="<s>"))
    rust.pre_tokenizer = pre_tokenizers.Whitespace()
    rust.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    backend = BackendTokenizer(rust, {"bos_token": "<s>"})
    assert backend("a", add_special_tokens=True)["input_ids"] == [0, 1]
    assert backend(["a b"], add_special_tokens=True)["input_ids"] == [[0, 1, 2]]
    assert adds_bos(backend) is True
    assert Tokenizer(backend).encode(["a b"])[0].ids == [0, 1, 2]
