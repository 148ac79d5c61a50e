"""`anatomy circuit` with the other transcoder kinds (issue 49, "transcoders in"): circuit-tracer's cross-layer
transcoders (a feature of block l writes to the MLP outputs of blocks l..L-1), checked on tiny models against a
reconstruction and gradients computed by hand, read lazily from circuit-tracer's files; and SAELens / sparsify
transcoder folders and Gemma Scope params.npz files, whose graph equals the one from the same weights as a
circuit-tracer transcoder_set.
(test_circuit.py runs the edge + bias identity and the intervention check on both kinds.)
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from test_circuit import ARCHS
from test_circuit import IDS
from test_circuit import MORE
from test_circuit import _stub_pickle
from test_circuit import build
from test_circuit import frozen_forward_is_the_models
from test_circuit import invoke
from test_circuit import random_clt
from test_circuit import random_transcoders
from test_circuit import write_clt
from test_circuit import write_transcoder_set

from anatomy_cli.analyses import circuit as algo
from anatomy_cli.engine import replacement as rep


@pytest.mark.parametrize("arch", ARCHS + MORE)
def test_cross_layer_replacement_reproduces_logits(tiny_lm, arch):
    """A cross-layer transcoder: the frozen model with error nodes gives the real logits, and per block the
    reconstruction by hand (every earlier-or-same layer's active features times their decoder slice for this
    block, + b_dec + skip) plus the error node equals the MLP's output."""
    lm = tiny_lm(arch)
    clt, decs = random_clt(lm, skip=arch == "llama")
    s, fw = frozen_forward_is_the_models(lm, clt)
    acts = []
    for layer in range(lm.n_layers):
        a = clt.encoders[layer].encode(fw.mlp_in[layer][0])
        a[0] = 0
        acts.append(a)
    assert len(s.active) == sum(int((a != 0).sum()) for a in acts)
    assert len(s.decoder) == sum(int((a != 0).sum()) * (lm.n_layers - l) for l, a in enumerate(acts))
    for layer in range(lm.n_layers):
        x = fw.mlp_in[layer][0]
        tc = clt.encoders[layer]
        recon = sum(acts[src] @ decs[src][:, layer - src] for src in range(layer + 1)) + tc.b_dec + tc.skip(x)
        torch.testing.assert_close(recon[1:] + s.errors[layer, 1:], fw.mlp_out[layer][0, 1:], rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_cross_layer_logit_edges_are_gradient_times_activation(tiny_lm, arch):
    """A cross-layer feature's edge into a logit is the sum over the blocks it writes to of the frozen model's
    gradient there (torch.autograd) · activation × that block's decoder slice."""
    lm = tiny_lm(arch)
    clt, decs = random_clt(lm)
    graph, s = build(lm, clt)
    n, n_sel = graph.adjacency_matrix.shape[0], graph.n_features
    vecs = algo.logit_vectors(lm, torch.tensor([t for _, t in graph.logit_targets]))
    with rep.frozen(lm):
        fw = rep.forward(lm, IDS, clt, 1)
        for j, vec in enumerate(vecs):
            grads = torch.autograd.grad(fw.final[0, -1] @ vec, fw.mlp_out, retain_graph=True)
            row = graph.adjacency_matrix[n - graph.n_logits + j]
            for i in range(n_sel):
                layer, pos, feat = s.active[graph.selected_features[i]].tolist()
                value = s.values[graph.selected_features[i]]
                want = sum(float(grads[out][0, pos] @ (value * decs[layer][feat, out - layer]))
                           for out in range(layer, lm.n_layers))
                assert abs(float(row[i]) - want) <= 1e-5 * (1 + abs(want)), (i, float(row[i]), want)


def test_cross_layer_folder_reads_lazily(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    """circuit-tracer's CLT files read back to the same transcoder (skip in its x @ W_skip_l orientation); the CLI's
    graph equals the analysis on the in-memory CLT, reading only the active features' decoder rows."""
    from anatomy_cli.engine.replacement import open_transcoders
    from anatomy_cli.models import transcoders as files

    lm = tiny_lm("llama")
    clt, decs = random_clt(lm, skip=True)
    ts = files.describe(write_clt(tmp_path / "clt", clt, decs))
    assert ts.cross_layer and ts.n_layers == lm.n_layers and (ts.d_model, ts.d_transcoder) == (lm.d_model, 16)
    got = open_transcoders(ts, lm.device)
    x = torch.randn(3, lm.d_model)
    torch.testing.assert_close(got.layer(1).skip(x), x @ clt.encoders[1].W_skip.T)
    torch.testing.assert_close(got.layer(1).W_enc, clt.encoders[1].W_enc)
    ids = torch.tensor([0, 3, 4, 5, 9])
    torch.testing.assert_close(got.decoder_rows(1, ids[[2, 0, 2]]), decs[1][ids[[2, 0, 2]]])
    reads = []
    read = files.read_decoder
    monkeypatch.setattr(files, "read_decoder", lambda t, layer, i: reads.append((layer, list(i))) or read(t, layer, i))
    out = tmp_path / "graph.pt"
    result = invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")),
                    "--device", "cpu", "--transcoders", str(ts.root), "--bos", "--out", str(out),
                    "--max-feature-nodes", "20", "--batch-size", "8", "--check", "5", "-f", "json")
    assert result.exit_code == 0, result.stderr
    saved = torch.load(out, weights_only=False, pickle_module=_stub_pickle())
    assert saved["scan"] == "tiny-clt"
    scale = float(saved["adjacency_matrix"].abs().max())
    assert json.loads(result.stdout)["check"]["max_abs_error"] <= 1e-5 * scale
    clt.layers = [rep.Transcoder(t.W_enc, t.b_enc, t.W_dec, t.b_dec, torch.zeros(16), W_skip=t.W_skip)
                  for t in clt.encoders]  # the files' JumpReLU at threshold 0 (= ReLU but for exact zeros)
    s = algo.setup(lm, saved["input_tokens"], clt)
    targets = torch.tensor([t.vocab_idx for t in saved["logit_targets"]])
    a, sel, _ = algo.attribute(lm, saved["input_tokens"], clt, targets, saved["logit_probabilities"], batch_size=8,
                               max_feature_nodes=20, s=s)
    torch.testing.assert_close(saved["adjacency_matrix"], a)
    assert torch.equal(saved["selected_features"], sel)
    want = sorted({(layer, f) for layer, _, f in s.active.tolist()})
    assert sorted({(layer, f) for layer, fs in reads for f in fs}) == want  # no other decoder row was read
    assert len(want) < 16 * lm.n_layers


def test_cross_layer_offload_gives_the_same_graph(tiny_model_dir, tiny_lm, tmp_path):
    """--offload disk / cpu with a cross-layer transcoder: its encoders wait out of the way (only W_skip_l held,
    in the per-layer sets' x @ W_skip.T orientation), its decoders are read row by row as without; the graph, the
    selected features and the intervention check equal those of the run without --offload, bit for bit."""
    from anatomy_cli.engine.replacement import Offloaded
    from anatomy_cli.engine.replacement import open_transcoders
    from anatomy_cli.models import transcoders as files

    lm = tiny_lm("llama")
    clt, decs = random_clt(lm, skip=True)
    ts = files.describe(write_clt(tmp_path / "clt", clt, decs))
    held = open_transcoders(ts, lm.device, "disk")
    for layer in range(lm.n_layers):
        t = held.layer(layer)
        assert isinstance(t, Offloaded) and not hasattr(t, "W_enc")
        torch.testing.assert_close(t.W_skip, clt.encoders[layer].W_skip)
        with t.weights() as full:
            torch.testing.assert_close(full.W_enc, clt.encoders[layer].W_enc)
            assert full.W_dec.shape == (16, 0)
    graphs = {}
    for how in (None, "disk", "cpu"):
        out = tmp_path / f"{how}.pt"
        extra = [] if how is None else ["--offload", how]
        result = invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")),
                        "--device", "cpu", "--transcoders", str(ts.root), "--bos", "--out", str(out),
                        "--max-feature-nodes", "20", "--batch-size", "8", "--check", "3", "-f", "json", *extra)
        assert result.exit_code == 0, result.stderr
        graphs[how] = (torch.load(out, weights_only=False, pickle_module=_stub_pickle()), json.loads(result.stdout))
    base, base_json = graphs[None]
    assert base["adjacency_matrix"].abs().max() > 0
    for how in ("disk", "cpu"):
        g, data = graphs[how]
        for key in ("adjacency_matrix", "active_features", "selected_features", "activation_values"):
            assert torch.equal(g[key], base[key]), (how, key)
        assert data["paths"] == base_json["paths"] and data["check"] == base_json["check"]


