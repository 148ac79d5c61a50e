"""`corpus --ray-address` on a Ray cluster started the way users start one (issue 41 item 8), on loopback:
``ray start --head`` and a second ``ray start --address=…`` node; workers on both; the result equals the
in-process run bit for bit; killing the second node's raylet mid-run loses nothing.

Slow (two Ray nodes, three model loads): it runs with ``ANATOMY_SLOW_TESTS=1`` only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.skipif(os.environ.get("ANATOMY_SLOW_TESTS") != "1",
                                reason="slow: two Ray nodes (set ANATOMY_SLOW_TESTS=1)")

ROOT = Path(__file__).resolve().parents[1]
# The driver: the command itself, with workers that take 0.3 s a shard (a class defined here travels to the
# actors by value), so that the second node can be killed while it holds shards.
DRIVER = """
import sys, time
from anatomy_cli.corpus import worker

class Slow(worker.Worker):
    def __call__(self, shard, on_window=None):
        time.sleep(0.3)
        return super().__call__(shard, on_window)

worker.Worker = Slow
from anatomy_cli.cli.main import app
app(args=sys.argv[1:])
"""


def processes(*marks: str) -> list:
    """The processes whose command line holds one of ``marks`` (this test's own ports), with their children
    (Ray's workers rename themselves): ended by id, never Ray's broad ``ray stop``, which would end other
    Ray sessions on the machine too."""
    roots = [p for p in psutil.process_iter(["cmdline"]) if p.pid != os.getpid() and
             any(m in a for a in (p.info["cmdline"] or []) for m in marks)]
    found = {}
    for p in roots:
        for q in [p, *p.children(recursive=True)]:
            found[q.pid] = q
    return list(found.values())


def kill(procs: list) -> None:
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_two_node_cluster_equals_in_process_and_survives_a_node(tiny_model_dir, tmp_path):
    ray_cli = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    # RAY_AUTH_MODE: a ~/.ray/auth_token left by another tool makes a head expect tokens its nodes do not send.
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    temp = tempfile.mkdtemp(prefix="anatomy-ray-", dir="/tmp")  # short: Ray's socket paths live below it
    port, node_port = free_port(), free_port()
    address = f"127.0.0.1:{port}"
    args = ["corpus", str(ROOT / "docs" / "article.md"), "--model", str(tiny_model_dir("gpt2")), "--ctx", "16",
            "--max-tokens", str(16 * 24), "--shard-windows", "1", "--heads", "--format", "json"]
    whole = subprocess.run([sys.executable, "-m", "anatomy_cli", *args], env=env, capture_output=True, text=True,
                           timeout=300)
    assert whole.returncode == 0, whole.stderr
    start = [ray_cli, "start", "--node-ip-address=127.0.0.1", "--disable-usage-stats"]
    try:
        subprocess.run([*start, "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
                        f"--temp-dir={temp}"],
                       env=env, check=True, capture_output=True, timeout=300)
        subprocess.run([*start, f"--address={address}", "--num-cpus=1", f"--node-manager-port={node_port}"],
                       env=env, check=True, capture_output=True, timeout=300)
        out = tmp_path / "run"
        proc = subprocess.Popen([sys.executable, "-c", DRIVER, *args, "--ray", "--ray-address", address,
                                 "--workers", "2", "--out", str(out)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            manifest = out / "manifest.json"
            if manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 4:
                break
            time.sleep(0.1)
        second = processes(f"--node_manager_port={node_port}")
        assert second, "the second node's raylet was not found"
        kill(second)  # the second node dies mid-run, with its worker and the shards it held
        done_at_kill = len(json.loads((out / "manifest.json").read_text())["shards"])
        stdout, stderr = proc.communicate(timeout=600)
        assert proc.returncode == 0, stderr[-3000:]
        assert done_at_kill < 24, "the run ended before the node was killed: the test proves nothing"
        # bit for bit: every figure, merged in shard order, equals the in-process run's
        a, b = json.loads(stdout), json.loads(whole.stdout)
        assert (a["layers"], a["heads"], a["tokens"]) == (b["layers"], b["heads"], b["tokens"])
    finally:
        kill(processes(temp, f"--gcs_server_port={port}", f"--node_manager_port={node_port}"))
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_job_submit_runs_the_command_on_the_cluster(tiny_model_dir, tmp_path):
    """`ray job submit` of the same command against a `ray start --head` with its dashboard (loopback): the job
    succeeds and its JSON (redirected to a file by the entrypoint) equals the in-process run's figures."""
    pytest.importorskip("aiohttp", reason="ray job submit needs the dashboard: pip install 'ray[default]'")
    ray_cli = shutil.which("ray") or str(Path(sys.executable).parent / "ray")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    temp = tempfile.mkdtemp(prefix="anatomy-ray-", dir="/tmp")
    port, dash = free_port(), free_port()
    args = ["corpus", str(ROOT / "docs" / "article.md"), "--model", str(tiny_model_dir("gpt2")), "--ctx", "16",
            "--max-tokens", "128", "--shard-windows", "2", "--format", "json"]
    whole = subprocess.run([sys.executable, "-m", "anatomy_cli", *args], env=env, capture_output=True, text=True,
                           timeout=300)
    assert whole.returncode == 0, whole.stderr
    result = tmp_path / "result.json"
    command = " ".join([sys.executable, "-m", "anatomy_cli", *args, "--ray", "--workers", "2", ">", str(result)])
    try:
        subprocess.run([ray_cli, "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
                        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
                        f"--temp-dir={temp}", "--disable-usage-stats"], env=env, check=True, capture_output=True,
                       timeout=300)
        job = subprocess.run([ray_cli, "job", "submit", "--address", f"http://127.0.0.1:{dash}", "--", "sh", "-c",
                              command], env=env, capture_output=True, text=True, timeout=600)
        assert job.returncode == 0 and "succeeded" in job.stdout, (job.stdout + job.stderr)[-3000:]
        a, b = json.loads(result.read_text()), json.loads(whole.stdout)
        assert (a["layers"], a["tokens"]) == (b["layers"], b["tokens"])
    finally:
        kill(processes(temp, f"--gcs_server_port={port}", f"--dashboard-port={dash}", f"--dashboard_port={dash}"))
        shutil.rmtree(temp, ignore_errors=True)
