"""`anatomy fit-lens jacobian --ray` (issue 48): the prompts fitted on a local Ray, its worker killed mid-run and
restarted, equal the in-process fit and the merge of two ``--shard`` fits; Ray never writes to stdout.

The command runs in a child process on the session's one Ray (conftest's ``ray_cluster``, joined with
--ray-address), as tests/test_corpus_ray.py does for `corpus --ray`.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

TEXTS = ["The quick brown fox jumps over the lazy dog because it was tired of running in the sun",
         "short",
         "Once upon a time there was a small village at the edge of a dark forest",
         "In the beginning the universe was created and this has made a lot of people very angry"]


def test_ray_refusals_are_one_line(tiny_model_dir, tmp_path):
    runner = CliRunner()
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(TEXTS[0] + "\n")
    model = str(tiny_model_dir("llama"))
    cases = [
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
    from anatomy_cli.tasks import _jacobian_ray

    lm = tiny_lm("llama")
    seen = []

    def here(shards, spec, settings, finished, *, worker, workers, **kwargs):
        actor = worker(spec.to_dict(), settings, lm=lm)
        for shard in reversed(list(shards)):
            seen.append(shard.index)
            finished(shard, actor.run(shard))

    monkeypatch.setattr(_jacobian_ray, "run_on_ray", here)  # where the Jacobian fit reads it
    kw = dict(skip_first=4, dim_batch=8, dtype="fp32", source_layers=[0])
    r = api.fit_lens(str(tiny_model_dir("llama")), "jacobian", TEXTS, out=tmp_path / "ray.pt", ray=True, workers=1,
                     **kw)
    assert seen == [3, 2, 1, 0] and (r.result.n_prompts, r.result.skipped) == (3, 1)
    assert r.data["model"] == str(tiny_model_dir("llama"))
    api.fit_lens(lm, "jacobian", TEXTS, out=tmp_path / "here.pt", **kw)
    ray_fit, in_process = (torch.load(tmp_path / f, weights_only=True) for f in ("ray.pt", "here.pt"))
    torch.testing.assert_close(ray_fit["J"][0], in_process["J"][0], atol=1e-6, rtol=1e-6)


def _ray_here(monkeypatch, lm, seen, stop_after=None):
    """``run_on_ray`` replaced by one that builds the worker here and finishes the shards last to first;
    ``stop_after``: a KeyboardInterrupt (the driver killed) once that many shards have finished."""
    from anatomy_cli.tasks import _jacobian_ray

    def here(shards, spec, settings, finished, *, worker, workers, **kwargs):
        actor = worker(spec.to_dict(), settings, lm=lm)
        for shard in reversed(list(shards)):
            if stop_after is not None and len(seen) == stop_after:
                raise KeyboardInterrupt
            seen.append(shard.index)
            finished(shard, actor.run(shard))

    monkeypatch.setattr(_jacobian_ray, "run_on_ray", here)  # where the Jacobian fit reads it


def test_a_ray_fit_checkpoints_each_finished_prompt_and_resumes_in_either_way(tiny_lm, tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    """`--ray --checkpoint`: a shard per prompt; the driver, interrupted after prompts 3 and 2 finished (out of
    order, as Ray returns them), leaves a checkpoint holding exactly those; resumed on Ray it sends prompts 1 and
    0 only, and the lens equals the uninterrupted in-process fit. The one file layout resumes across the two:
    the Ray checkpoint in this process, and an in-process checkpoint (prompts 0 and 1) on Ray."""
    pytest.importorskip("ray")
    from anatomy_cli.engine import jacobian_fit

    lm = tiny_lm("llama")
    model = str(tiny_model_dir("llama"))
    kw = dict(skip_first=4, dim_batch=8, dtype="fp32", source_layers=[0])
    api.fit_lens(lm, "jacobian", TEXTS, out=tmp_path / "whole.pt", **kw)
    whole = torch.load(tmp_path / "whole.pt", weights_only=True)

    ckpt, seen = tmp_path / "ray.ckpt", []
    _ray_here(monkeypatch, lm, seen, stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        api.fit_lens(model, "jacobian", TEXTS, out=tmp_path / "a.pt", ray=True, workers=1, checkpoint=ckpt, **kw)
    state = torch.load(ckpt, weights_only=True)
    assert seen == [3, 2] and not (tmp_path / "a.pt").exists()
    assert (state["done"], state["next_idx"], state["n_done"], state["skipped"]) == ([2, 3], 0, 2, 0)
    # the sums it holds are prompts 2 and 3's J, computed here in-process
    two = {0: torch.zeros(lm.info.d_model, lm.info.d_model, dtype=torch.float64)}
    ids = [lm.tokenizer.hf(t)["input_ids"][:128] for t in TEXTS[2:]]
    for i in ids:
        assert jacobian_fit.accumulate(lm, two, i, [0], lm.info.n_layers - 1, dim_batch=8, skip_first=4)
    torch.testing.assert_close(state["jacobian_sum"][0], two[0], atol=1e-6, rtol=1e-6)
    import shutil

    shutil.copy(ckpt, tmp_path / "copy.ckpt")
    seen.clear()
    _ray_here(monkeypatch, lm, seen)
    r = api.fit_lens(model, "jacobian", TEXTS, out=tmp_path / "a.pt", ray=True, workers=1, checkpoint=ckpt, **kw)
    assert seen == [1, 0] and (r.result.n_prompts, r.result.skipped) == (3, 1)
    assert torch.load(ckpt, weights_only=True)["done"] == [0, 1, 2, 3]
    torch.testing.assert_close(torch.load(tmp_path / "a.pt", weights_only=True)["J"][0], whole["J"][0],
                               atol=1e-6, rtol=1e-6)
    # the Ray checkpoint resumed in this process: prompts 0 and 1 fitted here
    r = api.fit_lens(lm, "jacobian", TEXTS, out=tmp_path / "b.pt", checkpoint=tmp_path / "copy.ckpt", **kw)
    assert (r.result.n_prompts, r.result.skipped) == (3, 1)
    torch.testing.assert_close(torch.load(tmp_path / "b.pt", weights_only=True)["J"][0], whole["J"][0],
                               atol=1e-6, rtol=1e-6)
    # an in-process checkpoint (interrupted at the third prompt) resumed on Ray: prompts 3 and 2 sent
    _interrupted_at_the_second_prompt(monkeypatch, lambda: api.fit_lens(
        lm, "jacobian", TEXTS, out=tmp_path / "c.pt", checkpoint=tmp_path / "here.ckpt", **kw))
    assert torch.load(tmp_path / "here.ckpt", weights_only=True)["done"] == [0, 1]
    seen.clear()
    r = api.fit_lens(model, "jacobian", TEXTS, out=tmp_path / "c.pt", ray=True, workers=1,
                     checkpoint=tmp_path / "here.ckpt", **kw)
    assert seen == [3, 2] and (r.result.n_prompts, r.result.skipped) == (3, 1)
    torch.testing.assert_close(torch.load(tmp_path / "c.pt", weights_only=True)["J"][0], whole["J"][0],
                               atol=1e-6, rtol=1e-6)
    # other settings are refused on Ray too, before any worker starts
    seen.clear()
    with pytest.raises(UsageError, match="other settings \\(skip_first\\)"):
        api.fit_lens(model, "jacobian", TEXTS, out=tmp_path / "d.pt", ray=True, checkpoint=ckpt,
                     **{**kw, "skip_first": 5})
    assert seen == []


def _interrupted_at_the_second_prompt(monkeypatch, fit):
    """``fit()`` interrupted (KeyboardInterrupt) as its second prompt's fit starts; the fit function restored."""
    from anatomy_cli.engine import jacobian_fit

    real, calls = jacobian_fit.jacobian_for_prompt, []

    def dies_on_the_second_fit(*args, **kwargs):  # call 1 is the cost line's probe (a forward and three passes)
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(jacobian_fit, "jacobian_for_prompt", dies_on_the_second_fit)
    with pytest.raises(KeyboardInterrupt):
        fit()
    monkeypatch.setattr(jacobian_fit, "jacobian_for_prompt", real)


