"""`circuit --heads`: head loadings and QK attributions (issue 62 item 3), on tiny random Llama (grouped-query
attention: 4 heads, 2 kv heads), GPT-2 and Qwen3 (query/key norms) models with random transcoders.

Checked independently of the split's own code: the parts of each edge sum to the adjacency's weight; a part at the
first attention layer after its source equals the edge less the edge re-measured by autograd on the frozen
replacement model with that head's output zeroed by a hand hook on the output projection; the QK scores of one
query against every key, softmaxed, give the pattern transformers' eager attention returns, and their terms sum to
them.
"""

from __future__ import annotations

import pytest
import torch
from test_circuit import IDS
from test_circuit import build
from test_circuit import make

from anatomy_cli.analyses import circuit_check as chk
from anatomy_cli.analyses import circuit_heads as ch
from anatomy_cli.engine import replacement as rep
from anatomy_cli.engine.attention import attention_module
from anatomy_cli.engine.attention import eager_attention

ARCHS = ("llama", "gpt2", "qwen3")


def prompt(lm, kind="plt", max_feature_nodes=20):
    tcs = make(lm, kind, skip=kind == "plt")
    graph, s = build(lm, tcs, max_feature_nodes=max_feature_nodes)
    return chk.FrozenPrompt(lm, IDS, tcs, graph, s, capture=True)


@pytest.fixture(scope="module")
def prompts(tiny_lm):
    """``prompts(arch, kind="plt", max_feature_nodes=20)``: the prompt's graph on ``tiny_lm(arch)``, built once
    for the module (the tests only replay it)."""
    made = {}

    def get(arch, kind="plt", max_feature_nodes=20):
        key = (arch, kind, max_feature_nodes)
        if key not in made:
            made[key] = prompt(tiny_lm(arch), kind, max_feature_nodes)
        return made[key]

    return get


def links(graph, n=25, seed=0):
    """``n`` nonzero edges into feature and logit rows, sampled."""
    a = graph.adjacency_matrix
    t, s = torch.nonzero(a, as_tuple=True)
    pick = torch.randperm(len(t), generator=torch.Generator().manual_seed(seed))[:n]
    return list(zip(t[pick].tolist(), s[pick].tolist()))


def source_layer(fp, node):
    """The first block a source writes to (-1: a token)."""
    return min(layer for layer, _, _ in fp.source(node))


@pytest.mark.parametrize("kind", ["plt", "clt"])
@pytest.mark.parametrize("arch", ARCHS)
def test_head_parts_sum_to_each_edge(prompts, arch, kind):
    fp = prompts(arch, kind)
    lm = fp.lm
    edges = links(fp.graph)
    splits = ch.Heads(fp).split(edges)
    scale = float(fp.graph.adjacency_matrix.abs().max())
    n_heads = lm.n_heads
    assert [(sp.target, sp.source) for sp in splits] == edges
    for sp in splits:
        assert sp.parts.shape == (lm.n_layers, n_heads)
        assert abs(sp.total - sp.weight) <= 2e-5 * scale, (sp.total, sp.weight)
        first = source_layer(fp, sp.source) + 1
        assert float(sp.parts[:first].abs().sum()) == 0.0  # no head before the source writes
        if ch.position(fp.graph, sp.source) != _target_position(fp, sp.target):
            assert abs(sp.bypass) <= 1e-6 * scale  # the bypass stays at the source's position
    assert any(float(sp.parts.abs().max()) > 1e-3 * scale for sp in splits)


