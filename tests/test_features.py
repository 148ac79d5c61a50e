"""`anatomy features`: per-feature statistics, contexts, logit effects and delphi's cache over a corpus, checked
against a brute-force computation (transformers' hidden states, the SAE's encoder written out in numpy, every token
sorted)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()
D_SAE = 24
HOOK = "blocks.0.hook_resid_post"
TEXT = ("The cat sat on the mat because it was warm. A dog barked at the mailman, who ran away quickly. "
        "In the morning the sun rose over the hills and the birds began to sing. Numbers like 12, 345 and 6789 "
        "appear in tables; words like however, therefore and moreover join sentences.\n") * 3


def write_sae(folder: Path, d_in: int = 32, seed: int = 0) -> Path:
    """A SAELens standard SAE: random encoder; feature 0 dead (bias -1e3), feature 1 always on (no weights,
    bias 1)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    w_enc = rng.normal(size=(d_in, D_SAE)).astype(np.float32) * 10 / np.sqrt(d_in)  # the tiny model: norm ~0.2
    b_enc = rng.normal(scale=0.3, size=D_SAE).astype(np.float32)
    w_enc[:, 0], b_enc[0] = 0, -1e3
    w_enc[:, 1], b_enc[1] = 0, 1.0
    w_dec = rng.normal(size=(D_SAE, d_in)).astype(np.float32)
    b_dec = rng.normal(scale=0.1, size=d_in).astype(np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"W_enc": w_enc, "b_enc": b_enc, "W_dec": w_dec, "b_dec": b_dec}, str(folder / "sae_weights.safetensors"))
    cfg = {"d_in": d_in, "d_sae": D_SAE, "dtype": "float32", "apply_b_dec_to_input": True,
           "normalize_activations": "none", "architecture": "standard",
           "metadata": {"hook_name": HOOK, "prepend_bos": False, "context_size": 64, "model_name": "tiny-gpt2"}}
    (folder / "cfg.json").write_text(json.dumps(cfg))
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("features")
    sae = write_sae(root / "sae")
    corpus = root / "corpus.txt"
    corpus.write_text(TEXT)
    return tiny_model_dir("gpt2"), sae, corpus, root


def invoke(*args):
    result = runner.invoke(app, [str(a) for a in args])
    return result


def run_json(model, sae, corpus, *more):
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--shard-windows", 3, "--format", "json", *more)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def brute(model_dir, sae, ctx=16):
    """Windows cut by hand (the text's GPT-2 tokens, EOS after the document, ctx at a time; no BOS) and every
    token's features: relu((x - b_dec) W_enc + b_enc) at block 0's output."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(TEXT, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    windows = [ids[i:i + ctx] for i in range(0, len(ids), ctx)]
    windows = [w for w in windows if len(w) >= 2]
    hf = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    w = load_file(str(sae / "sae_weights.safetensors"))
    acts = []
    for win in windows:
        with torch.no_grad():
            x = hf(torch.tensor([win]), output_hidden_states=True).hidden_states[1][0].numpy()
        acts.append(np.maximum((x - w["b_dec"]) @ w["W_enc"] + w["b_enc"], 0))
    return windows, acts, hf, w


def module_inputs(hf, module, windows):
    """``module``'s input at every token of ``windows`` (each window one forward of ``hf``): [tokens, width]."""
    seen = []
    handle = module.register_forward_pre_hook(lambda m, a: seen.append(a[0][0].detach()))
    try:
        with torch.no_grad():
            for win in windows:
                hf(torch.tensor([win]))
    finally:
        handle.remove()
    return torch.cat(seen)


def test_statistics_and_top_contexts_equal_a_brute_force_pass(setup):
    model, sae, corpus, _ = setup
    data = run_json(model, sae, corpus, "--top-k", 4, "--window", 2)
    windows, acts, _, _ = brute(model, sae)
    flat = np.concatenate(acts)  # [tokens, d_sae]
    assert data["tokens"] == len(flat) and data["windows"] == len(windows)
    rows = {r["feature"]: r for r in data["features"]}
    assert sorted(rows) == list(range(D_SAE))
    for f in range(D_SAE):
        fires = flat[:, f] > 0
        r = rows[f]
        assert r["fires"] == int(fires.sum())
        assert r["frequency"] == pytest.approx(fires.mean())
        assert r["max_activation"] == pytest.approx(float(flat[:, f].max()), rel=1e-5, abs=1e-6)
        if fires.any():
            assert r["mean_activation"] == pytest.approx(float(flat[fires, f].mean()), rel=1e-5)
        assert sum(r["histogram"]) == r["fires"]
    assert rows[0]["status"] == "dead" and rows[0]["mean_activation"] is None
    assert rows[1]["status"] == "always-on"
    # top contexts: every token sorted by activation (then window, then position)
    for f in (2, 14, 15, 21):
        entries = sorted(((-float(a[p, f]), k, p) for k, a in enumerate(acts) for p in range(len(a))
                          if a[p, f] > 0))[:4]
        got = [c for c in data["contexts"] if c["feature"] == f and c["kind"] == "top"]
        assert [(c["window"], c["position"]) for c in got] == [(k, p) for _, k, p in entries]
        assert [c["activation"] for c in got] == pytest.approx([-a for a, _, _ in entries], rel=1e-5)
        for c in got:  # the context: 2 tokens each side within the window, this feature's activation at each
            k, p = c["window"], c["position"]
            lo, hi = max(0, p - 2), min(len(windows[k]), p + 3)
            assert c["token_ids"] == windows[k][lo:hi]
            assert c["activations"] == pytest.approx(acts[k][lo:hi, f].tolist(), rel=1e-5, abs=1e-6)
            assert c["token_ids"][c["at"]] == windows[k][p]