def test_cross_layer_estimate_counts_every_decoder_row(tiny_model_dir, tiny_lm, tmp_path):
    """--estimate with a cross-layer transcoder: a feature active at block l keeps L - l decoder rows (summed here
    block by block), the encoders' files are what is held (numpy on the files), --offload disk one block's plus
    the skip matrices."""
    import numpy as np
    from safetensors.numpy import load_file

    lm = tiny_lm("llama")
    clt, decs = random_clt(lm, skip=True)
    root = write_clt(tmp_path / "clt", clt, decs)
    args = ["circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")), "--device", "cpu",
            "--transcoders", str(root), "--bos", "--estimate", "-f", "json"]
    est = json.loads(invoke(*args).stdout)
    L, P, F, d = lm.n_layers, est["n_tokens"], 16, lm.d_model
    A = L * (P - 1) * F
    rows = sum((P - 1) * F * (L - layer) for layer in range(L))
    assert est["active_features_bound"] == A
    assert est["setup_bytes"] == 4 * ((A + rows) * d + L * P * d)
    enc = [load_file(str(root / f"W_enc_{layer}.safetensors")) for layer in range(L)]
    assert est["transcoder_bytes"] == sum(a.astype(np.float32).nbytes for f in enc for a in f.values())
    disk = json.loads(invoke(*args, "--offload", "disk").stdout)
    skips = sum(f[f"W_skip_{layer}"].nbytes for layer, f in enumerate(enc))
    assert disk["transcoder_bytes"] == sum(a.astype(np.float32).nbytes for a in enc[0].values()) + skips