@pytest.mark.parametrize("kind", ["plt", "clt"])
@pytest.mark.parametrize("arch", ARCHS)
def test_batched_replays_equal_one_replay_per_copy(prompts, arch, kind):
    """The replays in batches of 7 copies (the last one short) give the parts, bypasses, query positions and QK
    terms of one replay per copy (batch 1), to fp32 rounding."""
    fp = prompts(arch, kind)
    edges = links(fp.graph, n=30, seed=1)
    one, many = ch.Heads(fp, batch=1), ch.Heads(fp, batch=7)
    scale = float(fp.graph.adjacency_matrix.abs().max())
    for a, b in zip(one.split(edges), many.split(edges), strict=True):
        assert (a.target, a.source) == (b.target, b.source)
        torch.testing.assert_close(b.parts, a.parts, rtol=1e-5, atol=1e-6 * scale)
        assert abs(b.bypass - a.bypass) <= 1e-6 * scale
        assert torch.equal(a.query[a.parts.abs() > 1e-4 * scale], b.query[a.parts.abs() > 1e-4 * scale])
    g = fp.graph
    nodes = list(range(g.adjacency_matrix.shape[0] - g.n_logits))[:20]
    picks = [(layer, fp.lm.n_heads - 1, g.n_pos - 1, k) for layer in range(fp.lm.n_layers) for k in (0, 2)]
    for a, b in zip(one.scores(picks, nodes), many.scores(picks, nodes), strict=True):
        assert a.score == b.score and a.rows == b.rows
        torch.testing.assert_close(b.terms, a.terms, rtol=1e-5, atol=1e-5 * float(a.terms.abs().max()))


def test_holding_either_side_gives_the_same_numbers(prompts):
    """The split held the targets' gradients or the sources' changes (each as its nonzero positions, the other
    side a batch at a time): the same parts, bypasses and query positions, bit for bit."""
    fp = prompts("llama")
    edges = links(fp.graph, n=25, seed=3)
    by_targets, by_sources = (ch.Heads(fp, batch=4).split(edges, hold) for hold in ("targets", "sources"))
    assert len({t for t, _ in edges}) > 4 and len({s for _, s in edges}) > 4  # several batches on both sides
    for a, b in zip(by_targets, by_sources, strict=True):
        assert (a.target, a.source) == (b.target, b.source) and a.bypass == b.bypass
        assert torch.equal(a.parts, b.parts) and torch.equal(a.query, b.query)
    dz = [torch.zeros(5, 2, 3), torch.zeros(5, 2, 3)]
    dz[0][1, 0, 2], dz[1][3, 1, 0] = 1.5, -2.0
    span = ch.Span.of(dz)
    assert (span.start, span.rows[0].shape[0]) == (1, 3) and all(torch.equal(w, d) for w, d in zip(span.whole(), dz))


def _target_position(fp, node):
    g = fp.graph
    if node >= g.adjacency_matrix.shape[0] - g.n_logits:
        return g.n_pos - 1
    return int(g.active_features[g.selected_features[node], 1])


def _output_projection(lm, layer):
    attn = attention_module(lm, layer)
    return next(m for name, m in attn.named_children() if name in ("o_proj", "c_proj"))


