"""`anatomy circuit` --estimate, --offload and --labels (issue 49), on the tiny Llama with random transcoders.

--estimate: printed before any weight loads, its sizes recomputed here from the files' own headers and the
tokenizer, and bounding the real run's graph. --offload: the same graph, bit for bit, with the transcoders in
host memory or read from their files. --labels: a Neuronpedia export's descriptions land in ``clerp`` on the
nodes of exactly those (block, feature) pairs; a malformed export is a one-line error before the weights load.
"""

from __future__ import annotations

import json

import pytest
import torch
from test_circuit import invoke
from test_circuit import random_transcoders
from test_circuit import write_transcoder_set

PROMPT = "The capital of France is"


@pytest.fixture
def setting(tiny_model_dir, tiny_lm, tmp_path):
    """``(model dir, lm, transcoder folder, transcoders)``: 16 features per block, a skip path on every block."""
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm, skip=True)
    tdir = write_transcoder_set(tmp_path / "tc", lm, tcs)
    for layer, tc in enumerate(tcs):  # write_transcoder_set leaves W_skip out: add it to each file
        path = tdir / f"layer_{layer}.safetensors"
        save_file({**load_file(str(path)), "W_skip": tc.W_skip.contiguous()}, str(path))
    return tiny_model_dir("llama"), lm, tdir, tcs


def no_weights(monkeypatch):
    import anatomy_cli.cli.commands.circuit as command

    def refuse(*_a, **_k):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(command, "load_weights", refuse)


# ---------------------------------------------------------------- --estimate