def write_sae_folders(root, tcs, fmt, *, k=None):
    """``tcs`` as one library transcoder folder per block, each config the library's own (the fixtures' cfg.json,
    written by SAELens 6 and sparsify) with this block's hooks: SAELens' ``jumprelu_transcoder`` (``W_enc [d, F]``,
    ``threshold``, ``W_skip``) or sparsify's TopK ``layers.N.mlp`` (``encoder.weight [F, d]``)."""
    from conftest import ROOT
    from safetensors.torch import save_file

    fixtures = ROOT / "tests" / "fixtures" / "sae"
    for layer, tc in enumerate(tcs):
        d_sae, d = tc.W_enc.shape
        skip = {} if tc.W_skip is None else {"W_skip": tc.W_skip.contiguous()}
        if fmt == "saelens":
            cfg = json.loads((fixtures / "saelens-transcoder" / "cfg.json").read_text())
            cfg.update(d_in=d, d_out=d, d_sae=d_sae, architecture="jumprelu_transcoder")
            cfg["metadata"].update(hook_name=f"blocks.{layer}.ln2.hook_normalized",
                                   hook_name_out=f"blocks.{layer}.hook_mlp_out")
            folder, weights = root / f"blocks.{layer}.transcoder", "sae_weights.safetensors"
            tensors = {"W_enc": tc.W_enc.T.contiguous(), "threshold": tc.threshold}
        else:
            cfg = json.loads((fixtures / "sparsify" / "layers.0.mlp" / "cfg.json").read_text())
            cfg.update(d_in=d, num_latents=d_sae, k=k, skip_connection=tc.W_skip is not None)
            folder, weights = root / f"layers.{layer}.mlp", "sae.safetensors"
            tensors = {"encoder.weight": tc.W_enc}
        tensors.update({"encoder.bias" if fmt == "sparsify" else "b_enc": tc.b_enc, "W_dec": tc.W_dec,
                        "b_dec": tc.b_dec, **skip})
        folder.mkdir(parents=True)
        (folder / "cfg.json").write_text(json.dumps(cfg))
        save_file({key: v.contiguous() for key, v in tensors.items()}, str(folder / weights))
    return root