def _edge_by_autograd(fp, target, source, zero=None):
    """The edge on the frozen replacement model (the prompt replayed), by torch.autograd: the gradient of the
    target at each place the source writes · its vector; ``zero``: (layer, head) whose output a hand hook on the
    output projection's input sets to 0."""
    d_head = fp.lm.d_model // fp.lm.n_heads
    handles = []
    if zero is not None:
        layer, head = zero

        def hook(_module, args):
            x = args[0].clone()
            x[..., head * d_head:(head + 1) * d_head] = 0
            return (x, *args[1:])

        handles.append(_output_projection(fp.lm, layer).register_forward_pre_hook(hook))
    fp.freezer.replay = True
    try:
        with rep.frozen(fp.lm, fp.freezer):
            fw = rep.forward(fp.lm, fp.ids, fp.tcs, 1)
            grads = torch.autograd.grad(fp.read(fw, target), [fw.embed, *fw.mlp_out], allow_unused=True)
    finally:
        fp.freezer.replay = False
        for h in handles:
            h.remove()
    return sum(float(grads[layer + 1][0, pos].float() @ vec) for layer, pos, vec in fp.source(source)
               if grads[layer + 1] is not None)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_head_part_is_the_edge_less_the_edge_without_that_head(prompts, arch):
    fp = prompts(arch)
    lm = fp.lm
    g = fp.graph
    n = g.adjacency_matrix.shape[0]
    n_sel = g.n_features
    logit = n - g.n_logits
    token = n_sel + lm.n_layers * g.n_pos + 2  # the token at position 2: its first head is in block 0
    layer0 = next(i for i in range(n_sel) if int(g.active_features[g.selected_features[i], 0]) == 0)
    splits = ch.Heads(fp).split([(logit, token), (logit, layer0)])
    for sp in splits:
        whole = _edge_by_autograd(fp, sp.target, sp.source)
        assert abs(whole - sp.weight) <= 1e-5 * (1 + abs(whole))
        first = source_layer(fp, sp.source) + 1
        for head in range(lm.n_heads):
            without = _edge_by_autograd(fp, sp.target, sp.source, zero=(first, head))
            part = float(sp.parts[first, head])
            assert abs((whole - without) - part) <= 1e-5 * (1 + abs(whole)), (head, whole - without, part)
        assert any(abs(float(p)) > 1e-6 for p in sp.parts[first])


@pytest.mark.parametrize("arch", ARCHS)
def test_qk_terms_sum_to_the_models_own_scores(prompts, arch):
    """One query (the last position) against every key, for a head of each block: the terms sum to each score;
    with every source node drawn nothing is left for ``other``; the scores softmaxed are transformers' eager
    pattern (``output_attentions``) of the real model."""
    fp = prompts(arch, max_feature_nodes=None)  # every active feature a node: nothing else writes
    lm = fp.lm
    g = fp.graph
    q = g.n_pos - 1
    head = lm.n_heads - 1  # in the second kv group for grouped-query attention
    picks = [(layer, head, q, k) for layer in range(lm.n_layers) for k in range(q + 1)]
    nodes = list(range(g.adjacency_matrix.shape[0] - g.n_logits))
    scores = ch.Heads(fp).scores(picks, nodes)
    with eager_attention(lm), torch.no_grad():
        eager = lm.model(input_ids=IDS[None], output_attentions=True).attentions
    for layer in range(lm.n_layers):
        mine = [sc for sc in scores if sc.layer == layer]
        values = torch.tensor([sc.score for sc in mine])
        for sc in mine:
            assert abs(float(sc.terms.double().sum()) - sc.score) <= 1e-4 * (1 + abs(sc.score))
            other = sc.rows.index(ch.OTHER)
            assert float(sc.terms[other].abs().sum()) <= 1e-4 * float(sc.terms.abs().sum())
        want = eager[layer][0, head, q, :q + 1].float()
        torch.testing.assert_close(torch.softmax(values, 0), want, rtol=1e-4, atol=1e-6)


