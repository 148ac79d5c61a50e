"""`anatomy features --ray`: two Ray workers (on the session's Ray, conftest's ``ray_cluster``), one killed mid-run,
give the in-process run's numbers exactly (the shards merged in shard order; each sample's key depends on the token,
not on the worker)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

ray = pytest.importorskip("ray")

from test_features import TEXT  # noqa: E402
from test_features import invoke  # noqa: E402
from test_features import write_sae  # noqa: E402

DRIVER = """
import functools, sys
from anatomy_cli.corpus import feature_run
feature_run.run = functools.partial(feature_run.run, crash_once=(sys.argv[1], 2))  # a worker dies at shard 2
from anatomy_cli.cli.main import app
app(args=sys.argv[2:])
"""


def test_ray_workers_give_the_in_process_numbers(tiny_model_dir, tmp_path, ray_cluster):
    sae, corpus = write_sae(tmp_path / "sae"), tmp_path / "corpus.txt"
    corpus.write_text(TEXT)
    args = ["features", str(sae), "--corpus", str(corpus), "--model", str(tiny_model_dir("gpt2")), "--device", "cpu",
            "--ctx", "16", "--shard-windows", "2", "--batch-size", "2", "--features", "10-20", "--format", "json"]
    plain = invoke(*args)  # in this process: the command's numbers without Ray (and without a second interpreter)
    assert plain.exit_code == 0, plain.output[-2000:]
    marker = tmp_path / "crashed"
    res = subprocess.run([sys.executable, "-c", DRIVER, str(marker), *args, *ray_cluster.args()], env=ray_cluster.env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert marker.exists(), "no worker died: the test proves nothing"
    got, want = json.loads(res.stdout), json.loads(plain.stdout)
    assert got["shards"] == want["shards"] > 2
    for key in ("features", "contexts", "logit_effects", "tokens", "windows"):
        assert got[key] == want[key], key
