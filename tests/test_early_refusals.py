"""What a new user's trial found: usage errors that came only after the model opened (13-15 s: the open imports torch
and transformers for a GGUF file) are refused before it, and the CLI's small promises (a closed pipe, the help's
examples) hold. Each refusal runs in a fresh interpreter, which must not have imported torch when it answers."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


def _refused(commands: dict[str, list[str]]) -> dict[str, tuple[int, str]]:
    """Each ``anatomy ARGS`` of ``commands`` in one fresh interpreter (one start for all: a start costs seconds on the
    busy machine): ``{name: (exit code, stderr)}``; fails when torch was imported by the time one answered."""
    code = ("import json, sys; from typer.testing import CliRunner; from anatomy_cli.cli.main import app\n"
            f"for name, args in {commands!r}.items():\n"
            "    r = CliRunner().invoke(app, args)\n"
            "    print(json.dumps([name, r.exit_code, r.stderr, 'torch' in sys.modules]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    answers = {}
    for line in proc.stdout.splitlines()[-len(commands):]:
        name, exit_code, stderr, torch_imported = json.loads(line)
        assert not torch_imported, f"{name}: torch was imported before the refusal: {stderr}"
        answers[name] = (exit_code, stderr)
    assert list(answers) == list(commands)
    return answers


def _sparsify_sae(folder: Path, d_in: int = 576, d_sae: int = 64) -> Path:
    """A sparsify-format SAE folder (cfg.json + sae.safetensors) of SmolLM2's width; random values."""
    from safetensors.numpy import save_file

    folder.mkdir(parents=True)
    (folder / "cfg.json").write_text(json.dumps({"d_in": d_in, "num_latents": d_sae, "k": 8}))
    rng = np.random.default_rng(0)
    save_file({"encoder.weight": rng.standard_normal((d_sae, d_in), dtype=np.float32),
               "encoder.bias": np.zeros(d_sae, np.float32),
               "W_dec": rng.standard_normal((d_sae, d_in), dtype=np.float32),
               "b_dec": np.zeros(d_in, np.float32)}, str(folder / "sae.safetensors"))
    return folder


N_BLOCKS = 30  # SmolLM2-135M's blocks: its config.json's num_hidden_layers (the gguf package's GGUFReader reads 30
# too, in 14 s on the busy machine: not read here)
LAYERS = {"past": ("99", "99"), "negative": (f"0,-{N_BLOCKS + 1}", f"-{N_BLOCKS + 1}"),
          "one past": (str(N_BLOCKS), str(N_BLOCKS))}