def write_gemma_scope(root, tcs, *, release="gemma-scope-tiny-transcoders", l0=5):
    """``tcs`` (each with a JumpReLU ``threshold``) as Gemma Scope's published transcoders lay them out
    (google/gemma-scope-2b-pt-transcoders): ``{release}/layer_{l}/width_{F}/average_l0_{l0}/params.npz`` with
    ``W_enc [d, F]``, ``W_dec [F, d]``, ``b_enc``, ``b_dec``, ``threshold``; ``release`` None: no release folder."""
    import numpy as np

    base = root / release if release else root
    for layer, tc in enumerate(tcs):
        folder = base / f"layer_{layer}" / f"width_{tc.W_enc.shape[0]}" / f"average_l0_{l0}"
        folder.mkdir(parents=True)
        np.savez(folder / "params.npz", W_enc=tc.W_enc.T.numpy(), W_dec=tc.W_dec.numpy(), b_enc=tc.b_enc.numpy(),
                 b_dec=tc.b_dec.numpy(), threshold=tc.threshold.numpy())
    return base


@pytest.mark.parametrize("fmt", ["saelens", "sparsify", "gemma_scope", "gemma_scope_unnamed"])
def test_sae_transcoder_folders_give_the_ct_sets_graph(tiny_model_dir, tiny_lm, tmp_path, fmt):
    """The same weights as SAELens (JumpReLU, skip) or sparsify (TopK) folders, one per block, or as Gemma Scope
    params.npz files (JumpReLU; under a ``-transcoders`` release folder, or under none: ``--transcoders`` says they
    are transcoders), and as a circuit-tracer transcoder_set (``threshold`` / ``k: 4``): the same graph.pt, edge for
    edge."""
    lm = tiny_lm("llama")
    tcs = random_transcoders(lm, skip=fmt == "saelens")
    for tc in tcs:
        tc.threshold = None if fmt == "sparsify" else torch.full((16,), 0.05)
    ct_set = write_transcoder_set(tmp_path / "ct", lm, tcs, extra="k: 4\n" if fmt == "sparsify" else "")
    if fmt != "sparsify":
        from safetensors.torch import load_file
        from safetensors.torch import save_file

        for layer, tc in enumerate(tcs):  # the ct files with the threshold and skip the SAELens ones carry
            f = ct_set / f"layer_{layer}.safetensors"
            skip = {} if tc.W_skip is None else {"W_skip": tc.W_skip}
            save_file({**load_file(str(f)), "activation_function.threshold": tc.threshold, **skip}, str(f))
    sae = (write_sae_folders(tmp_path / fmt, tcs, fmt, k=4) if not fmt.startswith("gemma") else
           write_gemma_scope(tmp_path / "gs", tcs, release=None if fmt.endswith("unnamed") else
                             "gemma-scope-tiny-transcoders"))
    graphs = []
    for folder in (ct_set, sae):
        out = tmp_path / f"{folder.name}.pt"
        result = invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")),
                        "--device", "cpu", "--transcoders", str(folder), "--bos", "--out", str(out),
                        "--max-feature-nodes", "20", "--batch-size", "8", "-f", "json")
        assert result.exit_code == 0, result.stderr
        graphs.append(torch.load(out, weights_only=False, pickle_module=_stub_pickle()))
    want, got = graphs
    assert got["active_features"].tolist() == want["active_features"].tolist()
    assert len(want["active_features"]) > 20
    if fmt == "sparsify":  # TopK: 4 active per block and position (position 0 kept out)
        assert len(want["active_features"]) == 4 * lm.n_layers * (len(want["input_tokens"]) - 1)
    assert torch.equal(got["selected_features"], want["selected_features"])
    # fp32: the folders store W_skip / the decoder transposed from the ct files, so the products sum in another order
    # (2.5e-5 relative on one AMD CPU); the bound against circuit-tracer is 1e-4
    torch.testing.assert_close(got["adjacency_matrix"], want["adjacency_matrix"], rtol=1e-4, atol=1e-6)