def test_cli_heads_json_table_and_api(tiny_model_dir, tiny_lm, tmp_path):
    """``--heads 2``: each link of ``--json`` carries ``heads`` (bypass + parts + rest = its weight), ``qk`` holds
    two heads whose terms plus rest give the score; the table has the via-head column (not without ``--heads``);
    the other keys are the run without ``--heads``'s, byte for byte; the API's record (``-f json``'s) has the same
    ``qk`` and a head on each path. Two CLI runs and one API call."""
    import json

    from test_circuit import invoke
    from test_circuit import random_transcoders
    from test_circuit import write_transcoder_set

    import anatomy_cli as anatomy
    from anatomy_cli.text.options import PromptOptions

    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    args = ["circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")), "--device", "cpu",
            "--transcoders", str(tdir), "--bos", "--max-feature-nodes", "20", "--batch-size", "8"]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain, with_heads = tmp_path / "a" / "graph.json", tmp_path / "b" / "graph.json"  # one slug
    result = invoke(*args, "--json", str(plain), "--format", "table")
    assert result.exit_code == 0 and "first head" not in result.stdout
    result = invoke(*args, "--json", str(with_heads), "--heads", "2", "--format", "table")
    assert result.exit_code == 0, result.stderr
    assert "first head" in result.stdout and "query x key terms" in result.stdout
    n_links = len(json.loads(with_heads.read_text())["links"])
    assert f"circuit --heads: {n_links:,} edges (" in result.stderr  # the cost line, before the replays
    a, b = json.loads(plain.read_text()), json.loads(with_heads.read_text())
    assert set(b) - set(a) == {"qk"} and a["nodes"] == b["nodes"] and a["metadata"] == b["metadata"]
    assert [{k: v for k, v in link.items() if k != "heads"} for link in b["links"]] == a["links"]
    for link in b["links"]:
        h = link["heads"]
        total = h["bypass"] + sum(p["weight"] for p in h["parts"]) + h["rest"]
        assert abs(total - link["weight"]) <= 1e-5 * (1 + abs(link["weight"]))
    assert len(b["qk"]) == 2
    ids = {n["node_id"] for n in b["nodes"]} | {"bias", "other"}
    for e in b["qk"]:
        assert abs(sum(t["value"] for t in e["terms"]) + e["rest"] - e["score"]) <= 1e-4 * (1 + abs(e["score"]))
        assert all(t["query"] in ids and t["key"] in ids for t in e["terms"])
        n_sources = sum(1 for n in b["nodes"] if n["feature_type"] != "logit")  # and bias, other: each side
        assert e["n_terms"] == (n_sources + 2) ** 2 and len(e["terms"]) <= e["n_terms"]
    api = anatomy.circuit(lm, "The capital of France is", transcoders=str(tdir), max_feature_nodes=20,
                          batch_size=8, heads=2, prompts=PromptOptions(bos=True)).to_dict()  # -f json's record
    assert all("head" in row and "head_part" in row for row in api["paths"])
    assert api["qk"] == b["qk"]
    # each path row's head and part are its link's largest head part, or the bypass where no head carries any
    logits = {n["node_id"] for n in b["nodes"] if n["feature_type"] == "logit"}
    for row in api["paths"]:
        h = next(link["heads"] for link in b["links"] if link["target"] in logits and link["source"] == row["node"]
                 and link["weight"] == pytest.approx(row["weight"], rel=1e-5))
        if h["parts"]:
            best = max(h["parts"], key=lambda p: abs(p["weight"]))
            assert row["head"] == f"{best['layer']}.{best['head']}" and row["head_part"] == pytest.approx(best["weight"])
        else:
            assert row["head"] == "" and row["head_part"] == pytest.approx(h["bypass"])


def test_replays_are_the_forwards_attention_runs(prompts, monkeypatch):
    """``replays`` (what the cost line and ``--estimate --heads`` count) lists exactly the forwards of the frozen
    replacement model that ``attention`` runs, each with its number of copies and whether a backward follows,
    counted here by wrapping ``replacement.forward`` (batches of 4: partial last batches included)."""
    fp = prompts("llama")
    ran = []
    forward = rep.forward

    def counted(lm, ids, tcs, batch, *args, **kwargs):
        ran.append(ch.Replay(batch, torch.is_grad_enabled()))
        return forward(lm, ids, tcs, batch, *args, **kwargs)

    monkeypatch.setattr(rep, "forward", counted)
    edges = links(fp.graph, n=25, seed=1)
    nodes = sorted({s for _, s in edges})
    fresh = chk.FrozenPrompt(fp.lm, IDS, fp.tcs, fp.graph, fp.s, capture=True)
    ch.attention(fresh, edges, 1, nodes, batch=4)
    n_targets = len({t for t, _ in edges})
    counted = ch.replays(n_targets, len(nodes), len(nodes), 4)
    assert ran[:3] == counted[:3] and sorted(ran) == sorted(counted)  # the held side's replays may come first
    assert sum(r.backward for r in ran) == -(-n_targets // 4)
