"""`anatomy serve` and checkpoints rewritten on disk while served (issue 27, part 2).

A real server process (a bus error must not take pytest down with it) serves copies of the tiny GPT-2;
each test rewrites its copy in place, as a user would, and the next request must equal an in-process
run on the new files, with the server still up and saying what it reloaded.
"""

from __future__ import annotations

import json
import shutil

import models
import pytest
from serve_helpers import anatomy
from serve_helpers import fresh_copy
from serve_helpers import in_process
from serve_helpers import private_dir
from serve_helpers import start_server
from serve_helpers import stop

from anatomy_cli.serve import protocol


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    sock = private_dir(tmp_path_factory.mktemp("reload")) / "s.sock"
    proc = start_server(sock)
    yield sock
    stop(proc, sock)


def served_equals_in_process(sock, model, *commands) -> None:
    for args in commands:
        args = [*args, "--model", str(model)]
        out = anatomy(*args, sock=sock)
        assert (out.returncode, out.stdout) == in_process(args), args


def status_row(sock, model) -> dict:
    status = protocol.request(sock, {"op": "status"})
    return next(m for m in status["models"] if m["model"] == str(model))


TRACE = ("trace", "Hello world, thank you very", "--format", "json")
TOKENS = ("tokens", "Hello world", "--format", "json")


def test_save_pretrained_over_a_served_directory(server, tiny_model_dir, tmp_path):
    model = fresh_copy(tiny_model_dir("gpt2"), tmp_path)
    served_equals_in_process(server, model, TRACE)
    before = anatomy(*TRACE, "--model", str(model), sock=server).stdout
    models.build_model("gpt2", seed=1).save_pretrained(model)  # other weights, same files
    served_equals_in_process(server, model, TRACE)
    assert anatomy(*TRACE, "--model", str(model), sock=server).stdout != before
    row = status_row(server, model)
    assert row["reloads"] == 1 and "model.safetensors" in row["last_reload"]


def test_new_weights_and_config_copied_in(server, tiny_model_dir, tmp_path):
    """A smaller checkpoint copied over the served files truncates the mapped file: a bus error, unless the
    server holds its own copy of the weights."""
    import transformers

    model = fresh_copy(tiny_model_dir("gpt2"), tmp_path)
    served_equals_in_process(server, model, TRACE)
    small = tmp_path / "small"
    config = transformers.GPT2Config(**{**models.config_kwargs("gpt2"), "n_layer": 1})
    transformers.GPT2LMHeadModel(config).save_pretrained(small)
    for name in ("model.safetensors", "config.json"):
        shutil.copyfile(small / name, model / name)  # in place: the same inode, truncated and rewritten
    served_equals_in_process(server, model, TRACE)
    assert json.loads(anatomy(*TRACE, "--model", str(model), sock=server).stdout)["n_layers"] == 1
    row = status_row(server, model)
    assert row["reloads"] == 1 and row["last_reload"].startswith("config.json, model.safetensors changed on disk")


def test_tokenizer_resaved_alone(server, tiny_model_dir, tmp_path):
    model = fresh_copy(tiny_model_dir("gpt2"), tmp_path)
    served_equals_in_process(server, model, TRACE, TOKENS)
    path = model / "tokenizer.json"
    tok = json.loads(path.read_text())
    vocab = tok["model"]["vocab"]
    vocab["Hello"], vocab["Ġworld"] = vocab["Ġworld"], vocab["Hello"]  # two ids swapped
    with open(path, "w") as f:  # in place: the directory's mtime does not change
        json.dump(tok, f)
    served_equals_in_process(server, model, TRACE, TOKENS)
    ids = [t["token_id"] for t in json.loads(anatomy(*TOKENS, "--model", str(model), sock=server).stdout)["tokens"]]
    assert ids[:2] == [vocab["Hello"], vocab["Ġworld"]]
    assert status_row(server, model)["last_reload"].startswith("tokenizer.json changed on disk")