def _one_line_refusal(result, want):
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and want in lines[0], result.stderr


def test_gemma_scope_refusals_and_variants(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    """Gemma Scope params.npz folders refused in one line before any weight loads: a block missing (block 0), a block with two
    average_l0_N variants (both named), SAEs of a -res release (not transcoders); a folder of layer_N links to the
    chosen variants reads (the documented way to pick), its graph that of the variant folder; anatomy sae's reader
    takes a -transcoders path as block N's MLP transcoder."""
    import shutil

    import anatomy_cli.cli.commands.circuit as command
    from anatomy_cli.models.sae.read import read

    lm = tiny_lm("llama")
    model = str(tiny_model_dir("llama"))
    tcs = random_transcoders(lm)
    for tc in tcs:
        tc.threshold = torch.full((16,), 0.05)

    def run(folder, *more):
        return invoke("circuit", "The capital of France is", "--model", model, "--device", "cpu", "--transcoders",
                      str(folder), "--bos", "--max-feature-nodes", "20", "--batch-size", "8", "-f", "json", *more)

    gs = write_gemma_scope(tmp_path / "a", tcs)
    got = read(gs / "layer_1" / "width_16" / "average_l0_5")
    assert (got.transcoder, got.site, got.site_out) == (True, "blocks.1.mlp.hook_in", "blocks.1.hook_mlp_out")
    write_gemma_scope(tmp_path / "a", tcs, l0=9)  # a second variant of every block
    pick = tmp_path / "pick"
    pick.mkdir()
    for layer in range(lm.n_layers):
        (pick / f"layer_{layer}").symlink_to(gs / f"layer_{layer}" / "width_16" / "average_l0_9")
    missing = write_gemma_scope(tmp_path / "m", tcs)
    shutil.rmtree(missing / "layer_0")
    short = write_gemma_scope(tmp_path / "s", tcs)
    shutil.rmtree(short / "layer_1")  # the last one missing: the folder itself cannot tell, the model's depth does
    res = write_gemma_scope(tmp_path / "r", tcs, release="gemma-scope-tiny-res")
    monkeypatch.setattr(command, "load_weights", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("loaded")))
    _one_line_refusal(run(gs), "block 0 has 2 transcoders (layer_0/width_16/average_l0_5, "
                      "layer_0/width_16/average_l0_9); point --transcoders at a folder holding one per block")
    _one_line_refusal(run(missing), "has 2 blocks (0-1): none for block 0 (one folder per block, every block 0..L-1)")
    _one_line_refusal(run(short), "--transcoders has transcoders for block 0, but")
    assert "has 2 blocks (0-1): none for block 1" in run(short).stderr
    _one_line_refusal(run(res), "an SAE at blocks.0.hook_resid_post, not a transcoder")
    monkeypatch.undo()
    out = tmp_path / "pick.pt", tmp_path / "one.pt"
    assert run(pick, "--out", str(out[0])).exit_code == 0
    shutil.rmtree(tmp_path / "a")
    one = write_gemma_scope(tmp_path / "a", tcs, l0=9)
    assert run(one, "--out", str(out[1])).exit_code == 0
    a, b = (torch.load(p, weights_only=False, pickle_module=_stub_pickle()) for p in out)
    assert torch.equal(a["adjacency_matrix"], b["adjacency_matrix"]) and len(a["active_features"]) > 20


