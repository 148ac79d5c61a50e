"""`anatomy corpus` on a local Ray with 2 workers: the same answer as in-process, also when a worker dies mid-run.

The command runs in a child process on the session's one local Ray (conftest's ``ray_cluster``, joined with
--ray-address), with one of its workers killed mid-run. The command's own start of a local Ray (no address) is
checked without one: test_without_an_address_the_command_starts_its_own_local_ray_and_stops_it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from test_corpus_experts import CTX  # noqa: E402
from test_corpus_experts import N  # noqa: E402
from test_corpus_experts import _source  # noqa: E402
from test_corpus_experts import invoke  # noqa: E402

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
                                                                          jacobian_lens, ray_cluster):
    """Two Ray workers, one killed at its shard 2: the shard is retried and the figures equal the in-process run's
    to the last bit (merged in shard order); and `--ray --format json | jq` keeps working exactly when the retry
    did its job (issue 41 item 3): Ray's ``(raylet) A worker died…`` goes to stderr. On the session's Ray. With
    the logit lens and a Jacobian lens (issue 48): each worker reads the lens file itself."""
    import json
    import subprocess
    import sys

    marker = tmp_path / "crashed"
    res = subprocess.run([sys.executable, "-c", DRIVER, str(marker), "corpus", str(ROOT / "docs" / "article.md"),
                          "--model", str(tiny_model_dir("gpt2")), "--ctx", "16", "--max-tokens", str(SETTINGS.max_tokens),
                          "--no-bos", "--heads", "--shard-windows", "2", "--batch-size", "2", *ray_cluster.args(),
                          "--lens", "logit", "--lens", f"jacobian:{jacobian_lens}", "--format", "json"],
                         env=ray_cluster.env, capture_output=True, text=True, timeout=600)
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



def test_ray_workers_give_the_in_process_expert_sums(tiny_model_dir, tmp_path, ray_cluster):
    """`corpus --experts --ray` (tests/test_corpus_experts.py checks the sums themselves) equals the in-process run.
    One Ray worker runs the three shards (each worker a process importing torch: ~6 s): the driver merges the parts
    in shard order as it does from two (the test above has two, one killed), and a worker that kept a shard's sums
    into the next would show here."""
    src = _source(tmp_path)
    args = ["corpus", str(src), "--model", str(tiny_model_dir("mixtral")), "--ctx", str(CTX), "--max-tokens",
            str(CTX * N), "--no-bos", "--no-lens", "--experts", "--shard-windows", "2", "--batch-size", "2",
            "--format", "json"]
    ray = subprocess.run([sys.executable, "-m", "anatomy_cli", *args, *ray_cluster.args(workers=1)], env=ray_cluster.env,
                         capture_output=True, text=True, timeout=600)
    assert ray.returncode == 0, ray.stderr[-2000:]
    local = invoke(*args)
    assert local.exit_code == 0, local.output
    a, b = json.loads(ray.stdout), json.loads(local.stdout)
    assert a["shards"] == 3
    # The counts are exact; a worker's router runs its float32 softmax on its own threads, so a weight may differ in
    # its last bit (one mean_weight by 2e-9 relative on one machine): the weights to 1e-6.
    for key in ("expert_blocks", "experts", "expert_pairs"):
        assert len(a[key]) == len(b[key]), key
        for x, y in zip(a[key], b[key]):
            assert x == pytest.approx(y, rel=1e-6, abs=0), key
        assert [{k: v for k, v in r.items() if not isinstance(v, float)} for r in a[key]] == \
            [{k: v for k, v in r.items() if not isinstance(v, float)} for r in b[key]], key


class FakeRay:
    """The part of Ray that run_on_ray uses, in this process: an actor is the worker object itself and a task's
    ref is its result; records ``init`` and ``shutdown``."""

    class exceptions:  # Ray's own name
        RayError = RuntimeError

    def __init__(self, initialized: bool = False):
        self.initialized, self.calls = initialized, []

    def is_initialized(self) -> bool:
        return self.initialized

    def init(self, address, **kwargs):
        self.calls.append(("init", address, kwargs))
        self.initialized = True

    def shutdown(self):
        self.calls.append(("shutdown",))
        self.initialized = False

    def remote(self, **options):
        import types

        def actor_class(cls):
            def start(*args, **kwargs):
                obj = cls(*args, **kwargs)
                return types.SimpleNamespace(run=types.SimpleNamespace(remote=obj.run))
            return types.SimpleNamespace(remote=start)
        return actor_class

    def wait(self, refs, num_returns):
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref):
        return ref


class Echo:
    """A worker of run_on_ray's shape: ``run(shard)`` answers ``("part", shard.index)``."""

    def __init__(self, spec, settings, *, crash_once=None):
        pass

    def run(self, shard):
        return ("part", shard.index)


def _fake_run(monkeypatch, fake, address=None):
    import types

    from anatomy_cli.corpus import ray_run

    monkeypatch.setattr(ray_run, "ray_module", lambda: fake)
    got = []
    shards = [types.SimpleNamespace(index=i) for i in range(3)]
    spec = types.SimpleNamespace(to_dict=dict)
    ray_run.run_on_ray(iter(shards), spec, {}, lambda shard, part: got.append(part), address=address, workers=2,
                       worker=Echo)
    assert sorted(got) == [("part", 0), ("part", 1), ("part", 2)]


def test_without_an_address_the_command_starts_its_own_local_ray_and_stops_it(monkeypatch):
    """The tests above join the session's Ray; a user's plain `--ray` starts a local Ray of its own (never a
    cluster a `ray start` left), with a CPU per core and at least one per worker, and stops it after. With
    RAY_ADDRESS or --ray-address it joins that one (no CPU count), and stops what it joined; a Ray already
    initialised in the process is used as it is, neither started nor stopped."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake = FakeRay()
    _fake_run(monkeypatch, fake)
    quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    assert fake.calls == [("init", "local", quiet | {"num_cpus": max(2, os.cpu_count() or 1)}), ("shutdown",)]
    fake = FakeRay()
    _fake_run(monkeypatch, fake, address="ray://head:10001")
    assert fake.calls == [("init", "ray://head:10001", quiet), ("shutdown",)]
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    fake = FakeRay()
    _fake_run(monkeypatch, fake)
    assert fake.calls == [("init", "10.0.0.1:6379", quiet), ("shutdown",)]
    fake = FakeRay(initialized=True)
    _fake_run(monkeypatch, fake)
    assert fake.calls == []
