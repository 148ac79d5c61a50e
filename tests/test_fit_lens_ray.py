"""`anatomy fit-lens jacobian --ray` (issue 48): the prompts fitted on a local Ray with 2 workers, one of them
killed mid-run, equal the in-process fit and the merge of two ``--shard`` fits; Ray never writes to stdout.

One Ray, started by the command itself in a child process (as a user's run starts it), as tests/test_corpus_ray.py
does for `corpus --ray`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["The quick brown fox jumps over the lazy dog because it was tired of running in the sun",
         "short",
         "Once upon a time there was a small village at the edge of a dark forest",
         "In the beginning the universe was created and this has made a lot of people very angry"]
DRIVER = """
import functools, sys
from anatomy_cli.tasks import _jacobian_ray
_jacobian_ray.fit_on_ray = functools.partial(_jacobian_ray.fit_on_ray, crash_once=(sys.argv[1], 2))  # dies at shard 2
from anatomy_cli.cli.main import app
app(args=sys.argv[2:])
"""


def test_a_ray_fit_with_a_killed_worker_equals_the_in_process_fit_and_the_shard_merge(tiny_lm, tiny_model_dir,
                                                                                      tmp_path):
    pytest.importorskip("ray")
    lm = tiny_lm("llama")
    kw = dict(skip_first=4, dim_batch=16, dtype="fp32")
    here = api.fit_lens(lm, "jacobian", TEXTS, out=tmp_path / "here.pt", **kw)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(TEXTS) + "\n")
    common = ["fit-lens", "jacobian", "--model", str(tiny_model_dir("llama")), "--prompts", str(prompts),
              "--skip-first", "4", "--dim-batch", "16", "--dtype", "fp32", "--format", "json"]
    runner = CliRunner()
    for i in (0, 1):
        res = runner.invoke(app, [*common, "--out", str(tmp_path / f"s{i}.pt"), "--shard", f"{i}/2"])
        assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["fit-lens", "merge", str(tmp_path / "s0.pt"), str(tmp_path / "s1.pt"), "--out",
                              str(tmp_path / "merged.pt"), "--dtype", "fp32"])
    assert res.exit_code == 0, res.output

    marker = tmp_path / "crashed"
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": path}
    res = subprocess.run([sys.executable, "-c", DRIVER, str(marker), *common, "--out", str(tmp_path / "ray.pt"),
                          "--ray", "--workers", "2"], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert marker.exists(), "no worker died: the test proves nothing"
    data = json.loads(res.stdout)  # the whole of stdout is the JSON document: Ray wrote nothing there
    assert (data["n_prompts"], data["skipped"], data["kind"]) == (3, 1, "jacobian")
    assert data["model"] == str(tiny_model_dir("llama"))
    assert "backward passes per prompt: about" in res.stderr and "1 prompt skipped" in res.stderr
    ray_fit, in_process, merged = (torch.load(tmp_path / f, weights_only=True) for f in ("ray.pt", "here.pt",
                                                                                         "merged.pt"))
    assert ray_fit["n_prompts"] == in_process["n_prompts"] == merged["n_prompts"] == 3
    assert ray_fit["source_layers"] == in_process["source_layers"] == [0]
    for other in (in_process, merged):
        torch.testing.assert_close(ray_fit["J"][0], other["J"][0], atol=1e-6, rtol=1e-6)
    assert [b["frobenius"] for b in data["blocks"]] == pytest.approx([n for n in here.result.norms], rel=1e-6)


def test_ray_refusals_are_one_line(tiny_model_dir, tmp_path):
    runner = CliRunner()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(TEXTS[0] + "\n")
    model = str(tiny_model_dir("llama"))
    cases = [
        (["jacobian", "--prompts", str(prompts), "--out", str(tmp_path / "a.pt"), "--ray", "--checkpoint",
          str(tmp_path / "c")], "--checkpoint runs in-process (not with --ray)"),
        (["tuned", "--corpus", str(prompts), "--tokens", "64", "--out", str(tmp_path / "t"), "--ray"],
         "--ray: for fit-lens jacobian only"),
        (["tuned", "--corpus", str(prompts), "--tokens", "64", "--out", str(tmp_path / "t"), "--workers", "3"],
         "--workers: for fit-lens jacobian only"),
        (["jacobian", "--prompts", str(prompts), "--out", str(tmp_path / "a.pt"), "--checkpoint-every", "3"],
         "--checkpoint-every needs --checkpoint FILE"),
    ]
    for args, message in cases:
        res = runner.invoke(app, ["fit-lens", *args, "--model", model])
        assert res.exit_code == 2 and message in res.output, (args, res.output)
        assert len([line for line in res.output.splitlines() if line.strip()]) == 1, res.output


def test_the_api_on_ray_opens_the_model_only_and_adds_shards_in_order(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    """`fit_lens(name, ..., ray=True)` without a Ray: the runner replaced by one that builds the workers here and
    finishes the shards last to first; the sums are added in shard order and equal the in-process fit."""
    pytest.importorskip("ray")
    from anatomy_cli.corpus import ray_run

    lm = tiny_lm("llama")
    seen = []

    def here(shards, spec, settings, finished, *, worker, workers, **kwargs):
        actor = worker(spec.to_dict(), settings, lm=lm)
        for shard in reversed(list(shards)):
            seen.append(shard.index)
            finished(shard, actor.run(shard))

    monkeypatch.setattr(ray_run, "run_on_ray", here)
    kw = dict(skip_first=4, dim_batch=8, dtype="fp32", source_layers=[0])
    r = api.fit_lens(str(tiny_model_dir("llama")), "jacobian", TEXTS, out=tmp_path / "ray.pt", ray=True, workers=1,
                     **kw)
    assert seen == [3, 2, 1, 0] and (r.result.n_prompts, r.result.skipped) == (3, 1)
    assert r.data["model"] == str(tiny_model_dir("llama"))
    api.fit_lens(lm, "jacobian", TEXTS, out=tmp_path / "here.pt", **kw)
    ray_fit, in_process = (torch.load(tmp_path / f, weights_only=True) for f in ("ray.pt", "here.pt"))
    torch.testing.assert_close(ray_fit["J"][0], in_process["J"][0], atol=1e-6, rtol=1e-6)