def test_a_folder_per_block_missing_blocks_above_and_below_names_every_one(tiny_model_dir, tiny_lm, tmp_path,
                                                                           monkeypatch):
    """A folder of per-block transcoders holding blocks 0 and 2 of a 4-block model (the tiny llama's config with 4
    blocks: the refusal comes before any weight loads, so its 2 blocks of weights are never read): one line naming
    every block missing of 0..3, the one between those present (1) and the one above the highest (3), as
    range(4) less {0, 2} gives them; before, the folder's own check named block 1 only. A fifth block (4) the model
    lacks is named too."""
    import anatomy_cli.cli.commands.circuit as command
    from anatomy_cli.models.sites import block_spans

    lm = tiny_lm("llama")
    model = tmp_path / "four"
    shutil.copytree(tiny_model_dir("llama"), model)
    cfg = json.loads((model / "config.json").read_text())
    cfg["num_hidden_layers"] = 4
    cfg.pop("layer_types", None)
    (model / "config.json").write_text(json.dumps(cfg))
    tcs = random_transcoders(lm)
    for tc in tcs:
        tc.threshold = torch.full((16,), 0.05)
    gaps = write_gemma_scope(tmp_path / "g", tcs)
    (gaps / "layer_1").rename(gaps / "layer_2")  # blocks 0 and 2
    more = write_gemma_scope(tmp_path / "m", tcs + tcs[:1], l0=5)
    (more / "layer_1").rename(more / "layer_4")  # blocks 0, 2 and 4 (layer_2 is the third transcoder)
    monkeypatch.setattr(command, "load_weights", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("loaded")))

    def run(folder):
        return invoke("circuit", "The capital of France is", "--model", str(model), "--device", "cpu",
                      "--transcoders", str(folder))

    missing = sorted(set(range(4)) - {0, 2})
    assert block_spans(missing) == "blocks 1,3"
    _one_line_refusal(run(gaps), f"--transcoders has transcoders for blocks 0,2, but four has 4 blocks (0-3): none "
                      f"for {block_spans(missing)} (one folder per block, every block 0..L-1)")
    _one_line_refusal(run(more), "--transcoders has transcoders for blocks 0,2,4, but four has 4 blocks (0-3): none "
                      "for blocks 1,3; the model has no block 4")


def test_gemma_scope_estimate_reads_headers_only(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    """--estimate on params.npz transcoders reads the npz members' headers (np.load never called): F, every block's
    float32 bytes (W_enc, W_dec, b_enc, b_dec, threshold), the JumpReLU bound of every feature."""
    import numpy as np

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    for tc in tcs:
        tc.threshold = torch.full((16,), 0.05)
    gs = write_gemma_scope(tmp_path, tcs)
    monkeypatch.setattr(np, "load", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("np.load")))
    result = invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("llama")), "--device", "cpu",
                    "--transcoders", str(gs), "--bos", "--estimate", "-f", "json")
    assert result.exit_code == 0, result.stderr
    e = json.loads(result.stdout)
    L, d, F = lm.n_layers, lm.d_model, 16
    assert (e["d_transcoder"], e["k"], e["active_features_bound"]) == (F, None, L * (e["n_tokens"] - 1) * F)
    assert e["transcoder_bytes"] == L * 4 * (2 * F * d + 2 * F + d)


ZERO = [2, 5, 7]  # channels whose pre-MLP norm gain is 0 (Gemma: weight -1, as in the real Gemma-3-270M)