def test_estimate_before_weights_from_the_headers(setting, monkeypatch):
    import numpy as np
    from safetensors.numpy import load_file
    from transformers import AutoTokenizer

    model, lm, tdir, tcs = setting
    no_weights(monkeypatch)
    args = ["circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir), "--bos",
            "--max-feature-nodes", "50", "--batch-size", "8", "--estimate"]
    result = invoke(*args, "-f", "json")
    assert result.exit_code == 0, result.stderr
    est = json.loads(result.stdout)
    hf = AutoTokenizer.from_pretrained(model)
    ids = [hf.bos_token_id] + hf(PROMPT, add_special_tokens=False).input_ids
    P, L, F, K = len(ids), lm.n_layers, 16, 10
    assert est["token_ids"] == ids and est["n_tokens"] == P and est["estimate"] is True
    bound = L * (P - 1) * F
    n = min(50, bound)
    N = n + (L + 1) * P + K
    assert (est["active_features_bound"], est["feature_rows"], est["n_nodes"]) == (bound, n, N)
    assert est["adjacency_bytes"] == 4 * N * N
    assert est["rows_bytes"] == 4 * (n + K) * (bound + (L + 1) * P + K)
    files = [load_file(str(tdir / f"layer_{i}.safetensors")) for i in range(L)]
    every = sum(a.astype(np.float32).nbytes for f in files for a in f.values())
    assert est["transcoder_bytes"] == every
    assert est["backward_passes"] == -(-K // 8) + -(-n // 8)
    assert est["seconds_expected"] > 0 and est["device"] == "cpu"
    assert sum(est[k] for k in ("adjacency_bytes", "rows_bytes", "setup_bytes", "transcoder_bytes",
                                "backward_bytes")) == est["memory_bytes"]
    disk = json.loads(invoke(*args, "--offload", "disk", "-f", "json").stdout)
    skips = sum(f["W_skip"].nbytes for f in files)
    assert disk["transcoder_bytes"] == every // L + skips  # one layer at a time, the skips stay
    table = invoke(*args, "-f", "tsv")
    assert table.exit_code == 0 and "adjacency_bytes\t" in table.stdout and "seconds_expected\t" in table.stdout


def test_estimate_with_heads_counts_its_replays(setting, monkeypatch):
    """``--estimate --heads 2``: the --heads replays bounded by the whole graph, in batches of --batch-size: a
    forward and backward per batch of targets (n + K), a held forward per batch of sources (N - K), a forward per
    batch of QK contributors (N - K) and the bias run, and the prompt's two replays; without --heads no such
    keys. The JSON says that they are an upper bound (``heads_bound``)."""
    model, _, tdir, _ = setting
    no_weights(monkeypatch)
    args = ["circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir), "--bos",
            "--max-feature-nodes", "50", "--batch-size", "8", "--estimate", "-f", "json"]
    plain = json.loads(invoke(*args).stdout)
    result = invoke(*args, "--heads", "2")
    assert result.exit_code == 0, result.stderr
    est = json.loads(result.stdout)
    assert not any(k.startswith("heads_") for k in plain)
    n, K, N = est["feature_rows"], est["n_logits"], est["n_nodes"]
    assert est["heads_passes"] == -(-(n + K) // 8) + 2 * -(-(N - K) // 8) + 1 + 3
    assert est["heads_flops"] > 0 and est["heads_seconds_expected"] > 0
    assert est["heads_bound"].startswith("an upper bound: counted as if pruning kept every node")
    assert {k: v for k, v in est.items() if not k.startswith("heads_") and k != "quantities"} == \
        {k: v for k, v in plain.items() if k != "quantities"}
    assert [r["quantity"] for r in est["quantities"]][-3:] == ["heads_passes", "heads_flops", "heads_seconds_expected"]


def test_heads_cost_line_and_estimate_are_one_count(setting, monkeypatch):
    """The cost line a ``--heads`` run prints and ``--estimate --heads`` come from one function of the counts
    (tasks/_circuit_estimate.py ``heads_cost``): the line's seconds are that function's at the run's kept counts,
    the estimate's are the same function's at the whole graph's, so at least the line's."""
    import re

    from anatomy_cli.tasks._circuit_estimate import heads_cost
    from anatomy_cli.units import human_seconds

    model, lm, tdir, _ = setting
    args = ["circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir), "--bos",
            "--max-feature-nodes", "50", "--batch-size", "8", "--heads", "1", "-f", "json"]
    est = json.loads(invoke(*args, "--estimate").stdout)
    run = invoke(*args)
    assert run.exit_code == 0, run.stderr
    line = next(x for x in run.stderr.splitlines() if x.startswith("circuit --heads:"))
    links, t, s, c = (int(v.replace(",", "")) for v in re.findall(r"([\d,]+) (?:edges|targets|sources|nodes)", line))
    P, n, K, N = est["n_tokens"], est["feature_rows"], est["n_logits"], est["n_nodes"]
    kept = heads_cost(lm.info, P, links, t, s, c, 8, "cpu")
    assert line == kept.line() and f"roughly {human_seconds(kept.seconds_expected)} on cpu" in line
    whole = heads_cost(lm.info, P, 0, n + K, N - K, N - K, 8, "cpu")
    assert (est["heads_passes"], est["heads_flops"], est["heads_seconds_expected"]) == \
        (whole.passes, whole.flops, whole.seconds_expected)
    assert whole.seconds_expected >= kept.seconds_expected and t <= n + K and s <= N - K and c <= N - K


def test_estimate_bounds_the_real_graph(setting, tmp_path):
    import anatomy_cli as anatomy

    _, lm, tdir, _ = setting
    est = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), max_feature_nodes=50, batch_size=8,
                          estimate=True).to_dict()
    res = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), max_feature_nodes=50, batch_size=8,
                          out=str(tmp_path / "g.pt"))
    real = res.graph.adjacency_matrix
    assert res.graph.active_features.shape[0] <= est["active_features_bound"]
    assert real.shape[0] <= est["n_nodes"] and real.numel() * 4 <= est["adjacency_bytes"]
    assert res.graph.n_features == est["feature_rows"] or res.graph.n_features == res.graph.active_features.shape[0]


