"""`anatomy circuit`'s output (issue 61 item 9, issue 62 items 4 and 6).

- The paths table's "strongest source" is each row's strongest kept incoming edge read from the adjacency matrix by
  node index (any kind of source: feature, error node, token), checked against the matrix and masks here; error nodes
  and tokens, the graph's inputs, say "(input)" with a note (a graph whose rows were all error nodes showed an empty
  column with no word why).
- Node ids: circuit-tracer's current ones by default (error ``{block}_-1_{pos}``): unique, and each parses back to
  (layer, feature, position); ``--ids ct-0.5`` writes 0.5.0's and refuses, in one line naming the id, a graph where two
  nodes would share one (the collision built by hand and met on a tiny model), writing no file.
- ``wrote PATH`` on stderr for every file (--out, --json, --plot), one per prompt of a stdin batch (numbered as
  --plot's); a piped batch prints each prompt's heading (its node and edge counts) and notes naming their prompt.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from test_circuit import invoke
from test_circuit import random_transcoders
from test_circuit import write_transcoder_set

PROMPT = "The capital of France is"


def hand_graph():
    """One block, tokens [0, 5, 7], feature 3 of block 0 at position 2, one logit (token 9); the feature's strongest
    source is the error node of block 0 at position 1 (0.3125, above token 5's 0.125). Every node and nonzero edge
    kept. Nodes: 0 the feature, 1-3 the errors (position 0, 1, 2), 4-6 the tokens, 7 the logit."""
    from anatomy_cli.analyses.circuit import CircuitGraph
    from anatomy_cli.analyses.circuit import PruneResult

    a = torch.zeros(8, 8)
    a[7, 0], a[7, 5], a[7, 3] = -0.5, 0.25, 0.0625  # the feature, token 5, the error at position 2 -> the logit
    a[0, 2], a[0, 5] = 0.3125, 0.125  # the error at position 1, token 5 -> the feature
    graph = CircuitGraph("x", torch.tensor([0, 5, 7]), a, torch.tensor([[0, 2, 3]]), torch.tensor([0]),
                         torch.tensor([1.0]), [("x", 9)], torch.tensor([1.0]), 10, 1, ["<s>", "a", "b"])
    return graph, PruneResult(torch.ones(8, dtype=torch.bool), a != 0, torch.full((8,), 0.5))


def collision_graph():
    """circuit-tracer 0.5.0's collision, built: two blocks, tokens [0, 5]; feature 1 of block 0 at position 1 and
    the error node of block 1 at position 1 both feed the logit, so both are written, and 0.5.0 names both
    ``0_1_1``. Nodes: 0 the feature, 1-4 the errors (block-major), 5-6 the tokens, 7 the logit."""
    from anatomy_cli.analyses.circuit import CircuitGraph
    from anatomy_cli.analyses.circuit import PruneResult

    a = torch.zeros(8, 8)
    a[7, 0], a[7, 4], a[0, 6] = 0.5, 0.25, 1.0
    graph = CircuitGraph("x", torch.tensor([0, 5]), a, torch.tensor([[0, 1, 1]]), torch.tensor([0]),
                         torch.tensor([2.0]), [("x", 9)], torch.tensor([1.0]), 10, 2, ["<s>", "a"])
    return graph, PruneResult(torch.ones(8, dtype=torch.bool), a != 0, torch.full((8,), 0.5))


# ---- node ids ----

def test_collision_is_refused_with_the_id():
    from anatomy_cli.analyses.circuit_files import graph_json
    from anatomy_cli.analyses.circuit_files import written_nodes
    from anatomy_cli.errors import AnatomyError

    graph, pr = collision_graph()
    with pytest.raises(AnatomyError) as refused:
        written_nodes(graph, pr, ids="ct-0.5")
    message = str(refused.value)
    assert "\n" not in message and "node id 0_1_1 " in message and "--ids ct-0.5" in message
    nodes = written_nodes(graph, pr)  # the default: every node its own id
    data = graph_json(graph, pr, nodes, slug="x", node_threshold=0.8)
    assert [n["node_id"] for n in data["nodes"]] == ["0_1_1", "1_-1_1", "E_0_0", "E_5_1", "3_9_1"]
    assert {(e["source"], e["target"]) for e in data["links"]} == {("0_1_1", "3_9_1"), ("1_-1_1", "3_9_1"),
                                                                    ("E_5_1", "0_1_1")}


def test_ids_differ_from_0_5_only_in_error_nodes():
    """The same graph under both schemes: every field of every node and link equal but the error nodes' ids, which
    are 0.5.0's ``0_{block}_{pos}`` / ``{block}_{pos}-0`` and now ``{block}_-1_{pos}`` / ``{block}_-1-{pos}``."""
    from anatomy_cli.analyses.circuit_files import graph_json
    from anatomy_cli.analyses.circuit_files import written_nodes

    graph, pr = hand_graph()
    old, new = (graph_json(graph, pr, written_nodes(graph, pr, ids=ids), slug="x", node_threshold=0.8)
                for ids in ("ct-0.5", "current"))
    rename = {}
    for a, b in zip(old["nodes"], new["nodes"]):
        if a["feature_type"] == "mlp reconstruction error":
            layer, pos = int(a["layer"]), a["ctx_idx"]
            assert (a["node_id"], a["jsNodeId"]) == (f"0_{layer}_{pos}", f"{layer}_{pos}-0")
            assert (b["node_id"], b["jsNodeId"]) == (f"{layer}_-1_{pos}", f"{layer}_-1-{pos}")
            rename[a["node_id"]] = b["node_id"]
            a = {**a, "node_id": b["node_id"], "jsNodeId": b["jsNodeId"]}
        assert a == b
    assert rename  # the graph has error nodes
    assert [{**e, "source": rename.get(e["source"], e["source"])} for e in old["links"]] == new["links"]


def parse(node: dict) -> tuple[int, int, int]:
    """(layer, feature, position) from a node id, as circuit-tracer's decode_url_features reads a feature id
    (``map(int, id.split("_"))``); a token ``E_{token}_{pos}``: (-1, token, pos)."""
    first, middle, last = node["node_id"].split("_")
    return (-1 if first == "E" else int(first)), int(middle), int(last)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "gemma2"])
