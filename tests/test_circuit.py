"""`anatomy circuit`: attribution graphs over transcoder replacement models (issue 49).

Identities on tiny random Llama, Gemma 2 and GPT-2 models: logit edges equal a hand-built gradient × activation
on the frozen model, the frozen model with error nodes reproduces the real logits, each node's incoming edges
plus its bias terms (a forward with every source removed) equal its pre-activation, edges re-measured by
intervention equal their weights; pruning against a hand computation; files; refusals before weights load.
"""

from __future__ import annotations

import json

import pytest
import torch

from anatomy_cli.analyses import circuit as algo
from anatomy_cli.analyses import circuit as prune  # its influence, pruning and scores
from anatomy_cli.analyses import circuit_check as chk
from anatomy_cli.engine import replacement as rep
from anatomy_cli.engine.replacement import CrossLayer
from anatomy_cli.engine.replacement import as_stack

ARCHS = ("llama", "gemma2", "gpt2")
MORE = ("gemma3", "qwen3", "mixtral")  # Gemma 3, Qwen3, and an MoE block with a transcoder per block
IDS = torch.tensor([50256, 464, 3139, 286, 4881, 318])


def random_transcoders(lm, n_features=16, seed=0, skip=False):
    g = torch.Generator().manual_seed(seed)
    d = lm.d_model
    return [rep.Transcoder(torch.randn(n_features, d, generator=g) / d ** .5, torch.randn(n_features, generator=g) * .1,
                           torch.randn(n_features, d, generator=g) / n_features ** .5, torch.randn(d, generator=g) * .1,
                           W_skip=torch.randn(d, d, generator=g) * .05 if skip else None)
            for _ in range(lm.n_layers)]


def random_clt(lm, n_features=16, seed=0, skip=False):
    """A cross-layer transcoder in memory: encoders as random_transcoders' (``W_dec [F, 0]``) and decoders
    ``decs[l] [F, L - l, d]``. Returns (the CrossLayer, decs)."""
    g = torch.Generator().manual_seed(seed)
    n, d = lm.n_layers, lm.d_model
    enc = [rep.Transcoder(torch.randn(n_features, d, generator=g) / d ** .5, torch.randn(n_features, generator=g) * .1,
                          torch.zeros(n_features, 0), torch.randn(d, generator=g) * .1,
                          W_skip=torch.randn(d, d, generator=g) * .05 if skip else None) for _ in range(n)]
    decs = [torch.randn(n_features, n - layer, d, generator=g) / (n_features * (n - layer)) ** .5
            for layer in range(n)]
    return CrossLayer(enc, lambda layer, ids: decs[layer][ids]), decs


def make(lm, kind, **kw):
    return random_transcoders(lm, **kw) if kind == "plt" else random_clt(lm, **kw)[0]


def build(lm, tcs, max_feature_nodes=None, batch_size=8):
    s = algo.setup(lm, IDS, tcs)
    targets, probs = algo.salient_logits(s.logits, 10, 0.95)
    a, sel, s = algo.attribute(lm, IDS, tcs, targets, probs, batch_size=batch_size,
                               max_feature_nodes=max_feature_nodes, s=s)
    graph = algo.CircuitGraph("x", IDS, a, s.active, sel, s.values, [("", int(t)) for t in targets], probs,
                              50257, lm.n_layers)
    return graph, s


def frozen_forward_is_the_models(lm, tcs):
    """The setup and one frozen forward of IDS, after checking that its logits are the real model's. Returns
    (setup, forward)."""
    with torch.no_grad():
        real = lm.model(input_ids=IDS[None]).logits[0]
    s = algo.setup(lm, IDS, tcs)
    with rep.frozen(lm), torch.no_grad():
        fw = rep.forward(lm, IDS, tcs, 1)
    torch.testing.assert_close(fw.logits[0], real, rtol=0, atol=1e-5)
    return s, fw