def _gained(tiny_model_dir, arch, zero=False):
    """A fresh load of the tiny ``arch`` model whose pre-MLP norms have random gains (LayerNorm: biases too);
    ``zero``: a gain of 0 in channels ZERO of every block. Returns (lm, its blocks, the norm's name)."""
    from anatomy_cli import engine

    lm = engine.load(str(tiny_model_dir(arch)), device="cpu")  # its own copy: its norms' gains are changed
    norm_name = {"gemma2": "pre_feedforward_layernorm", "gemma3": "pre_feedforward_layernorm", "gpt2": "ln_2"}[arch]
    blocks = lm.model.base_model.get_submodule(lm.adapter.blocks)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for block in blocks:
            norm = block.get_submodule(norm_name)
            norm.weight.copy_(torch.randn(norm.weight.shape, generator=g))  # Gemma's gain is 1 + weight
            if zero:
                norm.weight[ZERO] = -1.0 if arch.startswith("gemma") else 0.0
            if getattr(norm, "bias", None) is not None:
                norm.bias.copy_(torch.randn(norm.bias.shape, generator=g) * 0.3)
    return lm, blocks, norm_name


@pytest.mark.parametrize("arch", ["gemma2", "gpt2", "gemma3"])
def test_ln2_hook_normalized_reads_before_the_norms_gain(tiny_model_dir, tmp_path, arch):
    """Transcoders of ``ln2.hook_normalized`` (Gemma Scope's params.npz; a SAELens folder with a skip) read the
    pre-MLP norm's normalised vector before its gain and bias, as TransformerLens hooks it and circuit-tracer maps it
    (Gemma Scope's release folds the gain into the MLP): on a model whose pre-MLP norm has a random gain (GPT-2's
    LayerNorm a bias too; Gemma 3's a gain of 0 in some channels, as the real Gemma-3-270M's), the active features,
    their values and the error nodes are those computed by hand from a hook on the norm's input, ``x / RMS(x)``
    (Gemma) or ``(x - mean) / σ`` (GPT-2)."""
    from anatomy_cli.engine.norm_gain import mlp_norm_gain
    from anatomy_cli.engine.replacement import open_transcoders
    from anatomy_cli.models import transcoders as files

    lm, blocks, norm_name = _gained(tiny_model_dir, arch, zero=arch == "gemma3")
    if arch == "gemma3":
        assert mlp_norm_gain(lm, 1).gain[ZERO].abs().max() == 0
    tcs = random_transcoders(lm, skip=arch == "gpt2")
    for tc in tcs:
        tc.threshold = torch.full((16,), 0.05)
    folder = write_gemma_scope(tmp_path, tcs) if arch != "gpt2" else write_sae_folders(tmp_path / "sl", tcs, "saelens")
    ts = files.describe(folder)
    assert ts.before_gain
    s = algo.setup(lm, IDS, open_transcoders(ts, lm.device))
    disk = algo.setup(lm, IDS, open_transcoders(ts, lm.device, "disk"))  # W_skip alone: the same
    assert torch.equal(disk.values, s.values) and torch.equal(disk.errors, s.errors)
    seen = {}
    hooks = []
    for layer, block in enumerate(blocks):
        hooks.append(block.get_submodule(norm_name).register_forward_hook(
            lambda m, a, o, layer=layer: seen.__setitem__(("x", layer), a[0][0].detach())))
        module, side = lm.points[f"blocks.{layer}.hook_mlp_out"]
        hooks.append(module.register_forward_hook(
            lambda m, a, o, layer=layer, side=side: seen.__setitem__(("out", layer), (a[0] if side == "input" else o)[0]
                                                                     .detach())))
    with torch.no_grad():
        lm.model(input_ids=IDS[None])
    for h in hooks:
        h.remove()
    for layer, tc in enumerate(tcs):
        x, eps = seen[("x", layer)], blocks[layer].get_submodule(norm_name).eps
        n = ((x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + eps).sqrt() if arch == "gpt2"
             else x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))
        pre = n @ tc.W_enc.T + tc.b_enc
        acts = pre * (pre > tc.threshold)
        acts[0] = 0
        mine = s.active[:, 0] == layer
        assert s.active[mine, 1:].tolist() == acts.nonzero().tolist()
        torch.testing.assert_close(s.values[mine], acts[acts != 0], rtol=1e-4, atol=1e-5)
        recon = acts @ tc.W_dec + tc.b_dec + (0 if tc.W_skip is None else n @ tc.W_skip.T)
        torch.testing.assert_close(s.errors[layer, 1:], seen[("out", layer)][1:] - recon[1:], rtol=1e-4, atol=1e-4)
    assert len(s.active) > 10