def test_estimate_from_the_api_has_rows(setting):
    """The estimate's Result: ``.rows`` are its quantities (the table --estimate prints), in ``.to_dict()`` too,
    for a loaded model and for one given by name (opened, not loaded)."""
    import anatomy_cli as anatomy

    model, lm, tdir, _ = setting
    for given in (lm, str(model)):
        est = anatomy.circuit(given, PROMPT, transcoders=str(tdir), max_feature_nodes=50, batch_size=8,
                              estimate=True)
        data = est.to_dict()
        rows = est.rows
        assert [r["quantity"] for r in rows][:3] == ["n_tokens", "active_features_bound", "feature_rows"]
        assert rows == data["quantities"]
        for r in rows:
            assert r["value"] == data[r["quantity"]]
        assert data["feature_rows"] == min(50, data["active_features_bound"])
        assert "quantities" in repr(est) and est.seconds_expected == data["seconds_expected"]
    both = anatomy.circuit(lm, [PROMPT, PROMPT + " Paris"], transcoders=str(tdir), estimate=True)
    assert [len(b.rows) for b in both] == [len(rows)] * 2
    assert both[1].to_dict()["n_tokens"] > both[0].to_dict()["n_tokens"]


@pytest.mark.parametrize("flag", ["--out", "--json", "--plot"])
def test_estimate_refuses_outputs(setting, monkeypatch, tmp_path, flag):
    """--estimate computes no graph, so a file to write is a usage error before the model is even opened."""
    import anatomy_cli.cli.commands.circuit as command

    def refuse(*_a, **_k):
        raise AssertionError("model opened")

    monkeypatch.setattr(command, "open_texts", refuse)
    monkeypatch.setattr(command, "load_weights", refuse)
    model, _, tdir, _ = setting
    path = tmp_path / ("graph.html" if flag == "--plot" else "graph.out")
    result = invoke("circuit", PROMPT, "--model", str(model), "--transcoders", str(tdir), "--estimate",
                    flag, str(path))
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --estimate") and flag in lines[0]
    assert result.stdout == "" and not path.exists()


def test_api_estimate_refuses_outputs(setting, tmp_path):
    import anatomy_cli as anatomy
    from anatomy_cli.errors import UsageError

    _, lm, tdir, _ = setting
    for key in ("out", "json"):
        with pytest.raises(UsageError, match=f"^estimate= computes no graph: it writes no {key}= file"):
            anatomy.circuit(lm, PROMPT, transcoders=str(tdir), estimate=True, **{key: str(tmp_path / "g")})


# ---------------------------------------------------------------- --offload

def test_offload_gives_the_same_graph(setting, tmp_path):
    model, lm, tdir, _ = setting
    graphs = {}
    for how in (None, "cpu", "disk"):
        out = tmp_path / f"{how}.pt"
        extra = [] if how is None else ["--offload", how]
        result = invoke("circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir),
                        "--max-feature-nodes", "30", "--batch-size", "8", "--check", "3", "--out", str(out),
                        "-f", "json", *extra)
        assert result.exit_code == 0, result.stderr
        graphs[how] = (torch.load(out, weights_only=False, pickle_module=_pickle()), json.loads(result.stdout))
        if how == "cpu":
            assert "--offload cpu: the model runs on the CPU" in result.stderr
    base, base_json = graphs[None]
    for how in ("cpu", "disk"):
        g, data = graphs[how]
        for key in ("adjacency_matrix", "active_features", "selected_features", "activation_values"):
            assert torch.equal(g[key], base[key]), (how, key)
        assert data["paths"] == base_json["paths"] and data["check"] == base_json["check"]


def test_disk_offload_keeps_only_the_skip_paths(setting):
    from anatomy_cli.engine.replacement import Offloaded
    from anatomy_cli.engine.replacement import open_transcoders
    from anatomy_cli.models import transcoders as files

    _, lm, tdir, tcs = setting
    ts = files.describe(tdir)
    held = open_transcoders(ts, lm.device, "disk")
    assert all(isinstance(t, Offloaded) and not hasattr(t, "W_enc") for t in held)
    for t, want in zip(held, tcs):
        assert torch.equal(t.W_skip, want.W_skip)
        with t.weights() as full:
            assert torch.equal(full.W_enc, want.W_enc) and torch.equal(full.W_dec, want.W_dec)