@pytest.mark.parametrize("arch", ARCHS + MORE)
def test_replacement_model_reproduces_logits(tiny_lm, arch):
    lm = tiny_lm(arch)
    tcs = random_transcoders(lm)
    s, fw = frozen_forward_is_the_models(lm, tcs)
    # reconstruction + error = the MLP's output, per layer and position (position 0's error is kept out)
    for layer, tc in enumerate(tcs):
        x = fw.mlp_in[layer][0]
        acts = tc.encode(x)
        acts[0] = 0
        recon = tc.decode(acts, x)[1:] + s.errors[layer, 1:]
        torch.testing.assert_close(recon, fw.mlp_out[layer][0, 1:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS + MORE)
def test_batch_forward_with_shared_mlps_is_each_copys(tiny_lm, arch):
    """The attribution's batch forward (each MLP run on one copy, the last logits only): every copy's MLP inputs
    and outputs, final norm output and last logits equal the one-copy forward's, and a gradient seeded at one
    copy's site equals the one-copy forward's gradient (autograd on both)."""
    lm = tiny_lm(arch)
    tcs = random_transcoders(lm, skip=True)
    with rep.frozen(lm):
        one = rep.forward(lm, IDS, tcs, 1)
        many = rep.forward(lm, IDS, tcs, 3, last_logits=True, shared_mlp=True)
        for layer in range(lm.n_layers):
            for got, want in ((many.mlp_in[layer], one.mlp_in[layer]), (many.mlp_out[layer], one.mlp_out[layer])):
                torch.testing.assert_close(got, want.expand_as(got), rtol=0, atol=1e-5)
        torch.testing.assert_close(many.final, one.final.expand_as(many.final), rtol=0, atol=1e-5)
        torch.testing.assert_close(many.logits[:, -1], one.logits[:, -1].expand(3, -1), rtol=0, atol=1e-5)
        site = lm.n_layers // 2
        vec = torch.randn(lm.d_model, generator=torch.Generator().manual_seed(1))
        want = torch.autograd.grad(one.mlp_in[site][0, 2] @ vec, [one.embed, *one.mlp_out[:site]],
                                   retain_graph=True)
        got = torch.autograd.grad(many.mlp_in[site][1, 2] @ vec, [many.embed, *many.mlp_out[:site]])
        for g, w in zip(got, want):
            torch.testing.assert_close(g[1], w[0], rtol=1e-5, atol=1e-6)
            assert float(g[0].abs().max()) == 0.0 and float(g[2].abs().max()) == 0.0


@pytest.mark.parametrize("arch", ARCHS)
def test_logit_edges_are_gradient_times_activation(tiny_lm, arch):
    """Built by hand: the frozen model's logit (demeaned unembedding at the last position), its gradient with
    respect to each MLP output and the embedding by torch.autograd, dotted with each source's vector."""
    lm = tiny_lm(arch)
    tcs = random_transcoders(lm)
    graph, s = build(lm, tcs)
    n, n_sel, P, L = graph.adjacency_matrix.shape[0], graph.n_features, len(IDS), lm.n_layers
    vecs = algo.logit_vectors(lm, torch.tensor([t for _, t in graph.logit_targets]))
    with rep.frozen(lm):
        fw = rep.forward(lm, IDS, tcs, 1)
        for j, vec in enumerate(vecs):
            value = fw.final[0, -1] @ vec
            grads = torch.autograd.grad(value, [fw.embed, *fw.mlp_out], retain_graph=True)
            row = graph.adjacency_matrix[n - graph.n_logits + j]
            for i in range(n_sel):
                layer, pos, feat = s.active[graph.selected_features[i]].tolist()
                want = grads[1 + layer][0, pos] @ (s.values[graph.selected_features[i]] * tcs[layer].W_dec[feat])
                assert abs(float(row[i]) - float(want)) <= 1e-5 * (1 + abs(float(want)))
            for layer in range(L):
                for pos in range(P):
                    want = grads[1 + layer][0, pos] @ s.errors[layer, pos]
                    assert abs(float(row[n_sel + layer * P + pos]) - float(want)) <= 1e-5 * (1 + abs(float(want)))
            want_tok = (grads[0][0] * fw.embed[0]).sum(-1)
            torch.testing.assert_close(row[n_sel + L * P:n_sel + L * P + P], want_tok.detach(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["plt", "clt"])
@pytest.mark.parametrize("arch", ARCHS)
def test_incoming_edges_plus_bias_equal_preactivation(tiny_lm, arch, kind):
    lm = tiny_lm(arch)
    tcs = make(lm, kind, skip=arch == "llama")
    graph, s = build(lm, tcs)
    fp = chk.FrozenPrompt(lm, IDS, tcs, graph, s)
    n = graph.adjacency_matrix.shape[0]
    rows = list(range(graph.n_features)) + list(range(n - graph.n_logits, n))
    bias = chk.bias_terms(fp, rows)
    for r, b in zip(rows, bias):
        value = fp.value(fp.base, r)
        edges = float(graph.adjacency_matrix[r].sum())
        assert abs(edges + b - value) <= 1e-4 * (1 + abs(value)), (r, edges, b, value)
    # a feature's value is its pre-activation minus b_enc
    for i in range(graph.n_features):
        layer, pos, feat = s.active[graph.selected_features[i]].tolist()
        pre = fp.base.mlp_in[layer][0, pos] @ as_stack(tcs).layer(layer).W_enc[feat]
        assert abs(fp.value(fp.base, i) - float(pre)) < 1e-5


@pytest.mark.parametrize("kind", ["plt", "clt"])
@pytest.mark.parametrize("arch", ARCHS + MORE)
def test_check_by_intervention(tiny_lm, arch, kind):
    lm = tiny_lm(arch)
    tcs = make(lm, kind)
    graph, s = build(lm, tcs, max_feature_nodes=20)
    fp = chk.FrozenPrompt(lm, IDS, tcs, graph, s)
    checks = chk.check_edges(fp, 30)
    assert len(checks) == 30
    scale = float(graph.adjacency_matrix.abs().max())
    for c in checks:
        assert abs(c.measured - c.weight) <= 1e-5 * scale, c


def test_feature_order_and_selection(tiny_lm):
    """max_feature_nodes below the active count keeps that many features, logit rows last, error and token rows
    zero; with every feature the rows equal the capped graph's on the features both selected."""
    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    capped, s = build(lm, tcs, max_feature_nodes=20, batch_size=4)
    full, _ = build(lm, tcs)
    assert capped.n_features == 20 and full.n_features == len(s.active)
    a = capped.adjacency_matrix
    assert not a[20:20 + (lm.n_layers + 1) * len(IDS)].any()
    sel = capped.selected_features
    cols = torch.cat([sel, torch.arange(len(s.active), full.adjacency_matrix.shape[0])])
    torch.testing.assert_close(a[:20], full.adjacency_matrix[sel][:, cols])
    torch.testing.assert_close(a[-capped.n_logits:], full.adjacency_matrix[-full.n_logits:][:, cols])


def test_prune_by_hand():
    """A 5-node chain: feature 0 -> feature 1 -> logit, a weak feature 2, one token. By hand: normalised rows,
    influence = w A + w A^2 + ..."""
    a = torch.zeros(5, 5)  # nodes: f0, f1, f2, token, logit
    a[4, 1], a[4, 2], a[4, 3] = 3.0, 0.1, 1.0
    a[1, 0], a[1, 3] = 2.0, 2.0
    a[0, 3] = 1.0
    probs = torch.tensor([1.0])
    norm = prune.normalize_matrix(a)
    assert torch.allclose(norm[4], torch.tensor([0, 3, .1, 1, 0]) / 4.1)
    infl = prune.compute_influence(norm, torch.tensor([0, 0, 0, 0, 1.0]))
    want = torch.zeros(5)
    want[1], want[2], want[3] = 3 / 4.1, .1 / 4.1, 1 / 4.1 + 3 / 4.1 * .5 + 3 / 4.1 * .5
    want[0] = 3 / 4.1 * .5
    assert torch.allclose(infl, want, atol=1e-6)
    result = prune.prune(a, probs, n_tokens=1, n_features=3, node_threshold=0.8, edge_threshold=0.98)
    # sorted influence .976 .732 .366 .024 0: cumulative .465 .814 -> threshold .732 keeps f1 (and token, logit)
    assert result.node_mask.tolist() == [False, True, False, True, True]
    assert not result.edge_mask[4, 2]
    rep_score, comp = prune.scores(a, probs, n_tokens=1, n_errors=0)
    assert rep_score == pytest.approx(1.0) and comp == pytest.approx(1.0)


# ---------------------------------------------------------------- files, CLI, API, refusals

def write_transcoder_set(root, lm, tcs, *, gemma_scope_2=False, d_model=None, extra=""):
    """circuit-tracer's transcoder_set layout (or Gemma Scope 2's tensor names) for ``tcs``."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    files = []
    for layer, tc in enumerate(tcs):
        if gemma_scope_2:
            t = {"w_enc": tc.W_enc.T.contiguous(), "w_dec": tc.W_dec, "b_enc": tc.b_enc, "b_dec": tc.b_dec,
                 "threshold": torch.zeros(tc.W_enc.shape[0])}
        else:
            t = {"W_enc": tc.W_enc, "W_dec": tc.W_dec, "b_enc": tc.b_enc, "b_dec": tc.b_dec}
        if d_model is not None:
            t = {k: v[..., :d_model].contiguous() if v.ndim == 2 else v for k, v in t.items()}
        save_file(t, str(root / f"layer_{layer}.safetensors"))
        files.append(f"layer_{layer}.safetensors")
    (root / "config.yaml").write_text(
        f"model_kind: transcoder_set\nscan: tiny-test\nfeature_input_hook: mlp.hook_in\n{extra}"
        "feature_output_hook: mlp.hook_out\ntranscoders:\n" + "".join(f"  - {f}\n" for f in files))
    return root


def invoke(*args):
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    return CliRunner().invoke(app, list(args))


def test_cli_writes_graph_pt_and_json(tiny_model_dir, tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    tdir = write_transcoder_set(tmp_path / "tc", lm, tcs)
    out, js = tmp_path / "graph.pt", tmp_path / "graph.json"
    result = invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")),
                    "--device", "cpu", "--transcoders", str(tdir), "--bos", "--out", str(out), "--json", str(js),
                    "--max-feature-nodes", "20", "--batch-size", "8", "--check", "5", "-f", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    saved = torch.load(out, weights_only=False, pickle_module=_stub_pickle())
    assert sorted(saved) == sorted(["input_string", "adjacency_matrix", "cfg", "active_features", "logit_targets",
                                    "logit_probabilities", "vocab_size", "input_tokens", "selected_features",
                                    "activation_values", "scan"])
    n = saved["adjacency_matrix"].shape[0]
    n_pos = len(saved["input_tokens"])
    assert n == 20 + (lm.n_layers + 1) * n_pos + len(saved["logit_targets"])
    assert saved["scan"] == "tiny-test" and data["n_selected_features"] == 20
    # the same graph as the analysis built on the same ids, with the same transcoders
    ids = saved["input_tokens"]
    s = algo.setup(lm, ids, tcs)
    targets = torch.tensor([t.vocab_idx for t in saved["logit_targets"]])
    a, sel, _ = algo.attribute(lm, ids, tcs, targets, saved["logit_probabilities"], batch_size=8,
                               max_feature_nodes=20, s=s)
    torch.testing.assert_close(saved["adjacency_matrix"], a)
    assert torch.equal(saved["selected_features"], sel)
    graph = json.loads(js.read_text())
    assert set(graph) == {"metadata", "qParams", "nodes", "links"}
    ids_in = {nd["node_id"] for nd in graph["nodes"]}
    assert all(link["source"] in ids_in and link["target"] in ids_in for link in graph["links"])
    assert sum(nd["feature_type"] == "embedding" for nd in graph["nodes"]) == n_pos
    assert data["check"]["max_abs_error"] < 1e-5
    logit = next(nd for nd in graph["nodes"] if nd["is_target_logit"])
    assert logit["node_id"] == f"{lm.n_layers + 1}_{int(targets[0])}_{n_pos - 1}"


def _stub_pickle():
    """A pickle module that reads circuit-tracer's classes without circuit-tracer (stand-ins of the same shape)."""
    import collections
    import pickle
    import types

    class UnifiedConfig:
        pass

    stand_in = types.SimpleNamespace(UnifiedConfig=UnifiedConfig,
                                     LogitTarget=collections.namedtuple("LogitTarget", "token_str vocab_idx"))

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "importlib" and name == "import_module":
                return lambda m: stand_in if m.startswith("circuit_tracer") else __import__(m)
            return super().find_class(module, name)

    return types.SimpleNamespace(Unpickler=Unpickler, load=pickle.load, __name__="stub_pickle")


def test_gemma_scope_2_layout_reads_the_same(tiny_lm, tmp_path):
    from anatomy_cli.engine.replacement import open_transcoders
    from anatomy_cli.models import transcoders as files

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    ts = files.describe(write_transcoder_set(tmp_path / "gs2", lm, tcs, gemma_scope_2=True))
    assert ts.gemma_scope_2 and ts.d_model == lm.d_model and ts.d_transcoder == 16
    got = open_transcoders(ts, lm.device)
    torch.testing.assert_close(got[1].W_enc, tcs[1].W_enc)
    assert got[1].threshold is not None


def write_clt(root, clt, decs, *, threshold=True):
    """circuit-tracer's cross_layer_transcoder layout (``CrossLayerTranscoder.to_safetensors`` + a config):
    ``W_enc_{l}.safetensors`` (``W_enc_l``, ``b_enc_l``, ``b_dec_l``, ``threshold_l``, ``W_skip_l`` as x @ W_skip_l)
    and ``W_dec_{l}.safetensors``."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    for layer, tc in enumerate(clt.encoders):
        t = {f"W_enc_{layer}": tc.W_enc, f"b_enc_{layer}": tc.b_enc, f"b_dec_{layer}": tc.b_dec}
        if threshold:
            t[f"threshold_{layer}"] = torch.zeros(tc.W_enc.shape[0])
        if tc.W_skip is not None:
            t[f"W_skip_{layer}"] = tc.W_skip.T.contiguous()
        save_file(t, str(root / f"W_enc_{layer}.safetensors"))
        save_file({f"W_dec_{layer}": decs[layer].contiguous()}, str(root / f"W_dec_{layer}.safetensors"))
    (root / "config.yaml").write_text("model_kind: cross_layer_transcoder\nscan: tiny-clt\n"
                                      "feature_input_hook: mlp.hook_in\nfeature_output_hook: mlp.hook_out\n")
    return root


def test_api_matches_cli_record(tiny_model_dir, tiny_lm, tmp_path):
    import anatomy_cli as anatomy

    lm = tiny_lm("gpt2")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    res = anatomy.circuit(lm, "The capital of France is", transcoders=str(tdir), max_feature_nodes=10, batch_size=4)
    cli = invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("gpt2")), "--device", "cpu",
                 "--transcoders", str(tdir), "--max-feature-nodes", "10", "--batch-size", "4", "-f", "json")
    assert cli.exit_code == 0, cli.stderr
    assert json.loads(cli.stdout)["paths"] == res.to_dict()["paths"]


def test_refusals_before_weights_load(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    import anatomy_cli.cli.commands.circuit as command

    def no_load(*_a, **_k):
        raise AssertionError("weights loaded")

    monkeypatch.setattr(command, "load_weights", no_load)
    lm = tiny_lm("llama")
    model = str(tiny_model_dir("llama"))
    missing = invoke("circuit", "Hi there", "--model", model, "--transcoders", str(tmp_path / "nope"))
    assert missing.exit_code == 2 and "no such directory" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    narrow = write_transcoder_set(tmp_path / "narrow", lm, random_transcoders(lm), d_model=lm.d_model - 2)
    wide = invoke("circuit", "Hi there", "--model", model, "--transcoders", str(narrow))
    assert wide.exit_code == 2 and f"{lm.d_model - 2} wide" in wide.stderr
    tdir = write_transcoder_set(tmp_path / "ok", lm, random_transcoders(lm))
    enc = invoke("circuit", "Hi there", "--model", str(tiny_model_dir("bert")), "--transcoders", str(tdir))
    assert enc.exit_code == 2 and len(enc.stderr.strip().splitlines()) == 1
    bad = invoke("circuit", "Hi there", "--model", model, "--transcoders", str(tdir), "--node-threshold", "2")
    assert bad.exit_code == 2 and "--node-threshold" in bad.stderr
    (tdir / "config.yaml").write_text("model_kind: mystery_transcoder\ntranscoders: [a]\n")
    kind = invoke("circuit", "Hi there", "--model", model, "--transcoders", str(tdir))
    assert kind.exit_code == 2 and "mystery_transcoder" in kind.stderr
    clt, decs = random_clt(lm)
    cdir = write_clt(tmp_path / "clt", clt, decs)
    (cdir / "W_dec_1.safetensors").unlink()
    missing_dec = invoke("circuit", "Hi there", "--model", model, "--transcoders", str(cdir))
    assert missing_dec.exit_code == 2 and "W_dec_1.safetensors is missing" in missing_dec.stderr
