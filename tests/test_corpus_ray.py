"""`anatomy corpus` on a local Ray with 2 workers: the same answer as in-process, also when a worker dies mid-run.

One Ray session for the whole module (``ray.init(num_cpus=2, include_dashboard=False)``); the runner joins it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from anatomy_cli.corpus.runner import Settings, run  # noqa: E402
from anatomy_cli.corpus.sources import open_source  # noqa: E402
from anatomy_cli.models.spec import ModelSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = Settings(ctx=16, bos=False, max_tokens=16 * 12, heads=True, shard_windows=2, batch_size=2)


@pytest.fixture(scope="module")
def ray_session():
    # Workers import anatomy_cli from this tree, as the test process does.
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def in_process(tiny_model_dir, tiny_lm):
    spec = ModelSpec(str(tiny_model_dir("gpt2")), device="cpu")
    lm = tiny_lm("gpt2")
    result = run(open_source(str(ROOT / "docs" / "article.md")), spec, SETTINGS, tokenizer=lm.tokenizer, lm=lm)
    return spec, lm, result


def test_two_workers_equal_in_process(ray_session, in_process, tmp_path):
    spec, lm, expected = in_process
    result = run(open_source(str(ROOT / "docs" / "article.md")), spec, SETTINGS, tokenizer=lm.tokenizer,
                 out=tmp_path / "out", ray={"workers": 2})
    assert result.shards == 6 and result.stats.tokens == 192
    # merged in shard order: equal to the in-process figures to the last bit, not just to rounding
    assert result.stats.to_dict() == expected.stats.to_dict()


def test_a_worker_killed_mid_run_is_retried(ray_session, in_process, tmp_path):
    spec, lm, expected = in_process
    marker = tmp_path / "crashed"
    result = run(open_source(str(ROOT / "docs" / "article.md")), spec, SETTINGS, tokenizer=lm.tokenizer,
                 out=tmp_path / "out", ray={"workers": 2}, crash_once=(str(marker), 3))
    assert marker.exists(), "no worker died: the test proves nothing"
    assert result.shards == 6 and result.stats.windows == 12 and result.stats.tokens == 192
    assert result.stats.to_dict() == expected.stats.to_dict()


DRIVER = """
import functools, sys
from anatomy_cli.corpus import runner
runner.run = functools.partial(runner.run, crash_once=(sys.argv[1], 2))  # a worker dies at shard 2
from anatomy_cli.cli.main import app
app(args=sys.argv[2:])
"""


def test_ray_never_writes_to_stdout_when_a_worker_dies(tiny_model_dir, tmp_path):
    """`--ray --format json | jq` keeps working exactly when a retry did its job (issue 41 item 3): Ray's
    ``(raylet) A worker died…`` goes to stderr."""
    import json
    import subprocess
    import sys

    marker = tmp_path / "crashed"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", DRIVER, str(marker), "corpus", str(ROOT / "docs" / "article.md"),
                          "--model", str(tiny_model_dir("gpt2")), "--ctx", "16", "--max-tokens", "96",
                          "--shard-windows", "2", "--ray", "--workers", "2", "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert marker.exists(), "no worker died: the test proves nothing"
    assert json.loads(res.stdout)["tokens"] == 96  # the whole of stdout is the JSON document
    check = subprocess.run([sys.executable, "-m", "json.tool"], input=res.stdout, capture_output=True, text=True)
    assert check.returncode == 0
    assert "A worker died" in res.stderr