def test_cofiring_counts_equal_a_brute_force_count(setup):
    model, sae, corpus, _ = setup
    data = run_json(model, sae, corpus, "--features", "14-17", "--cooccur", 3)
    flat = np.concatenate(brute(model, sae)[1]) > 0
    assert [r["feature"] for r in data["features"]] == [14, 15, 16, 17]
    for r in data["features"]:
        f = r["feature"]
        counts = (flat[:, f:f + 1] & flat).sum(0)
        counts[f] = 0
        want = sorted(((-int(c), g) for g, c in enumerate(counts) if c > 0))[:3]
        assert [(c["feature"], c["tokens"]) for c in r["cooccurring"]] == [(g, -c) for c, g in want]


def test_quantile_samples_lie_in_their_intervals_and_follow_the_seed(setup):
    model, sae, corpus, _ = setup
    data = run_json(model, sae, corpus, "--features", "15,20", "--quantiles", 4, "--quantile-size", 2)
    windows, acts, _, _ = brute(model, sae)
    sampled = [c for c in data["contexts"] if c["kind"] == "quantile"]
    assert {c["quantile"] for c in sampled if c["feature"] == 15} == {0, 1, 2, 3}
    for c in sampled:
        assert c["lower"] <= c["activation"] <= c["upper"]
        assert acts[c["window"]][c["position"], c["feature"]] == pytest.approx(c["activation"], rel=1e-5)
    again = run_json(model, sae, corpus, "--features", "15,20", "--quantiles", 4, "--quantile-size", 2)
    other = run_json(model, sae, corpus, "--features", "15,20", "--quantiles", 4, "--quantile-size", 2, "--seed", 7)

    def picked(d):
        return [(c["window"], c["position"]) for c in d["contexts"] if c["kind"] == "quantile"]

    assert picked(again) == picked(data) and picked(other) != picked(data)


def test_logit_effects_are_the_gain_folded_decoder_rows_through_the_unembedding(setup):
    model, sae, corpus, _ = setup
    data = run_json(model, sae, corpus, "--feature", 3, "--logit-top", 5)
    _, _, hf, w = brute(model, sae)
    gamma = hf.transformer.ln_f.weight.detach().numpy()
    effects = (w["W_dec"][3] * gamma) @ hf.lm_head.weight.detach().numpy().T
    effects = effects - effects.mean()
    top = [r for r in data["logit_effects"] if r["side"] == "top"]
    bottom = [r for r in data["logit_effects"] if r["side"] == "bottom"]
    assert [r["token_id"] for r in top] == np.argsort(-effects)[:5].tolist()
    assert [r["effect"] for r in top] == pytest.approx(np.sort(effects)[::-1][:5].tolist(), rel=1e-4)
    assert [r["token_id"] for r in bottom] == np.argsort(effects)[:5].tolist()


def test_resume_after_a_lost_shard_gives_the_same_files(setup, tmp_path):
    import pyarrow.parquet as pq

    model, sae, corpus, _ = setup
    out = tmp_path / "run"
    first = run_json(model, sae, corpus, "--features", "0-9", "--out", out)
    tables = {n: pq.read_table(out / n) for n in ("features.parquet", "contexts.parquet", "logit_effects.parquet")}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"]["tokens"] == first["tokens"]
    (out / "shards" / "shard-00001.parquet").unlink()  # as a run killed before that shard was written
    again = run_json(model, sae, corpus, "--features", "0-9", "--out", out)
    assert again["resumed"] == first["shards"] - 1
    # the cost printed before the pass counts only what is left: every shard's tokens but shard 1's (windows 3-5
    # of 16 tokens), whose FLOP the first run's estimate counted and this one's does not
    est, was = again["estimate"], first["estimate"]
    assert (was["resumed_shards"], was["resumed_tokens"]) == (0, 0)
    assert (est["resumed_shards"], est["resumed_tokens"]) == (first["shards"] - 1, first["tokens"] - 3 * 16)
    assert est["tokens"] == was["tokens"] and est["flops"] < was["flops"]
    per_token = (was["flops"] - est["flops"]) / est["resumed_tokens"]
    assert per_token > 2 * 32 * D_SAE  # at least the encoder's multiply-adds per token (d_in 32)
    for name, table in tables.items():
        assert pq.read_table(out / name).equals(table), name
    for key in ("features", "contexts", "logit_effects"):
        assert again[key] == first[key]
    plain = run_json(model, sae, corpus, "--features", "0-9")  # no --out: the same numbers
    assert plain["features"] == first["features"] and plain["contexts"] == first["contexts"]


