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
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
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
