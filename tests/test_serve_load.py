"""`anatomy serve` under load (issue 27), bounded: 32 concurrent clients over two tiny models, every answer
equal to its in-process twin, none lost. The figure with real client processes and latencies is
benchmarks/bench_serve_load.py (docs/serve.md)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from serve_helpers import decoded
from serve_helpers import in_process
from serve_helpers import private_dir
from serve_helpers import raw_run
from serve_helpers import thread_server


def mixed(model) -> list[tuple[list[str], str | None]]:
    m = ["--model", str(model)]
    return [(["trace", "Thank you very", *m, "--format", "json"], None),
            (["next", "-", *m, "--format", "jsonl"], "Thank you very\nOne, two, three,\n"),
            (["tokens", "Hello world", *m], None),
            (["next", "x", *m, "--target", "much more"], None)]   # a usage error: exit 2


def test_thirty_two_concurrent_clients_over_two_models(tmp_path, tiny_model_dir, cached_load):
    models = [tiny_model_dir("gpt2"), tiny_model_dir("llama")]
    jobs = [job for model in models for job in mixed(model)] * 4   # 32 requests at once
    twins = {tuple(args): in_process(args, stdin) for model in models for args, stdin in mixed(model)}
    sock = private_dir(tmp_path) / "s.sock"
    srv, thread = thread_server(sock)
    srv.preload([str(m) for m in models])
    try:
        def one(job):
            args, stdin = job
            return raw_run(sock, args, stdin=stdin or "")[-1]

        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(one, jobs))
        assert srv.requests == len(jobs)
    finally:
        srv.stopping.set()
        thread.join(10)
    for (args, _), answer in zip(jobs, answers):
        assert decoded(answer)[:2] == twins[tuple(args)], args
    assert {decoded(a)[0] for a in answers} == {0, 2}