def test_cpu_offload_off_the_cpu_moves_one_block_when_used(setting):
    """With the model on another device (here "meta": no accelerator needed), --offload cpu keeps each block's
    transcoder in host memory, its W_skip on the device, and moves the whole block there only inside weights()."""
    from anatomy_cli.engine.replacement import Offloaded
    from anatomy_cli.engine.replacement import open_transcoders
    from anatomy_cli.models import transcoders as files

    _, _, tdir, tcs = setting
    held = open_transcoders(files.describe(tdir), torch.device("meta"), "cpu")
    for t, want in zip(held, tcs):
        assert isinstance(t, Offloaded) and t.W_skip.device.type == "meta" and t.W_skip.shape == want.W_skip.shape
        with t.weights() as full:
            assert full.W_enc.device.type == "meta" and full.W_enc.shape == want.W_enc.shape
        assert torch.equal(t.load.args[0].W_enc, want.W_enc)  # the host copy: the file's values


def test_offload_refuses_other_places(setting):
    model, _, tdir, _ = setting
    bad = invoke("circuit", PROMPT, "--model", str(model), "--transcoders", str(tdir), "--offload", "gpu")
    assert bad.exit_code == 2 and bad.stderr.strip() == "error: --offload takes cpu or disk, not 'gpu'"


def _pickle():
    from test_circuit import _stub_pickle

    return _stub_pickle()


# ---------------------------------------------------------------- --labels

def test_labels_fill_clerp_on_exactly_their_nodes(setting, tmp_path):
    model, lm, tdir, _ = setting
    base = ["circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir),
            "--max-feature-nodes", "40", "--batch-size", "8", "--node-threshold", "1", "--edge-threshold", "1"]
    first = invoke(*base, "--json", str(tmp_path / "plain.json"))
    assert first.exit_code == 0, first.stderr
    feats = [n for n in json.loads((tmp_path / "plain.json").read_text())["nodes"] if n["feature_type"] ==
             "cross layer transcoder"]
    assert len(feats) >= 3 and all(n["clerp"] == "" for n in feats)
    chosen = {}
    for n in feats:  # node_id = {block}_{feature}_{pos}: label two (block, feature) pairs
        block, feature, _ = map(int, n["node_id"].split("_"))
        chosen.setdefault((block, feature), f"block {block} feature {feature}: capitals")
        if len(chosen) == 2:
            break
    export = [{"modelId": "tiny", "layer": f"{b}-transcoder", "index": str(f), "description": d,
               "explanationModelName": "test"} for (b, f), d in chosen.items()]
    export.append({"modelId": "tiny", "layer": f"{lm.n_layers + 3}-transcoder", "index": "1", "description": "no"})
    labels = tmp_path / "explanations.json"
    labels.write_text(json.dumps(export))
    run = invoke(*base, "--json", str(tmp_path / "labelled.json"), "--labels", str(labels))
    assert run.exit_code == 0, run.stderr
    for n in json.loads((tmp_path / "labelled.json").read_text())["nodes"]:
        if n["feature_type"] != "cross layer transcoder":
            continue
        block, feature, _ = map(int, n["node_id"].split("_"))
        assert n["clerp"] == chosen.get((block, feature), ""), n["node_id"]
    labelled = {n["node_id"] for n in json.loads((tmp_path / "labelled.json").read_text())["nodes"] if n["clerp"]
                and n["feature_type"] == "cross layer transcoder"}
    assert labelled == {n["node_id"] for n in feats if tuple(map(int, n["node_id"].split("_")[:2])) in chosen}


@pytest.mark.parametrize("content,words", [("[{\"layer\": \"1-tc\", ", "cannot be read"),
                                           ("{\"layer\": \"1-tc\"}", "not a Neuronpedia explanations export"),
                                           ("[{\"description\": \"x\"}]", "no record names a feature")])