def test_the_table_is_bounded_and_json_complete(setup):
    model, sae, corpus, _ = setup
    data = run_json(model, sae, corpus)
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--show", 5, "--format", "tsv")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    shown = [int(line.split("\t")[0]) for line in lines[1:]]
    busiest = sorted(data["features"], key=lambda r: (-r["fires"], r["feature"]))
    assert shown == [r["feature"] for r in busiest[:5]]  # most frequent first: `| head` reads the busiest
    assert f"showing the 5 most frequent of {D_SAE} features (--show 5)" in result.stderr
    assert len(data["features"]) == D_SAE  # JSON: every feature
    text = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16, "--show", 1,
                  "--format", "table")
    # the heading names the model as the other commands do (its display name: a local folder's name), not the spec
    assert text.stdout.startswith(f"features · {Path(model).name} · ") and str(model) not in text.stdout
    every = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                   "--show", 0, "--format", "tsv")
    assert len(every.stdout.strip().splitlines()) == D_SAE + 1 and "showing" not in every.stderr
    assert [int(line.split("\t")[0]) for line in every.stdout.strip().splitlines()[1:]] == \
        [r["feature"] for r in busiest]



def test_one_window_is_said_in_the_singular(setup, tmp_path):
    model, sae, _, _ = setup
    short = tmp_path / "short.txt"
    short.write_text("The cat sat on the mat.")  # 7 GPT-2 tokens and the EOS: one window of 16
    result = invoke("features", sae, "--corpus", short, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--show", 1, "--format", "table")
    assert result.exit_code == 0, result.output
    data = run_json(model, sae, short)
    assert data["windows"] == 1 and data["tokens"] == 8
    assert "8 tokens (1 window of 16)" in result.stdout + result.stderr

def test_the_dictionary_s_files_are_read_once(setup, tmp_path, monkeypatch):
    """Issue 60 follow-up: a run reads the dictionary's safetensors file once, with its values, before the model
    opens (it read the header, then the values twice: the check and the pass); --estimate reads its header only."""
    from anatomy_cli.models.sae import read as sae_read

    model, sae, _, _ = setup
    short = tmp_path / "short.txt"
    short.write_text("The cat sat on the mat.")
    reads, real = [], sae_read.safetensors_arrays
    monkeypatch.setattr(sae_read, "safetensors_arrays", lambda path, values=True: (reads.append(values),
                                                                                   real(path, values))[1])
    data = run_json(model, sae, short)
    assert reads == [True] and data["tokens"] == 8
    reads.clear()
    result = invoke("features", sae, "--corpus", short, "--model", model, "--estimate", "--format", "json")
    assert result.exit_code == 0, result.output
    assert reads == [False]


@pytest.mark.parametrize("content, match", [(b"", "has no text"), (b"  \n\n", "has no text"),
                                            (b"good text\n\xff\xfe bad\n", "is not valid UTF-8 (line 2")])
def test_an_empty_or_broken_corpus_is_refused_before_the_model_loads(setup, tmp_path, monkeypatch, content, match):
    from anatomy_cli.engine import loader
    from anatomy_cli.tasks import _features_run

    monkeypatch.setattr(loader.DIRECT, "load_weights", lambda opened: pytest.fail("the weights were loaded"))
    monkeypatch.setattr(_features_run, "open_model", lambda *a, **k: pytest.fail("the model was opened"))
    model, sae, _, _ = setup
    bad = tmp_path / "corpus.txt"
    bad.write_bytes(content)
    result = invoke("features", sae, "--corpus", bad, "--model", model)
    assert result.exit_code == 2 and match in result.stderr, result.output


def test_delphi_layout_reads_back_as_delphi_s_loader_reads_it(setup, tmp_path):
    """delphi/latents/loader.py TensorBuffer.load (EleutherAI/delphi 3c2e139): the split's first latent from the
    file name, ``locations[:, 2] + first_latent``, ``tokens`` as int64; config.json beside the splits."""
    from safetensors.numpy import load_file

    model, sae, corpus, _ = setup
    out, cache = tmp_path / "run", tmp_path / "latents"
    run_json(model, sae, corpus, "--out", out, "--delphi", cache)
    windows, acts, _, _ = brute(model, sae)
    module = cache / HOOK
    config = json.loads((module / "config.json").read_text())
    assert config["cache_ctx_len"] == 16 and config["model_name"] == str(model)
    files = sorted(module.glob("*.safetensors"), key=lambda p: int(p.stem.split("_")[0]))
    edges = [tuple(int(v) for v in p.stem.split("_")) for p in files]
    assert edges[0][0] == 0 and edges[-1][1] == D_SAE - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(edges, edges[1:]))
    got = {}
    for p in files:
        split = load_file(str(p))
        assert split["locations"].dtype == np.uint16 and split["activations"].dtype == np.float16
        locations = split["locations"].astype(np.int64)
        locations[:, 2] += int(p.stem.split("_")[0])
        tokens = split["tokens"].astype(np.int64)
        assert tokens.shape == (len(windows), 16)
        for (b, pos, f), a in zip(locations.tolist(), split["activations"].tolist()):
            got[(b, pos, f)] = a
    want = {(k, p, f): float(a[p, f]) for k, a in enumerate(acts) for p in range(len(a)) for f in range(D_SAE)
            if a[p, f] > 0}
    assert set(got) == set(want)
    assert all(got[key] == pytest.approx(want[key], rel=2e-3, abs=1e-3) for key in want)
    assert [tokens[k, :len(w)].tolist() for k, w in enumerate(windows)] == windows
    assert not (cache / ".shards").exists()