def test_ids_are_unique_and_parse_back(tiny_model_dir, tiny_lm, tmp_path, arch):
    """Every node and link kept (thresholds 1): 0.5.0's ids collide on this graph (a block-0 feature whose index is
    a block number, at a position that block's error node has), the default ids do not, and each parses back to its
    node: a feature to (block, feature, position) of the graph's active features, an error to (block, -1, position),
    a token to its id and position, a logit to (L + 1, its token id, the last position). ``--ids ct-0.5`` is refused
    in one line naming such an id, and writes no file."""
    import anatomy_cli as anatomy

    lm = tiny_lm(arch)
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm, n_features=4))
    every = ["--node-threshold", "1", "--edge-threshold", "1"]
    r = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), node_threshold=1.0, edge_threshold=1.0,
                        prompts=anatomy.PromptOptions(bos=True)).result
    g, nodes = r.graph, r.json["nodes"]
    ids = [n["node_id"] for n in nodes]
    assert len(set(ids)) == len(ids) == int(r.prune.node_mask.sum())  # every node written, each its own id
    selected = {tuple(g.active_features[i].tolist()) for i in g.selected_features}
    L, last = lm.n_layers, g.n_pos - 1
    kinds = {}
    for n in nodes:
        layer, feature, pos = parse(n)
        assert pos == n["ctx_idx"]
        kind = n["feature_type"]
        kinds[kind] = kinds.get(kind, 0) + 1
        if kind == "cross layer transcoder":
            assert (layer, pos, feature) in selected and str(layer) == n["layer"]
        elif kind == "mlp reconstruction error":
            assert feature == -1 and str(layer) == n["layer"] and 0 <= layer < L
        elif kind == "embedding":
            assert layer == -1 and feature == int(g.input_tokens[pos])
        else:
            assert (layer, pos) == (L + 1, last) and feature in {i for _, i in g.logit_targets}
    assert set(kinds) == {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}
    # 0.5.0's error id 0_{block}_{pos} equals feature {block} of block 0 at {pos}: such a pair is in this graph
    clashes = sorted(f"0_{f}_{p}" for b, p, f in selected if b == 0 and f < L and p <= last)
    assert clashes
    files = [tmp_path / "g.json", tmp_path / "g.pt"]
    refused = invoke("circuit", PROMPT, "--model", str(tiny_model_dir(arch)), "--device", "cpu", "--transcoders",
                     str(tdir), "--bos", *every, "--ids", "ct-0.5", "--json", str(files[0]), "--out", str(files[1]))
    # one error line (after the note that transcoders this small are too weak to read)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.exit_code == 1 and len(errors) == 1, refused.stderr
    named = re.search(r"node id (\S+) would name two nodes", errors[0])
    assert errors[0].startswith("error: --ids ct-0.5: ") and named and named.group(1) in clashes
    assert not any(f.exists() for f in files)