def test_malformed_labels_are_one_line_before_weights(setting, tmp_path, monkeypatch, content, words):
    model, _, tdir, _ = setting
    no_weights(monkeypatch)
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    result = invoke("circuit", PROMPT, "--model", str(model), "--transcoders", str(tdir), "--labels", str(bad))
    assert result.exit_code in (1, 2) and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --labels") and words in lines[0], lines


# ---------------------------------------------------------------- labels by default, --features-dir (issue 60 item 3)

def _labelled_base(model, tdir):
    return ["circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir),
            "--max-feature-nodes", "40", "--batch-size", "8", "--node-threshold", "1", "--edge-threshold", "1",
            "--top", "40"]


def _feature_pairs(graph: dict) -> list[tuple[int, int]]:
    return [tuple(map(int, n["node_id"].split("_")[:2])) for n in graph["nodes"]
            if n["feature_type"] == "cross layer transcoder"]


def test_labels_beside_the_transcoders_reach_the_table_json_and_plot(setting, tmp_path):
    from anatomy_cli.output.html import esc

    model, lm, tdir, _ = setting
    base = _labelled_base(model, tdir)
    assert invoke(*base, "--json", str(tmp_path / "plain.json")).exit_code == 0
    pairs = _feature_pairs(json.loads((tmp_path / "plain.json").read_text()))
    chosen = {p: f"block {p[0]} feature {p[1]} <is> labelled" for p in pairs[:3]}
    records = [{"modelId": "tiny", "layer": f"{b}-tc", "index": str(f), "description": d} for (b, f), d in
               chosen.items()]
    (tdir / "explanations.json").write_text(json.dumps(records))
    page = tmp_path / "graph.html"
    run = invoke(*base, "--json", str(tmp_path / "beside.json"), "--plot", str(page), "-f", "json")
    assert run.exit_code == 0, run.stderr
    graph = json.loads((tmp_path / "beside.json").read_text())
    for n in graph["nodes"]:
        if n["feature_type"] == "cross layer transcoder":
            assert n["clerp"] == chosen.get(tuple(map(int, n["node_id"].split("_")[:2])), ""), n["node_id"]
    assert graph["metadata"]["feature_labels"]["sources"] == [f"{tdir / 'explanations.json'} (beside the transcoders)"]
    data = json.loads(run.stdout)
    for row in data["paths"]:
        pair = tuple(map(int, row["node"].split("_")[:2])) if row["kind"] == "cross layer transcoder" else None
        assert row["label"] == chosen.get(pair, ""), row["node"]
    html = page.read_text()
    assert all(esc(d) in html for d in chosen.values())
    table = invoke(*base, "-f", "table")
    assert "label: from" in table.stdout and "beside the transcoders" in table.stdout
    given = tmp_path / "given.json"
    given.write_text(json.dumps([{**r, "description": "given"} for r in records]))
    graph = json.loads(invoke(*base, "--labels", str(given), "-f", "json").stdout)
    assert {r["label"] for r in graph["paths"] if r["kind"] == "cross layer transcoder"} <= {"given", ""}
    assert graph["feature_labels"]["sources"] == [f"--labels {given}"]