def test_a_delphi_cache_inside_out_is_written_and_resumed(setup, tmp_path):
    """``--out feats --delphi feats/latents`` (the layout explain looks in by default): the run writes both, the
    cache equals one written outside --out, and a second run into the same folders is accepted; a --out that holds anything
    else is still refused (the cache folder is made only after --out is checked)."""
    model, sae, corpus, _ = setup
    feats, outside = tmp_path / "feats", tmp_path / "alone"
    first = run_json(model, sae, corpus, "--out", feats, "--delphi", feats / "latents")
    run_json(model, sae, corpus, "--out", outside, "--delphi", outside / "cache")
    inside = sorted(p.relative_to(feats / "latents") for p in (feats / "latents").rglob("*") if p.is_file())
    assert inside == sorted(p.relative_to(outside / "cache") for p in (outside / "cache").rglob("*") if p.is_file())
    assert any(p.suffix == ".safetensors" for p in inside) and not (feats / "latents" / ".shards").exists()
    again = run_json(model, sae, corpus, "--out", feats, "--delphi", feats / "latents")
    assert again["features"] == first["features"]
    for p in inside:
        assert (feats / "latents" / p).read_bytes() == (outside / "cache" / p).read_bytes()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--out", busy, "--delphi", busy / "latents")
    assert result.exit_code == 2 and "is not empty" in result.output, result.output
    assert not (busy / "latents").exists() and [p.name for p in busy.iterdir()] == ["notes.txt"]


def test_estimate_loads_no_weights(setup):
    model, sae, corpus, _ = setup
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--estimate", "--format", "json")
    assert result.exit_code == 0, result.output
    est = json.loads(result.stdout)["estimate"]
    assert est["features"] == D_SAE and est["tokens_estimated"] and est["tokens"] == len(TEXT) // 4


@pytest.mark.parametrize("args, code, match", [
    (("--features", "5-2"), 2, "--features takes ids and ranges"),
    (("--feature", "99"), 2, "--feature 99 is out of range: the dictionary has 24 features"),
    (("--delphi", "x"), 2, "--delphi DIR needs --out DIR"),
    (("--ctx", "1000"), 2, "--ctx 1000 is more than"),
])
def test_bad_input_is_a_one_line_error(setup, args, code, match):
    model, sae, corpus, _ = setup
    result = invoke("features", sae, "--corpus", corpus, "--model", model, *args)
    assert result.exit_code == code, result.output
    assert match in result.output and "Traceback" not in result.output


def test_a_dictionary_of_another_width_is_refused(setup, tmp_path):
    model, _, corpus, _ = setup
    other = write_sae(tmp_path / "wide", d_in=48)
    result = invoke("features", other, "--corpus", corpus, "--model", model)
    assert result.exit_code == 2 and "error:" in result.output


def test_the_python_api_returns_the_command_s_json(setup):
    import anatomy_cli.api as anatomy
    from anatomy_cli.models.spec import ModelSpec

    model, sae, corpus, _ = setup
    result = anatomy.features(ModelSpec(str(model), device="cpu"), sae, corpus=str(corpus), features="2-3", ctx=16,
                              shard_windows=3)
    cli = run_json(model, sae, corpus, "--features", "2-3")
    assert result.to_dict()["features"] == cli["features"]
    pd = pytest.importorskip("pandas")  # to_pandas(): one row per followed feature
    frame = result.to_pandas()
    assert isinstance(frame, pd.DataFrame) and frame["feature"].tolist() == [2, 3]
    assert frame["frequency"].dtype == "float64" and frame["fires"].dtype == "int64"
    assert frame.to_dict("records") == [{k: r[k] for k in frame.columns} for r in cli["features"]]