def test_ln2_hook_normalized_with_gains_of_0_keeps_the_graphs_identities(tiny_model_dir, tmp_path):
    """Gemma 3 with a pre-MLP gain of 0 in some channels, transcoders of ``ln2.hook_normalized``: the graph's own
    identities hold as for any other (circuit_check: each node's incoming edges plus its bias terms equal its value,
    edges re-measured by intervention equal their weights), and the CLI runs and passes its --check."""
    from anatomy_cli.analyses import circuit_check as chk
    from anatomy_cli.engine.replacement import PerLayer
    from anatomy_cli.models import transcoders as files

    lm, _, _ = _gained(tiny_model_dir, "gemma3", zero=True)
    tcs = PerLayer(random_transcoders(lm, skip=True), before_gain=True)
    graph, s = build(lm, tcs, max_feature_nodes=20)
    fp = chk.FrozenPrompt(lm, IDS, tcs, graph, s)
    n = graph.adjacency_matrix.shape[0]
    rows = list(range(graph.n_features)) + list(range(n - graph.n_logits, n))
    for r, b in zip(rows, chk.bias_terms(fp, rows)):
        value = fp.value(fp.base, r)
        assert abs(float(graph.adjacency_matrix[r].sum()) + b - value) <= 1e-4 * (1 + abs(value)), r
    scale = float(graph.adjacency_matrix.abs().max())
    for c in chk.check_edges(fp, 30):
        assert abs(c.measured - c.weight) <= 1e-5 * scale, c
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir("gemma3"), folder)  # the tokenizer; the weights with the gains of 0:
    lm.model.save_pretrained(folder)
    for tc in tcs.layers:
        tc.threshold = torch.full((16,), 0.05)
    ts = files.describe(write_gemma_scope(tmp_path, list(tcs.layers)))
    out = tmp_path / "graph.pt"
    result = invoke("circuit", "The capital of France is", "--model", str(folder), "--device", "cpu",
                    "--transcoders", str(ts.root), "--bos", "--out", str(out), "--max-feature-nodes", "20",
                    "--batch-size", "8", "--check", "5", "-f", "json")
    assert result.exit_code == 0, result.stderr
    scale = float(torch.load(out, weights_only=False, pickle_module=_stub_pickle())["adjacency_matrix"].abs().max())
    assert json.loads(result.stdout)["check"]["max_abs_error"] <= 1e-5 * scale


def test_ln2_hook_normalized_on_a_model_whose_mlp_reads_no_norm_is_refused(tiny_model_dir, tiny_lm, tmp_path,
                                                                            monkeypatch):
    """OLMo 2's MLP reads the residual stream itself (its norms come after the sub-layers): Gemma Scope transcoders
    (of ``ln2.hook_normalized``) are refused in one line before any weight loads, as ``anatomy sae`` refuses them
    (models/sae/names.py ``mlp_norm``)."""
    import anatomy_cli.cli.commands.circuit as command

    tcs = random_transcoders(tiny_lm("olmo2"))
    for tc in tcs:
        tc.threshold = torch.full((16,), 0.05)
    gs = write_gemma_scope(tmp_path, tcs)
    monkeypatch.setattr(command, "load_weights", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("loaded")))
    _one_line_refusal(invoke("circuit", "The capital of France is", "--model", str(tiny_model_dir("olmo2")),
                             "--device", "cpu", "--transcoders", str(gs), "-f", "json"),
                      "MLP reads no norm's output")