def test_ids_option_is_checked():
    result = invoke("circuit", PROMPT, "--model", "gpt2", "--transcoders", ".", "--ids", "ct-0.4")
    assert result.exit_code == 2 and "--ids takes current or ct-0.5, not 'ct-0.4'" in result.stderr


# ---- the strongest source ----

def test_strongest_source_is_the_adjacencys(tiny_model_dir, tiny_lm, tmp_path):
    """Each row's strongest source equals the adjacency's largest |weight| among the row's kept incoming edges from
    written nodes (feature, error node or token alike), computed here from the matrix and the masks; rows that are
    error nodes or tokens have none: "(input)" in the table with a note saying why, "" / null in the JSON."""
    import anatomy_cli as anatomy

    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm, n_features=8, seed=0))
    res = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), top=40, prompts=anatomy.PromptOptions(bos=True))
    r = res.result
    a, edges, kept = r.graph.adjacency_matrix, r.prune.edge_mask, r.prune.node_mask
    n_sel, P, L = r.graph.n_features, r.graph.n_pos, lm.n_layers
    tokens = n_sel + L * P

    def name(i: int) -> str:  # the node id of index i, from the graph's fields
        if i < n_sel:
            b, p, f = r.graph.active_features[r.graph.selected_features[i]].tolist()
            return f"{b}_{f}_{p}"
        if i < tokens:
            return f"{(i - n_sel) // P}_-1_{(i - n_sel) % P}"
        if i < tokens + P:
            return f"E_{int(r.graph.input_tokens[i - tokens])}_{i - tokens}"
        return f"{L + 1}_{r.graph.logit_targets[i - tokens - P][1]}_{P - 1}"

    linked = {i for i in range(len(kept)) if kept[i] and (edges[i] & kept).any() or (edges[:, i] & kept).any()}
    written = {i for i in range(len(kept)) if kept[i] and (i >= tokens or i in linked)}
    index = {name(i): i for i in written}
    target = len(kept) - r.graph.n_logits
    want = sorted((i for i in written if edges[target, i]), key=lambda i: -abs(float(a[target, i])))
    assert [p.node for p in r.paths] == [name(i) for i in want][:40]
    kinds = set()
    for p in r.paths:
        sources = [j for j in written if edges[index[p.node], j]]
        if not sources:
            assert (p.via, p.via_weight) == ("", None) and p.kind in ("mlp reconstruction error", "embedding")
            continue
        best = max(sources, key=lambda j: abs(float(a[index[p.node], j])))
        assert (p.via, p.via_weight) == (name(best), pytest.approx(float(a[index[p.node], best])))
        kinds.add("feature" if best < n_sel else "error" if best < tokens else "token")
    assert kinds == {"feature", "error", "token"}  # every kind of source counts, not only features
    assert any(p.kind in ("mlp reconstruction error", "embedding") for p in r.paths)
    # the table (tsv piped): the same rows, "(input)" where the row is an error node or a token, and the note
    tsv = invoke("circuit", PROMPT, "--model", str(tiny_model_dir("llama")), "--device", "cpu", "--transcoders",
                 str(tdir), "--bos", "--top", "40")
    assert tsv.exit_code == 0, tsv.stderr
    lines = [line.split("\t") for line in tsv.stdout.splitlines()]
    assert lines[0][-2:] == ["via", "via_weight"] and len(lines) == len(r.paths) + 1
    for row, p in zip(lines[1:], r.paths):
        assert row[0] == p.node
        if p.kind in ("mlp reconstruction error", "embedding"):
            assert row[-2:] == ["(input)", ""]
        else:
            assert row[-2] == p.via and float(row[-1]) == pytest.approx(p.via_weight)
    assert "error nodes and tokens are the graph's inputs (no edge enters them): (input)" in tsv.stderr
    assert [(q["via"], q["via_weight"]) for q in res.data["paths"]] == [(p.via, p.via_weight) for p in r.paths]