@pytest.fixture(scope="module")
def files(smollm2_gguf, tmp_path_factory) -> dict[str, Path]:
    from anatomy_cli.models.sae.read import read

    root = tmp_path_factory.mktemp("refusals")
    (root / "a.txt").write_text("The cat sat on the mat. It was a sunny day and the dog ran around the garden.\n")
    sae = _sparsify_sae(root / "layers.3")  # sparsify names the folder by its hook point
    whole_sae = _sparsify_sae(root / "whole" / "layers.3")  # one left whole: features reads it, then --ctx
    whole = (sae / "sae.safetensors").read_bytes()
    assert read(sae, values=False).d_sae == 64  # whole, its header reads
    (sae / "sae.safetensors").write_bytes(whole[: len(whole) // 2])  # cut in the middle of the tensors
    (root / "empty").mkdir()
    (root / "broken.gguf").write_bytes(b"NOTGGUF" * 10)
    return {"corpus": root / "a.txt", "sae": sae, "whole_sae": whole_sae, "empty": root / "empty", "broken": root / "broken.gguf",
            "nope": root / "nope", "out": root / "out", "model": smollm2_gguf}


@pytest.fixture(scope="module")
def answers(files) -> dict[str, tuple[int, str]]:
    f = {k: str(v) for k, v in files.items()}
    on_corpus = ["--corpus", f["corpus"], "--model", f["model"]]
    commands = {"features nope": ["features", f["nope"], *on_corpus],
                "features truncated": ["features", f["sae"], *on_corpus],
                "circuit empty": ["circuit", "hello", "--model", f["model"], "--transcoders", f["empty"]],
                "sae nope": ["sae", "hello", "--sae", f["nope"], "--model", f["model"]],
                "sae truncated": ["sae", "hello", "--sae", f["sae"], "--model", f["model"]],
                "fit-sae ctx": ["fit-sae", f["corpus"], "--model", f["model"], "--layer", "3", "--out", f["out"],
                                "--ctx", "100000"],
                "features ctx": ["features", f["whole_sae"], *on_corpus, "--ctx", "100000"],
                "corpus ctx": ["corpus", f["corpus"], "--model", f["model"], "--ctx", "100000"],
                "fit-lens tuned ctx": ["fit-lens", "tuned", "--model", f["model"], "--corpus", f["corpus"],
                                       "--tokens", "1000", "--out", f["out"], "--ctx", "100000"],
                "fit-sae budget": ["fit-sae", f["corpus"], "--model", f["model"], "--layer", "3", "--out", f["out"],
                                   "--max-tokens", "100", "--ctx", "64"],
                "fit-sae budget default": ["fit-sae", f["corpus"], "--model", f["model"], "--layer", "3", "--out",
                                           f["out"], "--max-tokens", "300"],
                "fit-lens target": ["fit-lens", "jacobian", "--model", f["model"], "--prompts", f["corpus"],
                                    "--out", f["out"], "--target-layer", "99"],
                "fit-lens negative": ["fit-lens", "jacobian", "--model", f["model"], "--prompts", f["corpus"],
                                      "--out", f["out"], "--target-layer", "-99"],
                "fit-lens sources": ["fit-lens", "jacobian", "--model", f["model"], "--prompts", f["corpus"],
                                     "--out", f["out"], "--target-layer", "-2", "--source-layers", "3,28"],
                **{f"fit-sae {k}": ["fit-sae", f["corpus"], "--model", f["model"], "--layer", layer, "--out", f["out"]]
                   for k, (layer, _) in LAYERS.items()},
                "model dir": ["next", "hi", "--model", "./no-such-model"],
                "model file": ["next", "hi", "--model", "no-such-model.gguf"],
                "model broken": ["next", "hi", "--model", f["broken"]]}
    return _refused(commands)


def test_features_refuses_a_missing_dictionary_before_the_model_opens(answers, files):
    assert answers["features nope"] == (2, f"error: no SAE at {files['nope']}: no such file or folder\n")


def test_features_refuses_a_truncated_dictionary_before_the_model_opens(answers, files):
    code, err = answers["features truncated"]
    assert code == 1 and err.startswith(f"error: {files['sae'] / 'sae.safetensors'}") and err.count("\n") == 1, err
    assert "truncated" in err


def test_sae_refuses_a_missing_or_truncated_dictionary_before_the_model_opens(answers, files):
    """`sae` reads its dictionary whole before the open (tasks/sae.py ``before_open``), as `features` does: no SAE
    at the path is a usage error (2), a truncated file a runtime error (1), one line each, torch not imported."""
    assert answers["sae nope"] == (2, f"error: no SAE at {files['nope']}: no such file or folder\n")
    code, err = answers["sae truncated"]
    assert code == 1 and err.startswith(f"error: {files['sae'] / 'sae.safetensors'}") and err.count("\n") == 1, err
    assert "truncated" in err


@pytest.fixture(scope="module")
def n_ctx(files) -> int:
    """The context of SmolLM2's GGUF as the opened model's ModelInfo has it (transformers' config of the file)."""
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks.session import open_model

    return open_model(ModelSpec(model=str(files["model"]))).info.n_ctx


@pytest.mark.parametrize("command", ["fit-sae", "features", "corpus", "fit-lens tuned"])
def test_a_ctx_past_the_context_is_refused_before_the_model_opens(answers, files, n_ctx, command):
    """--ctx 100000 on SmolLM2, in every command with --ctx that opens a model: the context the GGUF header states
    (models/light.py ``gguf_header``, tasks/session.py ``check_early``), before torch is imported, with the refusal
    the opened model gives (models/info.py ``check_ctx``); the number is the one the opened model's ModelInfo
    has."""
    assert n_ctx == 8192  # SmolLM2-135M's config.json's max_position_embeddings
    assert answers[f"{command} ctx"] == (2, f"error: --ctx 100000 is more than {files['model']}'s context of "
                                            f"{n_ctx} tokens\n")


def test_the_apis_fit_sae_refuses_a_ctx_past_the_context_before_the_model_opens(files, n_ctx):
    """``fit_sae(path, corpus, ctx=100000)`` with the model named by its path: refused as the command refuses it,
    in the API's words (``ctx=``), in a fresh interpreter that has not imported torch when it answers."""
    code = ("import json, sys; import anatomy_cli as anatomy; from anatomy_cli.errors import UsageError\n"
            "try:\n"
            f"    anatomy.fit_sae({str(files['model'])!r}, {str(files['corpus'])!r}, layer=3, "
            f"out={str(files['out'])!r}, ctx=100000)\n"
            "except UsageError as e:\n"
            "    print(json.dumps([str(e), 'torch' in sys.modules]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    message, torch_imported = json.loads(proc.stdout.splitlines()[-1])
    assert not torch_imported
    from anatomy_cli.declare.fields import api_words
    from anatomy_cli.tasks.fit_sae import FitSaeOptions

    said = f"--ctx 100000 is more than {files['model']}'s context of {n_ctx} tokens"  # the command's words
    assert message == api_words(said, (FitSaeOptions,))  # in the API's (``ctx= 100000``, as every API refusal)


def test_circuit_refuses_a_folder_without_transcoders_before_the_model_opens(answers, files):
    code, err = answers["circuit empty"]
    assert code == 2 and err.startswith(f"error: --transcoders {files['empty']}: no config.yaml there"), err


def test_fit_sae_refuses_a_layer_past_the_last_before_the_model_opens(answers, files):
    """The block count from the GGUF header (models/light.py ``gguf_header``), before torch is imported."""
    from anatomy_cli.models import light

    for k, (_, bad) in LAYERS.items():
        assert answers[f"fit-sae {k}"] == (2, f"error: --layer {bad} is out of range: this model has blocks "
                                              f"0..{N_BLOCKS - 1} (negative counts from the last)\n")
    header = light.gguf_header(str(files["model"]))
    assert header is not None and header.block_count == N_BLOCKS
    assert light.gguf_header("gpt2") is None  # a preset: known once opened


def test_a_budget_under_two_windows_and_jacobian_blocks_are_refused_before_the_model_opens(answers, n_ctx):
    """A new user's trial: --max-tokens under two windows was refused after the open (9.2 s); so were fit-lens
    jacobian's blocks. Now from the options and the GGUF header's context and block count (the default window:
    min(256, the context))."""
    assert answers["fit-sae budget"] == (2, "error: --max-tokens 100 is under two --ctx 64 windows (one is held out)\n")
    assert answers["fit-sae budget default"] == (
        2, f"error: --max-tokens 300 is under two --ctx {min(256, n_ctx)} windows (one is held out)\n")
    assert answers["fit-lens target"] == (2, f"error: --target-layer 99 is out of range: this model has blocks "
                                             f"0..{N_BLOCKS - 1} (negative counts from the last)\n")
    assert answers["fit-lens negative"] == (2, f"error: --target-layer -99 is out of range: this model has blocks "
                                               f"0..{N_BLOCKS - 1} (negative counts from the last)\n")  # it said -69
    assert answers["fit-lens sources"] == (2, f"error: --source-layers 28: every source block must be below the "
                                              f"target block {N_BLOCKS - 2}\n")


def test_a_model_path_that_does_not_exist_is_a_usage_error(answers):
    """Exit 2, as a missing dictionary or corpus is; an existing file that is not a model stays exit 1."""
    assert answers["model dir"] == (2, "error: no such directory: ./no-such-model\n")
    assert answers["model file"] == (2, "error: no such file: no-such-model.gguf\n")
    code, err = answers["model broken"]
    assert code == 1 and "not a GGUF file" in err


def test_explain_help_examples_are_the_docs_examples():
    """explain --help names the explainer as docs/commands/explain.md does (``smollm2``, not a file name)."""
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    page = CliRunner().invoke(app, ["explain", "--help"], env={"COLUMNS": "200"}).output
    examples = [" ".join(line.split()) for line in page.splitlines() if line.strip().startswith("anatomy explain ")]
    doc = " ".join((ROOT / "docs/commands/explain.md").read_text().replace("\\\n", " ").split())
    assert examples and all(e in doc for e in examples), [e for e in examples if e not in doc]
    assert any(re.search(r"--explainer smollm2\b", e) for e in examples)


def test_the_readme_says_how_to_assemble_gemma3_as_the_error_does():
    """The README's step for the Gemma 3 file is the command the not-assembled error names (models/packaged.py)."""
    from anatomy_cli.models.packaged import ASSEMBLED

    entry = ASSEMBLED["gemma3-270m"]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    assert f"`python -c 'import {entry.module} as m; m.assemble()'`" in readme
    assert "--model gemma3-270m" in readme