def test_features_dir_gives_top_tokens_and_dashboard_links(setting, tmp_path):
    """A `features --out` run on block 0 of the circuit's own transcoders: circuit shows its top tokens (marked,
    not as labels) for block 0's unlabelled features and links each block-0 node to its panel in
    DIR/features.html. One made from another dictionary of the same hook point is refused (its ids name other
    features: a new-user trial's)."""
    from test_features import TEXT
    from test_features import write_sae

    model, lm, tdir, _ = setting
    (tmp_path / "corpus.txt").write_text(TEXT)
    common = ("--corpus", str(tmp_path / "corpus.txt"), "--model", str(model), "--device", "cpu", "--ctx", "16",
              "--max-tokens", "48", "--cooccur", "0")
    tc = write_sae(tmp_path / "tc0")
    cfg = json.loads((tc / "cfg.json").read_text())
    cfg["metadata"].update(hook_name="blocks.0.ln2.hook_normalized", hook_name_out="blocks.0.hook_mlp_out")
    (tc / "cfg.json").write_text(json.dumps(cfg))
    other = tmp_path / "other"
    assert invoke("features", str(tc), *common, "--out", str(other), "-f", "json").exit_code == 0
    refused = invoke(*_labelled_base(model, tdir), "--features-dir", str(other))
    assert refused.exit_code == 2 and f"made from {tc.resolve()}, not from these transcoders' block 0" in \
        " ".join(refused.stderr.split()), refused.stderr
    feats = tmp_path / "feats"
    feats.mkdir()
    made = invoke("features", str(tdir), "--hook", "0", *common, "--out", str(feats), "--plot",
                  str(feats / "features.html"), "-f", "json")
    assert made.exit_code == 0, made.output
    effects = json.loads(made.stdout)["logit_effects"]
    page = tmp_path / "graph.html"
    run = invoke(*_labelled_base(model, tdir), "--features-dir", str(feats), "--json", str(tmp_path / "g.json"),
                 "--plot", str(page), "-f", "json")
    assert run.exit_code == 0, run.stderr
    meta = json.loads((tmp_path / "g.json").read_text())["metadata"]["feature_labels"]
    uri = (feats / "features.html").resolve().as_uri()
    assert meta["dashboards"] == {"0": uri} and meta["sources"] == []
    from anatomy_cli.text.display import visible

    def tops(f: int) -> str:
        rows = sorted((r for r in effects if r["feature"] == f and r["side"] == "top"), key=lambda r: r["rank"])
        return " ".join(visible(r["token"]) for r in rows[:3])

    block0 = {f for b, f in _feature_pairs(json.loads((tmp_path / "g.json").read_text())) if b == 0}
    assert block0 and meta["top_tokens"] == {f"0_{f}": tops(f) for f in sorted(block0)}
    for row in json.loads(run.stdout)["paths"]:
        if row["kind"] == "cross layer transcoder" and row["node"].startswith("0_"):
            assert row["label"] == f"top tokens: {tops(int(row['node'].split('_')[1]))}"
    html = page.read_text()
    assert all(f"{uri}#f-{f}" in html for f in block0) and "top tokens (no label)" in html


def test_features_dir_of_a_circuit_tracer_set_s_block_lands_on_that_block(setting, tmp_path):
    """`features SET --hook 1` on the circuit's own transcoder set (circuit-tracer's layout, read by
    models/ct_block.py): `circuit --features-dir` reads that export's block as 1 (not refused as unreadable) and
    puts its top tokens on block 1's feature nodes only."""
    from test_features import TEXT

    from anatomy_cli.text.display import visible

    model, lm, tdir, _ = setting
    (tmp_path / "corpus.txt").write_text(TEXT)
    feats = tmp_path / "feats"
    made = invoke("features", str(tdir), "--hook", "1", "--corpus", str(tmp_path / "corpus.txt"), "--model",
                  str(model), "--device", "cpu", "--ctx", "16", "--max-tokens", "48", "--cooccur", "0", "--out",
                  str(feats), "-f", "json")
    assert made.exit_code == 0, made.output
    effects = json.loads(made.stdout)["logit_effects"]
    run = invoke(*_labelled_base(model, tdir), "--features-dir", str(feats), "--json", str(tmp_path / "g.json"))
    assert run.exit_code == 0, run.stderr
    graph = json.loads((tmp_path / "g.json").read_text())

    def tops(f: int) -> str:
        rows = sorted((r for r in effects if r["feature"] == f and r["side"] == "top"), key=lambda r: r["rank"])
        return " ".join(visible(r["token"]) for r in rows[:3])

    block1 = {f for b, f in _feature_pairs(graph) if b == 1}
    assert block1 and graph["metadata"]["feature_labels"]["top_tokens"] == {f"1_{f}": tops(f) for f in sorted(block1)}