DRIVER = """
import functools, sys
from anatomy_cli.tasks import _jacobian_ray
_jacobian_ray.fit_on_ray = functools.partial(_jacobian_ray.fit_on_ray, crash_once=(sys.argv[1], 3))  # dies at prompt 3
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError
app(args=sys.argv[2:])
"""


def test_a_partial_checkpoint_resumed_on_a_local_ray_with_a_killed_worker_equals_the_fit_and_the_shard_merge(
        tiny_lm, tiny_model_dir, tmp_path, monkeypatch, ray_cluster):
    """A real local Ray (its worker killed as it reaches prompt 3, mid-prompt, and restarted by Ray: one kill, one
    retry; a second worker would only add a process importing torch, ~7 CPU-s) resuming a checkpoint that holds
    prompts 0 and 1 (an in-process fit interrupted at its third prompt): prompts 2 and 3 are fitted, the checkpoint
    then holds all four, Ray writes nothing to stdout, and the lens equals the uninterrupted in-process fit and the
    merge of two ``--shard`` fits. One Ray run for both properties (a Ray run costs ~20 s, most of it starting the
    workers): the Ray fit without a checkpoint (shards of several prompts, added in shard order) differs from this
    one only in how the driver plans and adds the shards, which test_the_api_on_ray_opens_the_model_only_and_adds_
    shards_in_order checks with the shards finishing last to first."""
    lm = tiny_lm("llama")
    kw = dict(skip_first=4, dim_batch=16, dtype="fp32")
    here = api.fit_lens(lm, "jacobian", TEXTS, out=tmp_path / "whole.pt", **kw)
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
    ckpt = tmp_path / "fit.ckpt"
    _interrupted_at_the_second_prompt(monkeypatch, lambda: api.fit_lens(
        lm, "jacobian", TEXTS, out=tmp_path / "ray.pt", checkpoint=ckpt, **kw))
    assert torch.load(ckpt, weights_only=True)["done"] == [0, 1]

    marker = tmp_path / "crashed"
    res = subprocess.run([sys.executable, "-c", DRIVER, str(marker), *common, "--out", str(tmp_path / "ray.pt"),
                          *ray_cluster.args(workers=1), "--checkpoint", str(ckpt)],
                         env=ray_cluster.env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert marker.exists(), "no worker died: the test proves nothing"
    assert "resuming from" in res.stderr and "2 of 4 prompts done" in res.stderr
    assert "backward passes per prompt: about" in res.stderr and "1 prompt skipped" in res.stderr
    data = json.loads(res.stdout)  # the whole of stdout is the JSON document: Ray wrote nothing there
    assert (data["n_prompts"], data["skipped"], data["kind"]) == (3, 1, "jacobian")
    assert data["model"] == str(tiny_model_dir("llama"))
    state = torch.load(ckpt, weights_only=True)
    assert (state["done"], state["next_idx"], state["n_done"], state["skipped"]) == ([0, 1, 2, 3], 4, 3, 1)
    ray_fit, whole, merged = (torch.load(tmp_path / f, weights_only=True) for f in ("ray.pt", "whole.pt",
                                                                                    "merged.pt"))
    assert ray_fit["n_prompts"] == whole["n_prompts"] == merged["n_prompts"] == 3
    assert ray_fit["source_layers"] == whole["source_layers"] == [0]
    for other in (whole, merged):
        torch.testing.assert_close(ray_fit["J"][0], other["J"][0], atol=1e-6, rtol=1e-6)
    assert [b["frobenius"] for b in data["blocks"]] == pytest.approx([n for n in here.result.norms], rel=1e-6)