# ---- files and a stdin batch ----

def _args(model, tdir, *more):
    return ["circuit", *more[:1], "--model", str(model), "--device", "cpu", "--transcoders", str(tdir), "--bos",
            "--max-feature-nodes", "20", "--batch-size", "8", *more[1:]]


def test_wrote_every_file(tiny_model_dir, tiny_lm, tmp_path):
    """--out, --json and --plot: one ``wrote PATH`` line each on stderr, in the order written, naming files that
    exist."""
    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    pt, js, page = tmp_path / "g.pt", tmp_path / "g.json", tmp_path / "g.html"
    result = invoke(*_args(tiny_model_dir("llama"), tdir, PROMPT, "--out", str(pt), "--json", str(js),
                           "--plot", str(page)))
    assert result.exit_code == 0, result.stderr
    wrote = [line for line in result.stderr.splitlines() if line.startswith("wrote ")]
    assert wrote == [f"wrote {pt}", f"wrote {js}", f"wrote {page}"]
    assert all(f.is_file() for f in (pt, js, page))


def test_stdin_batch_heads_each_prompt(tiny_model_dir, tiny_lm, tmp_path):
    """Two prompts piped on stdin (tsv): stderr has the model line once, then per prompt its prompt line and its
    counts (equal to the API's run of that prompt) and its notes naming it; the note both share, once. --out and
    --json write one file per prompt, numbered as --plot's, each with its ``wrote`` line."""
    from typer.testing import CliRunner

    import anatomy_cli as anatomy
    from anatomy_cli.cli.main import app

    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    prompts = [PROMPT, "Hello there my good friend"]
    js, pt = tmp_path / "g.json", tmp_path / "g.pt"
    result = CliRunner().invoke(app, _args(tiny_model_dir("llama"), tdir, "-", "--json", str(js), "--out", str(pt)),
                                input="\n".join(prompts) + "\n")
    assert result.exit_code == 0, result.stderr
    err = result.stderr.splitlines()
    assert [line for line in err if line.startswith("wrote ")] == [
        f"wrote {tmp_path / f'g-{i}.{s}'}" for i in (1, 2) for s in ("pt", "json")]
    assert not js.exists() and not pt.exists()
    runs = anatomy.circuit(lm, prompts, transcoders=str(tdir), max_feature_nodes=20, batch_size=8,
                           prompts=anatomy.PromptOptions(bos=True))
    assert len([line for line in err if line.startswith("circuit · ")]) == 1  # the model, once
    for i, (prompt, run) in enumerate(zip(prompts, runs), start=1):
        d = run.data
        at = next(k for k, line in enumerate(err) if line.startswith(f"prompt {prompt!r} · "))
        assert err[at + 1] == (f"{d['n_selected_features']} of {d['n_active_features']} active features · "
                               f"{d['n_kept_nodes']} nodes, {d['n_kept_edges']} edges kept")
        first = d["targets"][0]
        assert err[at + 2].startswith(f"prompt {prompt!r}: target {first['token']!r} (p={first['prob']:.3f})")
        saved = json.loads((tmp_path / f"g-{i}.json").read_text())
        assert saved["metadata"]["slug"] == f"g-{i}"
        assert [n["node_id"] for n in saved["nodes"]] == [n["node_id"] for n in run.result.json["nodes"]]
    shared = [line for line in err if line.startswith("weight: the direct effect")]
    named = [k for k, line in enumerate(err) if line.startswith("prompt ")]
    assert len(shared) == 1 and err.index(shared[0]) > max(named)  # after every prompt's own lines


def test_readme_circuit_lines_give_circuit_tracers_graph():
    """docs/commands/circuit.md: --bos gives circuit-tracer's graph; the README's circuit lines say --bos."""
    from conftest import ROOT

    lines = [line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("anatomy circuit ")]
    assert lines and all(" --bos" in line.split("#")[0] for line in lines)
    assert "**`--bos` gives circuit-tracer's graph**" in (ROOT / "docs" / "commands" / "circuit.md").read_text()
