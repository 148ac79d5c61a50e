"""The suite's own budget (issue 51 item 12): each xdist worker's torch takes its share of the cores, not all of
them (tests/conftest.py). Two workers with a thread per core each put 4 spinning OpenMP threads on 2 cores, and a
test ran 2-14x slower than alone (the suite 969 s against 492 s on the same machine)."""

from __future__ import annotations

import os

import pytest


@pytest.mark.skipif(not os.environ.get("PYTEST_XDIST_WORKER"), reason="a plain (-n 0) run takes every core")
def test_each_worker_takes_its_share_of_the_cores():
    import torch

    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    cores = os.cpu_count() or 1
    if "OMP_NUM_THREADS" in os.environ and os.environ.get("OMP_NUM_THREADS") != str(max(1, cores // workers)):
        pytest.skip("the caller set OMP_NUM_THREADS")
    assert torch.get_num_threads() == max(1, cores // workers)
    assert torch.get_num_threads() * workers <= max(cores, workers)


def test_open_once_reads_a_directory_again_when_a_file_changes(tiny_model_dir, tmp_path):
    """conftest's open_once (CachingLoader's open) parses a directory's unchanged files once, and reads them again
    when one changes or the directory goes: a test that rewrites or removes a file sees what a user would."""
    import json
    import shutil

    from conftest import open_once
    from tokenizers import Tokenizer

    from anatomy_cli.errors import ModelPathNotFound
    from anatomy_cli.models.spec import ModelSpec

    for f in tiny_model_dir("gpt2").iterdir():
        if f.is_file() and f.suffix != ".safetensors":
            shutil.copy(f, tmp_path / f.name)
    spec = ModelSpec(str(tmp_path))
    first = open_once(spec)
    assert open_once(spec) is first and first.light
    config = json.loads((tmp_path / "config.json").read_text())
    config["n_layer"] += 1
    (tmp_path / "config.json").write_text(json.dumps(config))
    again = open_once(spec)
    assert again is not first and again.info.n_layers == config["n_layer"]
    text = "Thank you, café"
    assert again.tokenizer.encode([text], bos=False)[0].ids == Tokenizer.from_file(str(tmp_path / "tokenizer.json")).encode(text).ids
    shutil.rmtree(tmp_path)
    with pytest.raises(ModelPathNotFound):
        open_once(spec)
