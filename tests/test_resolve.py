"""The one resolver (anatomy_cli.models.resolve): what a spec is, for weights, a config or a tokenizer.

No torch here: the resolver must not import it, and bad paths fail before it loads.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import OfflineError
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.resolve import resolve


def test_kinds(tmp_path, tiny_model_dir):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\0" * 40)
    renamed = tmp_path / "model.bin"  # the magic decides, not the name
    renamed.write_bytes(b"GGUF" + b"\0" * 40)
    d = tiny_model_dir("gpt2")
    assert resolve(str(gguf)).kind == resolve(str(renamed)).kind == "gguf"
    assert resolve(str(d)).kind == "dir" and resolve(str(d)).ref == str(d)
    assert resolve("gpt2", need="config").kind == "preset"
    assert resolve("gpt2", init="random").kind == "preset"
    assert check_path("gpt2") is None and check_path("org/name") is None


@pytest.mark.parametrize("spec, error, message", [
    ("./nope", ModelNotFound, "no such directory: ./nope"),
    ("/no/such/model.gguf", ModelNotFound, "no such file: /no/such/model.gguf"),
    ("model.gguf", ModelNotFound, "no such file: model.gguf"),
    ("a/b/c", ModelNotFound, "no such directory: a/b/c"),
])
def test_missing_paths(spec, error, message):
    with pytest.raises(error) as err:
        resolve(spec)
    assert str(err.value) == message


def test_files_that_are_not_models(tmp_path):
    fake = tmp_path / "x.gguf"
    fake.write_bytes(b"not gguf")
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        resolve(str(fake))
    other = tmp_path / "weights.bin"
    other.write_bytes(b"x")
    with pytest.raises(ModelNotFound, match="is a file; a model is a .gguf file"):
        resolve(str(other))


def test_directory_needs_config_except_for_a_tokenizer(tmp_path):
    (tmp_path / "m.Q4_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(CheckpointError, match=r"has no config.json.*holds m\.Q4_0\.gguf: pass that file"):
        resolve(str(tmp_path))
    assert resolve(str(tmp_path), need="tokenizer").kind == "dir"


def test_hub_ids_offline(empty_hf_cache, tiny_model_dir):
    with pytest.raises(OfflineError, match="pass --model PATH to a local checkpoint or .gguf file"):
        resolve("nobody/nothing")
    with pytest.raises(OfflineError, match="^no tokenizer for 'nobody/nothing' in the Hugging Face cache"):
        resolve("nobody/nothing", need="tokenizer")
    with pytest.raises(OfflineError, match="HF_HUB_OFFLINE"):
        resolve("nobody/nothing", need="config")
    with pytest.raises(ModelNotFound, match="not a valid Hugging Face id"):
        resolve("bad name!!")
    # a preset's canonical id in the cache, for weights (need="config" would take the preset)
    snap = empty_hf_cache / "models--openai-community--gpt2" / "snapshots" / "abc"
    shutil.copytree(tiny_model_dir("gpt2"), snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("abc")
    source = resolve("gpt2")
    assert (source.kind, source.ref, source.local_only) == ("hub", "openai-community/gpt2", True)
    assert resolve("gpt2", need="tokenizer").ref == "openai-community/gpt2"


def test_resolver_imports_no_torch():
    code = ("import sys; from anatomy_cli.models.resolve import resolve\n"
            "from anatomy_cli.errors import ModelNotFound\n"
            "try:\n    resolve('./nope.gguf')\nexcept ModelNotFound as e:\n    print(e)\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == "no such file: ./nope.gguf\n", proc.stderr


def test_every_command_fails_fast_on_a_missing_path(tmp_path):
    """Each command on a missing path, in turn in one fresh interpreter (one each cost ~0.4 s): exit 2, one line,
    and torch not imported by the time each answered."""
    missing = str(tmp_path / "gone")
    runs = [argv + ([missing] if argv == ["params"] else ["--model", missing])
            for argv in (["trace", "hi"], ["next", "hi"], ["tokens", "hi"], ["params"])]
    code = ("import json, sys; from typer.testing import CliRunner; from anatomy_cli.cli.main import app\n"
            f"for args in {runs!r}:\n"
            "    r = CliRunner().invoke(app, args)\n"
            "    print(json.dumps([args[0], r.exit_code, r.stderr, 'torch' in sys.modules]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    answers = [json.loads(line) for line in proc.stdout.splitlines()]
    assert answers == [[args[0], 2, f"error: no such directory: {missing}\n", False] for args in runs]
