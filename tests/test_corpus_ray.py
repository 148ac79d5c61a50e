"""`anatomy corpus` on a local Ray with 2 workers: the same answer as in-process, also when a worker dies mid-run.

One Ray, started by the command itself in a child process, with a worker killed mid-run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from anatomy_cli.corpus.runner import Settings  # noqa: E402
from anatomy_cli.corpus.runner import run  # noqa: E402
from anatomy_cli.corpus.sources import open_source  # noqa: E402
from anatomy_cli.models.spec import ModelSpec  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = Settings(ctx=16, bos=False, max_tokens=16 * 12, heads=True, shard_windows=2, batch_size=2)


@pytest.fixture(scope="module")
def jacobian_lens(tmp_path_factory) -> Path:
    """A random Jacobian lens for the tiny GPT-2 (d_model 32), fitted at block 0: Ray's workers read it too."""
    import torch

    path = tmp_path_factory.mktemp("lens") / "j.pt"
    jac = torch.eye(32) + 0.2 * torch.randn(32, 32, generator=torch.Generator().manual_seed(0))
    torch.save({"J": {0: jac}, "n_prompts": 1, "source_layers": [0], "d_model": 32}, path)
    return path


@pytest.fixture(scope="module")
def in_process(tiny_model_dir, tiny_lm, jacobian_lens):
    import dataclasses

    spec = ModelSpec(str(tiny_model_dir("gpt2")), device="cpu")
    lm = tiny_lm("gpt2")
    settings = dataclasses.replace(SETTINGS, lens=("logit", f"jacobian:{jacobian_lens.resolve()}"))
    result = run(open_source(str(ROOT / "docs" / "article.md")), spec, settings, tokenizer=lm.tokenizer, lm=lm)
    return spec, lm, result


DRIVER = """
import functools, sys
from anatomy_cli.corpus import runner
runner.run = functools.partial(runner.run, crash_once=(sys.argv[1], 2))  # a worker dies at shard 2
from anatomy_cli.cli.main import app
app(args=sys.argv[2:])
"""


def test_a_worker_killed_mid_run_is_retried_and_ray_never_writes_to_stdout(in_process, tiny_model_dir, tmp_path,
                                                                          jacobian_lens):
    """Two Ray workers, one killed at its shard 2: the shard is retried and the figures equal the in-process run's
    to the last bit (merged in shard order); and `--ray --format json | jq` keeps working exactly when the retry
    did its job (issue 41 item 3): Ray's ``(raylet) A worker died…`` goes to stderr. One Ray (started by the
    command, as a user's run starts it) for the module. With the logit lens and a Jacobian lens (issue 48): each
    worker reads the lens file itself."""
    import json
    import subprocess
    import sys

    marker = tmp_path / "crashed"
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, "-c", DRIVER, str(marker), "corpus", str(ROOT / "docs" / "article.md"),
                          "--model", str(tiny_model_dir("gpt2")), "--ctx", "16", "--max-tokens", str(SETTINGS.max_tokens),
                          "--no-bos", "--heads", "--shard-windows", "2", "--batch-size", "2", "--ray", "--workers", "2",
                          "--lens", "logit", "--lens", f"jacobian:{jacobian_lens}", "--format", "json"],
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    assert marker.exists(), "no worker died: the test proves nothing"
    data = json.loads(res.stdout)  # the whole of stdout is the JSON document
    assert data["shards"] == 6 and data["windows"] == 12 and data["tokens"] == 192
    from anatomy_cli.output.views.corpus import with_nats  # the JSON's ce_nats beside ce_bits

    expected = json.loads(json.dumps(with_nats(in_process[2].stats.to_dict())))
    assert {k: data[k] for k in expected} == expected
    assert [lens["lens"] for lens in data["lenses"]] == ["logit", "jacobian"]
    assert data["lenses"][1]["unfitted"] == ["embed"] and data["lenses"][1]["layers"][1]["kl_nats"] > 0
    check = subprocess.run([sys.executable, "-m", "json.tool"], input=res.stdout, capture_output=True, text=True)
    assert check.returncode == 0
    assert "A worker died" in res.stderr