def test_a_transcoder_s_features_are_read_at_its_input_before_the_norm_s_gain(setup):
    """SAELens' skip transcoder at blocks.0.ln2.hook_normalized: encoded from the pre-MLP LayerNorm's normalised
    vector (x - mean) / σ, read here with a hook on the norm's input."""
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    model, _, corpus, _ = setup
    folder = Path(__file__).parent / "fixtures" / "sae" / "saelens-transcoder"
    data = run_json(model, folder, corpus, "--features", "0-63", "--cooccur", 0)
    windows, _, _, _ = brute(model, folder)
    hf = AutoModelForCausalLM.from_pretrained(model).eval()
    w = load_file(str(folder / "sae_weights.safetensors"))
    x = module_inputs(hf, hf.transformer.h[0].ln_2, windows).double()
    n = ((x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()).numpy()
    acts = np.maximum(n @ w["W_enc"] + w["b_enc"], 0)
    assert data["dictionary"]["site"] == "blocks.0.mlp.hook_in" and data["tokens"] == len(acts)
    for r in data["features"]:
        f = r["feature"]
        assert r["fires"] == int((acts[:, f] > 0).sum())
        assert r["max_activation"] == pytest.approx(float(acts[:, f].max()), rel=1e-4, abs=1e-5)


def write_ct(root: Path, kind: str, d: int, n_layers: int, F: int = 12, seed: int = 3) -> dict[str, np.ndarray]:
    """circuit-tracer's transcoder_set (``layer_l.safetensors``: W_enc [F, d], W_dec [F, d], b_enc, b_dec) or
    cross_layer_transcoder (``W_enc_l.safetensors``, ``W_dec_l.safetensors`` with W_dec_l [F, L - l, d]) folder of
    random ReLU transcoders; returns the arrays written (keys ``W_enc_l`` etc.)."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    written: dict[str, np.ndarray] = {}
    for layer in range(n_layers):
        enc = {f"W_enc_{layer}": (rng.normal(size=(F, d)) * 3 / np.sqrt(d)).astype(np.float32),
               f"b_enc_{layer}": rng.normal(scale=0.3, size=F).astype(np.float32),
               f"b_dec_{layer}": rng.normal(scale=0.1, size=d).astype(np.float32)}
        width = (n_layers - layer, d) if kind == "cross_layer_transcoder" else (d,)
        dec = rng.normal(size=(F, *width)).astype(np.float32)
        written.update(enc, **{f"W_dec_{layer}": dec})
        if kind == "cross_layer_transcoder":
            save_file(enc, str(root / f"W_enc_{layer}.safetensors"))
            save_file({f"W_dec_{layer}": dec}, str(root / f"W_dec_{layer}.safetensors"))
        else:
            save_file({k.rsplit("_", 1)[0]: v for k, v in enc.items()} | {"W_dec": dec},
                      str(root / f"layer_{layer}.safetensors"))
    files = "" if kind == "cross_layer_transcoder" else "transcoders:\n" + "".join(
        f"  - layer_{layer}.safetensors\n" for layer in range(n_layers))
    (root / "config.yaml").write_text(f"model_kind: {kind}\nscan: tiny\nfeature_input_hook: mlp.hook_in\n"
                                      f"feature_output_hook: mlp.hook_out\n{files}")
    return written


@pytest.mark.parametrize("kind", ["transcoder_set", "cross_layer_transcoder"])
def test_one_block_of_a_circuit_tracer_set_is_read_with_hook(setup, tmp_path, kind):
    """`features DIR --hook 1` on circuit-tracer's transcoder set or cross-layer transcoder: block 1's features,
    relu(W_enc x + b_enc) of the MLP's input (read by hand with a hook on HF's MLP), its logit effects through the
    decoder row (a cross-layer transcoder's: summed over the blocks it writes to); without --hook, an error naming
    what to pass, before the model loads."""
    from transformers import AutoModelForCausalLM

    from anatomy_cli.models.ct_block import read_dictionary

    model, _, corpus, _ = setup
    hf = AutoModelForCausalLM.from_pretrained(model).eval()
    d, n_layers = hf.config.n_embd, hf.config.n_layer
    w = write_ct(tmp_path / "ct", kind, d, n_layers)
    missing = invoke("features", tmp_path / "ct", "--corpus", corpus, "--model", model)
    assert missing.exit_code == 2 and f"of {n_layers} blocks: pick one block's features with --hook N" \
        in missing.stderr, missing.output
    sae = read_dictionary(tmp_path / "ct", hook="layers.1.mlp")
    want_dec = w["W_dec_1"].sum(1) if kind == "cross_layer_transcoder" else w["W_dec_1"]
    np.testing.assert_array_equal(sae.W_dec, want_dec)
    data = run_json(model, tmp_path / "ct", corpus, "--hook", "1", "--cooccur", 0)
    windows = brute(model, write_sae(tmp_path / "unused"))[0]
    acts = np.maximum(module_inputs(hf, hf.transformer.h[1].mlp, windows).numpy() @ w["W_enc_1"].T + w["b_enc_1"], 0)
    assert data["dictionary"]["site"] == "blocks.1.mlp.hook_in" and data["tokens"] == len(acts)
    for r in data["features"]:
        f = r["feature"]
        assert r["fires"] == int((acts[:, f] > 0).sum())
        assert r["max_activation"] == pytest.approx(float(acts[:, f].max()), rel=1e-4, abs=1e-5)
    # logit effects: the decoder row times ln_f's gain through the tied unembedding, centred, top token
    wu = hf.lm_head.weight.detach().numpy().astype(np.float64)
    gain = hf.transformer.ln_f.weight.detach().numpy()
    for f in (0, 5):
        eff = wu @ (want_dec[f] * gain)
        eff -= eff.mean()
        top = [e for e in data["logit_effects"] if e["feature"] == f and e["side"] == "top"]
        assert top[0]["token_id"] == int(eff.argmax()) and top[0]["effect"] == pytest.approx(eff.max(), rel=1e-4)


def test_explain_names_a_circuit_tracer_block_s_features_by_their_block(tmp_path):
    """explain's export ``layer`` for a features run on block 2 of a transcoder set: ``2-<the set's folder>`` (the
    block first, as circuit --labels reads it), read through the same reader as features."""
    from anatomy_cli.tasks.explain import _layer_id

    write_ct(tmp_path / "ct", "transcoder_set", 32, 3)
    assert _layer_id({"sae": str(tmp_path / "ct"), "hook": "2"}, "2") == "2-ct"


def test_a_folder_of_dictionaries_is_named_and_one_is_picked_with_hook(setup, tmp_path):
    """fit-sae --layer all's top folder (layers.N.mlp subfolders, SAELens): the error names them and what to
    pass; --hook picks one."""
    from anatomy_cli.errors import UsageError
    from anatomy_cli.models.sae.read import read

    model, _, corpus, _ = setup
    for n in (0, 1, 2, 10):
        write_sae(tmp_path / "fit" / f"layers.{n}.mlp", seed=n)
    result = invoke("features", tmp_path / "fit", "--corpus", corpus, "--model", model)
    assert result.exit_code == 2, result.output
    assert "holds 4 dictionaries, one per hook point (layers.0.mlp, layers.1.mlp, layers.2.mlp, layers.10.mlp): " \
        f"pass one of them ({tmp_path / 'fit' / 'layers.0.mlp'}) or pick one with --hook NAME" in \
        " ".join(result.stderr.split())
    assert read(tmp_path / "fit", hook="layers.10.mlp").path == tmp_path / "fit" / "layers.10.mlp"
    assert read(tmp_path / "fit", hook="10").path == tmp_path / "fit" / "layers.10.mlp"  # a block, as for a CT set
    with pytest.raises(UsageError, match=r"--hook layers\.99\.mlp names none of them; pass one"):
        read(tmp_path / "fit", hook="layers.99.mlp")
    with pytest.raises(UsageError, match="--hook 7 names none of them"):
        read(tmp_path / "fit", hook="7")


def test_the_model_comes_from_the_dictionary_s_metadata_when_left_out(setup, tmp_path):
    model, sae, corpus, _ = setup
    named = write_sae(tmp_path / "named")
    cfg = json.loads((named / "cfg.json").read_text())
    cfg["metadata"]["model_name"] = str(model)
    (named / "cfg.json").write_text(json.dumps(cfg))
    args = ("features", named, "--corpus", corpus, "--device", "cpu", "--ctx", 16, "--max-tokens", 32,
            "--features", "0-3", "--format", "json")
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["model"] == str(model)
    assert f"the model: {model} (as the dictionary's metadata names it; --model, or model= in Python, overrides)" in result.stderr
    given = invoke(*args, "--model", model)  # given: no line, the same model
    assert json.loads(given.stdout)["features"] == json.loads(result.stdout)["features"]
    assert "the dictionary's metadata" not in given.stderr


def test_a_bad_corpus_is_the_one_line_before_the_model_is_named(setup, tmp_path):
    """A corpus that is not there, or not UTF-8, is refused before the model the dictionary records is named or
    opened: stderr is the one ``error:`` line (it used to follow "the model: ..."), exit 2."""
    model, _, _, _ = setup
    named = write_sae(tmp_path / "named")
    cfg = json.loads((named / "cfg.json").read_text())
    cfg["metadata"]["model_name"] = str(model)
    (named / "cfg.json").write_text(json.dumps(cfg))
    latin = tmp_path / "latin.txt"
    latin.write_bytes("caf\u00e9 au lait\n".encode("latin-1"))
    for corpus in (tmp_path / "missing.txt", latin):
        result = invoke("features", named, "--corpus", corpus, "--format", "json")
        assert result.exit_code == 2, result.output
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: "), result.stderr
        assert result.stdout == ""


def test_the_api_left_without_a_model_opens_the_one_the_dictionary_records(setup, tmp_path, cached_load):
    """``anatomy.features(None, ...)`` / ``anatomy.sae(None, ...)``: the rule lives in the tasks layer
    (tasks/recorded_model.py), so the API without a model opens the model the metadata names (the default model,
    gpt2, is not on this machine: it would fail), and answers as with that model named."""
    import anatomy_cli as anatomy

    model, _, corpus, _ = setup
    named = write_sae(tmp_path / "named")
    cfg = json.loads((named / "cfg.json").read_text())
    cfg["metadata"]["model_name"] = str(model)
    (named / "cfg.json").write_text(json.dumps(cfg))
    kw = {"corpus": str(corpus), "ctx": 16, "max_tokens": 32, "features": "0-3"}
    bare, given = anatomy.features(None, named, **kw), anatomy.features(str(model), named, **kw)
    assert bare.to_dict()["model"] == str(model)
    assert bare.to_dict()["features"] == given.to_dict()["features"]
    one, other = anatomy.sae(None, "The cat sat", sae=named), anatomy.sae(str(model), "The cat sat", sae=named)
    assert one.to_dict()["model"] == str(model) and one.to_dict() == other.to_dict()
    np.testing.assert_array_equal(one.result.activations, other.result.activations)


def test_a_plot_inside_a_fresh_out_dir_is_written(setup, tmp_path):
    """``--out DIR --plot DIR/page.html`` with DIR not made yet (a new user's first run): the run makes DIR and
    writes the page there, the same page and tables as into a DIR made beforehand; a page whose folder does not
    exist and is not inside --out is still refused before anything runs."""
    import pyarrow.parquet as pq

    model, sae, corpus, _ = setup
    made, fresh = tmp_path / "made", tmp_path / "new" / "run"
    made.mkdir()
    for out in (made, fresh):
        run_json(model, sae, corpus, "--features", "0-5", "--out", out, "--plot", out / "pages" / "page.html")
    for name in ("features.parquet", "contexts.parquet", "logit_effects.parquet"):
        assert pq.read_table(fresh / name).equals(pq.read_table(made / name)), name
    page = (fresh / "pages" / "page.html").read_text()
    assert page.replace(str(fresh), "DIR") == (made / "pages" / "page.html").read_text().replace(str(made), "DIR")
    result = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--out", tmp_path / "elsewhere", "--plot", tmp_path / "nowhere" / "page.html")
    assert result.exit_code == 1 and "the directory" in result.output and "does not exist" in result.output
    assert not (tmp_path / "elsewhere").exists() and not (tmp_path / "nowhere").exists()


def test_the_pass_stops_at_the_dictionary_s_block(setup, tmp_path):
    """The forward runs blocks 0..b only (b the dictionary's block): the features equal those of transformers'
    whole forward (hidden states) while a hook on the next block, the final norm and the LM head is never called;
    the printed cost counts (b + 1) / L of a forward: the forward's FLOP for a block-1 dictionary of the 2-block
    model are twice a block-0 one's (the encoder, co-firing and logit effects by hand)."""
    from anatomy_cli import engine
    from anatomy_cli.engine.hooks import attach_modules
    from anatomy_cli.engine.sae import Dictionary
    from anatomy_cli.engine.sae import window_features
    from anatomy_cli.models.sae.read import read
    from anatomy_cli.models.spec import ModelSpec

    model, sae, corpus, _ = setup
    windows, acts, _, _ = brute(model, sae)
    lm = engine.load(ModelSpec(str(model), device="cpu"))
    assert lm.n_layers == 2
    calls = []
    later = [(lm.points[name][0], "output", lambda t, n=name: calls.append(n))
             for name in ("blocks.1.hook_resid_pre", "blocks.1.hook_resid_post", "ln_final.hook_normalized")]
    later.append((lm.model.get_output_embeddings(), "output", lambda t: calls.append("lm_head")))
    with attach_modules(later):
        got = window_features(lm, torch.tensor(windows[:3]), Dictionary(read(sae), lm.device))
    assert calls == []
    np.testing.assert_allclose(got.numpy(), np.stack(acts[:3]), rtol=1e-5, atol=1e-6)

    second = write_sae(tmp_path / "block1")
    cfg = json.loads((second / "cfg.json").read_text())
    cfg["metadata"]["hook_name"] = "blocks.1.hook_resid_post"
    (second / "cfg.json").write_text(json.dumps(cfg))
    est = {}
    for block, folder in ((0, sae), (1, second)):
        result = invoke("features", folder, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                        "--max-tokens", 32, "--format", "json")
        assert result.exit_code == 0, result.output
        assert f"its forward through blocks 0-{block} of 2" in result.stderr.replace("\n", " ")
        est[block] = json.loads(result.stdout)["estimate"]
    tokens = 32
    rest = 2.0 * tokens * 32 * D_SAE + 2.0 * tokens * D_SAE * D_SAE + 2.0 * D_SAE * 32 * 50257
    assert (est[0]["forward_blocks"], est[1]["forward_blocks"], est[1]["n_layers"]) == (1, 2, 2)
    assert est[1]["flops"] - rest == pytest.approx(2 * (est[0]["flops"] - rest), rel=1e-9)


def test_a_finished_delphi_run_run_again_reads_its_shards_back(setup, tmp_path, monkeypatch):
    """A finished ``--out DIR --delphi CACHE`` run run again: every shard is read back (no forward runs) and the
    cache is the same bytes; with one shard of --out lost, that shard alone is computed again, the others' entries
    read back from the cache's splits, and the cache is again the same bytes."""
    from anatomy_cli.engine import sae as engine_sae

    model, sae, corpus, _ = setup
    out, cache = tmp_path / "run", tmp_path / "latents"
    args = ("--features", "0-9", "--out", out, "--delphi", cache)
    first = run_json(model, sae, corpus, *args)

    def cache_files():
        return {p.relative_to(cache): p.read_bytes() for p in sorted(cache.rglob("*")) if p.is_file()}

    files = cache_files()
    assert first["shards"] > 2 and any(p.suffix == ".safetensors" for p in files)
    computed = []
    real = engine_sae.window_features
    monkeypatch.setattr(engine_sae, "window_features", lambda *a: computed.append(1) or real(*a))
    again = run_json(model, sae, corpus, *args)
    assert computed == [] and again["resumed"] == first["shards"]
    assert (again["features"], again["contexts"]) == (first["features"], first["contexts"])
    assert cache_files() == files
    (out / "shards" / "shard-00001.parquet").unlink()
    third = run_json(model, sae, corpus, *args)
    assert third["resumed"] == first["shards"] - 1 and computed  # shard 1 alone computed again
    assert third["features"] == first["features"] and cache_files() == files


CJK = "私は日本語を話す🙂 ok, café. "


def test_a_context_line_shows_a_character_split_over_tokens_whole():
    """GPT-2's byte-level BPE splits 語 and 🙂 into tokens of their bytes: a context line showed them as hex bytes
    (`<e8 aa>[<9e>]`, a new user's trial). The line now joins the bytes, the token's brackets around the whole
    character it holds part of, as the tokenizer's own offsets (computed by transformers) place them; bytes that
    make no character within the tokens (a window cut inside one) stay as the tables show a partial token."""
    from conftest import build_gpt2_tokenizer

    from anatomy_cli.text.tokenization import Tokenizer

    tok = Tokenizer(build_gpt2_tokenizer())  # the tiny models' tokenizer, without a model
    enc = tok.hf(CJK, return_offsets_mapping=True)
    ids, spans = enc["input_ids"], enc["offset_mapping"]
    assert any(tok.piece(i).startswith("<") for i in ids)  # some tokens are partial characters
    for at, (start, end) in enumerate(spans):
        assert tok.line(ids, at) == f"{CJK[:start]}[{CJK[start:end]}]{CJK[end:]}", at
    assert tok.line(ids) == tok.hf.decode(ids) == CJK
    first = tok.token_bytes(ids[0])  # 私 is three tokens of one byte each: a line that starts at the second
    assert len(first) == 1 and tok.line(ids[1:3]) == tok.piece(ids[1]) + tok.piece(ids[2]) == "<a7><81>"


def test_the_tsv_and_the_table_show_the_contexts_as_text(setup, tmp_path):
    model, sae, _, _ = setup
    corpus = tmp_path / "cjk.txt"
    corpus.write_text(CJK * 12)
    tsv = invoke("features", sae, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                 "--shard-windows", 3, "--format", "tsv", "--show", 0, "--out", tmp_path / "feats")
    assert tsv.exit_code == 0, tsv.output
    rows = [line.split("\t") for line in tsv.stdout.splitlines()[1:]]
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    contexts = pq.read_table(tmp_path / "feats" / "contexts.parquet").to_pylist()  # the token ids, as the JSON's
    top = {c["feature"]: c for c in contexts if c["kind"] == "top" and c["rank"] == 0}

    hf = AutoTokenizer.from_pretrained(model)
    checked = 0
    for row in rows:
        ctx = top.get(int(row[0]))
        text = hf.decode(ctx["token_ids"]) if ctx else ""
        if ctx is None or "\ufffd" in text:  # no context, or a window's edge cuts a character
            continue
        assert row[-1].replace("[", "").replace("]", "") == text.replace("\n", "⏎")
        assert not re.search(r"<[0-9a-f]{2}[ >]", row[-1]), row[-1]  # no byte of a character shown as hex
        checked += 1
    assert checked >= 5


def test_a_corrupt_fit_report_is_warned_of_not_taken_as_absent(setup, tmp_path):
    """A new user's truncated anatomy-fit.json read as no report at all (fit_report null, nothing said). The report
    is optional metadata (a dictionary without one is not judged), so features runs, and one warning names it."""
    import shutil

    model, sae, corpus, _ = setup
    copy = Path(shutil.copytree(sae, tmp_path / "sae"))
    report = copy / "anatomy-fit.json"
    report.write_text('{"held_out_fve": ')
    result = invoke("features", copy, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--max-tokens", 32, "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["fit_report"] is None
    warned = [line for line in result.stderr.splitlines() if str(report) in line]
    assert len(warned) == 1 and warned[0].startswith("warning: the fit report ") and "cannot be read (not JSON)" \
        in warned[0], result.stderr


def test_the_page_of_a_weak_dictionary_says_so_as_stderr_does(setup, tmp_path):
    """A fit report giving a held-out FVE under fit-sae's threshold: the JSON and stderr warned, the --plot page
    did not. The page now shows the same line (tasks/features.py ``weak_note``'s), read from the written HTML; a
    page of a dictionary not judged weak shows none."""
    import shutil
    from html.parser import HTMLParser

    from anatomy_cli.output.html.features import figure
    from anatomy_cli.output.plots.caption import Caption

    class Weak(HTMLParser):
        def __init__(self):
            super().__init__()
            self.inside, self.found = False, []

        def handle_starttag(self, tag, attrs):
            self.inside = tag == "p" and ("class", "weak") in attrs

        def handle_data(self, data):
            if self.inside:
                self.found.append(data)
                self.inside = False

    model, sae, corpus, _ = setup
    copy = Path(shutil.copytree(sae, tmp_path / "sae"))
    (copy / "anatomy-fit.json").write_text(json.dumps({"health": {"fve": 0.125, "l0": [4] * 8}}))  # 8 positions
    page = tmp_path / "page.html"
    result = invoke("features", copy, "--corpus", corpus, "--model", model, "--device", "cpu", "--ctx", 16,
                    "--max-tokens", 32, "--features", "0-3", "--format", "json", "--plot", page)
    assert result.exit_code == 0, result.output
    warning = json.loads(result.stdout)["fit_report"]["warning"]
    assert "held-out FVE of 0.125" in warning and f"warning: {warning}" in result.stderr.splitlines()
    parser = Weak()
    parser.feed(page.read_text(encoding="utf-8"))
    assert parser.found == [warning]
    strong = Weak()
    shown = figure({**json.loads(result.stdout), "fit_report": None}, Caption("features", "m"))
    strong.feed("".join(part.html for part in shown.parts))
    assert strong.found == []
