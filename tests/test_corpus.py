"""`anatomy corpus`: every figure against a hand-written transformers loop; sources, windows, store, resume, CLI."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.corpus.runner import Settings
from anatomy_cli.corpus.runner import run
from anatomy_cli.corpus.sources import open_source
from anatomy_cli.corpus.windows import windows
from anatomy_cli.models.spec import ModelSpec

ROOT = Path(__file__).resolve().parents[1]
ARTICLE = ROOT / "docs" / "article.md"
LN2 = math.log(2.0)
runner = CliRunner()


# ---- the hand-written reference: transformers' own forward, hooks written here, float64 sums

def _modules(model):
    if model.config.model_type == "gpt2":
        base = model.transformer
        return base.h, base.ln_f, [(b.attn, b.mlp) for b in base.h]
    base = model.model
    return base.layers, base.norm, [(b.self_attn, b.mlp) for b in base.layers]


def reference(model, wins: list[list[int]], *, heads: bool = False) -> dict:
    """Per figure: (token-weighted mean, standard error over window means), per layer / per head."""
    blocks, norm, subs = _modules(model)
    head = model.get_output_embeddings()
    L = len(blocks)
    grabbed: dict = {}

    def keep(key):
        return lambda _m, _a, out: grabbed.__setitem__(key, (out[0] if isinstance(out, tuple) else out)[0])

    hooks = [blocks[-1].register_forward_hook(keep("last"))]
    for i, (attn, mlp) in enumerate(subs):
        hooks += [attn.register_forward_hook(keep(("attn", i))), mlp.register_forward_hook(keep(("mlp", i)))]
    saved = model.config._attn_implementation
    if heads:
        model.set_attn_implementation("eager")
    per: dict[str, list] = {}
    maxima = [(-1.0, -1)] * (L + 1)
    argmax = np.zeros((L + 1, model.config.hidden_size), np.int64)
    losses = []

    def add(name, values):  # values: [rows, positions] for one window
        per.setdefault(name, []).append(np.asarray(values, np.float64))

    try:
        with torch.no_grad():
            for ids in wins:
                x = torch.tensor([ids])
                out = model(x, output_hidden_states=True, output_attentions=heads, labels=x)
                losses.append(out.loss.item())
                hs = [h[0] for h in out.hidden_states[:-1]] + [grabbed["last"]]      # raw, before the final norm
                logps = [torch.log_softmax(head(norm(h)).double(), -1) for h in hs[:-1]]
                logps.append(torch.log_softmax(out.logits[0].double(), -1))
                final = logps[-1]
                nxt = x[0, 1:]
                add("kl_nats", [(final.exp() * (final - lp)).sum(-1).clamp_min(0).numpy() for lp in logps])
                add("top1_agree", [(lp.argmax(-1) == final.argmax(-1)).double().numpy() for lp in logps])
                add("ce_bits", [(-lp[:-1].gather(1, nxt[:, None])[:, 0] / LN2).numpy() for lp in logps])
                h64 = [h.double() for h in hs]
                add("resid_norm", [h.norm(dim=-1).numpy() for h in h64])
                add("cos_to_embedding", [((h * h64[0]).sum(-1) / (h.norm(dim=-1) * h64[0].norm(dim=-1))).clamp(-1, 1)
                                         .numpy() for h in h64])
                for kind in ("attn", "mlp"):
                    add(f"{kind}_out_norm", [grabbed[(kind, i)].double().norm(dim=-1).numpy() for i in range(L)])
                for l, h in enumerate(h64):
                    values, dims = h.abs().max(-1)
                    argmax[l] += np.bincount(dims.numpy(), minlength=h.shape[-1])
                    if values.max().item() > maxima[l][0]:
                        maxima[l] = (values.max().item(), int(dims[values.argmax()]))
                if heads:
                    a = torch.stack(out.attentions)[:, 0].double()                          # [L, H, T, T]
                    q = a[:, :, 1:]
                    ent = -(q * torch.log(q.clamp_min(1e-300))).sum(-1)
                    add("entropy_nats", ent.flatten(0, 1).numpy())
                    add("first_token", q[..., 0].flatten(0, 1).numpy())
                    prev = torch.diagonal(q, dim1=-2, dim2=-1)
                    add("prev_token", prev.flatten(0, 1).numpy())
    finally:
        for h in hooks:
            h.remove()
        model.set_attn_implementation(saved)
    figures = {}
    for name, ws in per.items():
        means = np.stack([w.mean(-1) for w in ws])                                        # [W, rows]
        total = np.concatenate(ws, axis=-1).mean(-1)
        figures[name] = (total, means.std(0, ddof=1) / math.sqrt(len(ws)))
    figures["max_abs"] = maxima
    figures["argmax"] = argmax
    figures["loss_bits"] = float(np.mean(losses)) / LN2
    figures["per_window"] = per
    return figures


def windows_of(tokenizer, text: str, ctx: int, n: int, bos: bool) -> list[list[int]]:
    """Windows cut by hand: the text's tokens, then EOS, in windows of ctx (BOS first when asked)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    body = ctx - int(bos)
    head = [tokenizer.bos_token_id] if bos else []
    return [head + ids[i * body:(i + 1) * body] for i in range(n)]


def check(stats, ref, *, lens_rtol=1e-4, heads=False):
    layers = stats.layers
    for name in ("kl_nats", "top1_agree", "ce_bits", "resid_norm", "cos_to_embedding"):
        mean, se = ref[name]
        rtol = lens_rtol if name in ("kl_nats", "ce_bits", "top1_agree") else 1e-5
        np.testing.assert_allclose([r[name] for r in layers], mean, rtol=rtol, atol=1e-7, err_msg=name)
        np.testing.assert_allclose([r[f"{name}_se"] for r in layers], se, rtol=1e-3, atol=1e-7, err_msg=name)
    for name in ("attn_out_norm", "mlp_out_norm"):
        mean, se = ref[name]
        assert layers[0][name] is None
        np.testing.assert_allclose([r[name] for r in layers[1:]], mean, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose([r[f"{name}_se"] for r in layers[1:]], se, rtol=1e-3, atol=1e-9, err_msg=name)
    for l, (value, dim) in enumerate(ref["max_abs"]):
        assert layers[l]["max_abs"] == pytest.approx(value, rel=1e-5)
        assert layers[l]["max_abs_dim"] == dim
        assert layers[l]["max_abs_dim_share"] == pytest.approx(ref["argmax"][l, dim] / ref["argmax"][l].sum())
    assert stats.loss_bits == pytest.approx(ref["loss_bits"], rel=1e-5)
    assert stats.perplexity == pytest.approx(2 ** ref["loss_bits"], rel=1e-4)
    if heads:
        for name in ("entropy_nats", "first_token", "prev_token"):
            mean, se = ref[name]
            np.testing.assert_allclose([r[name] for r in stats.heads], mean, rtol=1e-4, atol=1e-6, err_msg=name)
            np.testing.assert_allclose([r[f"{name}_se"] for r in stats.heads], se, rtol=1e-2, atol=1e-6, err_msg=name)


def measure(lm, spec, tmp_path, *, ctx, n, bos=False, heads=False, **options):
    text = ARTICLE.read_text()
    path = tmp_path / "one.txt"
    path.write_text(text)
    settings = Settings(ctx=ctx, bos=bos, max_tokens=ctx * n, heads=heads, shard_windows=3, batch_size=2, **options)
    result = run(open_source(str(path)), spec, settings, tokenizer=lm.tokenizer, lm=lm)
    return result, windows_of(lm.tokenizer.hf, text, ctx, n, bos)


@pytest.mark.parametrize("arch,bos", [("gpt2", False), ("llama", True)])
def test_every_figure_equals_a_hand_written_loop(tiny_lm, tiny_model_dir, tmp_path, arch, bos):
    lm = tiny_lm(arch)
    result, wins = measure(lm, ModelSpec(str(tiny_model_dir(arch))), tmp_path, ctx=16, n=5, bos=bos, heads=True)
    assert result.shards == 2 and result.stats.windows == 5 and result.stats.tokens == 80
    if bos:
        assert all(w[0] == lm.tokenizer.bos_id for w in wins)
    check(result.stats, reference(lm.model, wins, heads=True), heads=True)
    assert len(result.stats.heads) == lm.n_layers * lm.n_heads


def test_the_row_named_n_is_block_n_output(tiny_lm, tiny_model_dir, tmp_path):
    """The residual rows are named embed, 0..L-1: the row named N holds block N's output (a hand-written forward
    hook on block N; HF hidden_states[N + 1] before the final norm), the row named embed the embedding."""
    lm = tiny_lm("gpt2")
    result, wins = measure(lm, ModelSpec(str(tiny_model_dir("gpt2"))), tmp_path, ctx=16, n=2)
    rows = result.stats.layers
    assert [r["layer"] for r in rows] == ["embed", *range(lm.n_layers)]
    blocks = _modules(lm.model)[0]
    outs: dict = {}
    hooks = [b.register_forward_hook(lambda _m, _a, out, i=i: outs.setdefault(i, []).append(
        (out[0] if isinstance(out, tuple) else out)[0].double().norm(dim=-1))) for i, b in enumerate(blocks)]
    try:
        with torch.no_grad():
            embeds = [lm.model(torch.tensor([w]), output_hidden_states=True).hidden_states[0][0].double().norm(dim=-1)
                      for w in wins]
    finally:
        for h in hooks:
            h.remove()
    by_name = {r["layer"]: r["resid_norm"] for r in rows}
    assert by_name["embed"] == pytest.approx(torch.cat(embeds).mean().item(), rel=1e-5)
    for n in range(lm.n_layers):
        assert by_name[n] == pytest.approx(torch.cat(outs[n]).mean().item(), rel=1e-5), n


def test_smollm2_figures_and_loss_on_real_text(smollm2_lm, smollm2_gguf, tmp_path):
    result, wins = measure(smollm2_lm, ModelSpec(str(smollm2_gguf)), tmp_path, ctx=32, n=2)
    ref = reference(smollm2_lm.model, wins)
    check(result.stats, ref)
    # A trained model on English: the last layer predicts far better than the embedding, and KL falls to 0.
    rows = result.stats.layers
    assert rows[-1]["ce_bits"] < 9 and rows[0]["ce_bits"] > rows[-1]["ce_bits"] + 3
    assert rows[-1]["kl_nats"] == 0 and rows[-1]["top1_agree"] == 1


def test_lens_every_measures_a_rotating_subset(tiny_lm, tiny_model_dir, tmp_path):
    lm = tiny_lm("gpt2")
    result, wins = measure(lm, ModelSpec(str(tiny_model_dir("gpt2"))), tmp_path, ctx=8, n=4, lens_every=3)
    # window w measures positions p with p ≡ w (mod 3): 3 + 3 + 2 + 3 of 8 positions
    rows = result.stats.layers
    assert rows[0]["lens_positions"] == 3 + 3 + 2 + 3
    assert rows[0]["ce_positions"] == 3 + 2 + 2 + 3  # CE needs a next token: not position 7
    full = reference(lm.model, wins)
    # the lens figures are the means over exactly those positions; the residual ones still see every position
    for name in ("kl_nats", "ce_bits"):
        per = full["per_window"][name]
        picked = np.concatenate([w[:, [p for p in range(w.shape[1]) if (p - i) % 3 == 0]] for i, w in enumerate(per)],
                                axis=1)
        np.testing.assert_allclose([r[name] for r in rows], picked.mean(-1), rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose([r["resid_norm"] for r in rows], full["resid_norm"][0], rtol=1e-5)


# ---- windows and sources

def test_windows_pack_documents_with_bos_and_budget():
    stream = [[1, 2, 3], [4, 5, 6, 7, 8]]
    assert list(windows(iter(stream), ctx=4)) == [(1, 2, 3, 4), (5, 6, 7, 8)]
    assert list(windows(iter(stream), ctx=4, bos=0)) == [(0, 1, 2, 3), (0, 4, 5, 6), (0, 7, 8)]
    assert list(windows(iter(stream), ctx=4, max_tokens=6)) == [(1, 2, 3, 4), (5, 6)]
    assert list(windows(iter([[1, 2, 3, 4, 5]]), ctx=4)) == [(1, 2, 3, 4)]  # a 1-token tail is no window


def test_table_sources_read_their_column(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.jsonl").write_text('{"body": "one"}\n\n{"body": "two", "x": 1}\n')
    (tmp_path / "a.csv").write_text("id,body\n1,one\n2,two\n")
    pq.write_table(pa.table({"body": ["one", "two"]}), tmp_path / "a.parquet")
    for name in ("a.jsonl", "a.csv", "a.parquet"):
        assert list(open_source(str(tmp_path / name), column="body").pieces()) == [("one", True), ("two", True)]
    with pytest.raises(Exception, match="has no column 'text'"):
        list(open_source(str(tmp_path / "a.parquet")).pieces())
    with pytest.raises(Exception, match="line 1 is not JSON"):
        (tmp_path / "b.jsonl").write_text("{oops\n")
        list(open_source(str(tmp_path / "b.jsonl")).pieces())


def test_text_pieces_and_identity(tmp_path, monkeypatch):
    from anatomy_cli.corpus import sources

    monkeypatch.setattr(sources, "PIECE_BYTES", 10)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.md").write_text("line one\nline two\nthree\n")
    (tmp_path / "d" / "skip.bin").write_bytes(b"\xff")
    src = open_source(str(tmp_path / "d"))
    pieces = list(src.pieces())
    assert "".join(t for t, _ in pieces) == "line one\nline two\nthree\n"
    assert [last for _, last in pieces] == [False] * (len(pieces) - 1) + [True]
    before = src.identity()
    (tmp_path / "d" / "a.md").write_text("line one\nline two\nthree!\n")
    assert src.identity()["digest"] != before["digest"]
    with pytest.raises(Exception, match="does not exist"):
        open_source(str(tmp_path / "nope"))
    (tmp_path / "bad.txt").write_bytes(b"ok\n\xff\n")
    with pytest.raises(Exception, match=r"not valid UTF-8 \(line 2"):
        list(open_source(str(tmp_path / "bad.txt")).pieces())


def test_datasets_directory_without_datasets_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(Exception, match=r"needs the datasets package \(pip install datasets\)"):
        list(open_source(str(tmp_path / "ds")).pieces())


# ---- the output directory: shards, resume, changes caught

def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def test_out_dir_resume_and_changes(tiny_model_dir, tmp_path, cached_load):
    import pyarrow.parquet as pq

    model = tiny_model_dir("gpt2")
    src = tmp_path / "c.txt"
    src.write_text(ARTICLE.read_text()[:6000])
    out = tmp_path / "run"
    args = ["corpus", src, "--model", model, "--ctx", 16, "--shard-windows", 4, "--max-tokens", 400, "--format", "json"]
    first = invoke(*args, "--out", out)
    assert first.exit_code == 0, first.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["model"]["model"] == str(model) and manifest["settings"]["ctx"] == 16
    assert manifest["source"]["size"] == src.stat().st_size and len(manifest["source"]["digest"]) == 64
    assert [s["index"] for s in manifest["shards"]] == list(range(7)) and manifest["complete"]["tokens"] == 400
    summary = pq.read_table(out / "summary.parquet").to_pylist()
    data = json.loads(first.stdout)
    # Parquet: an int64 `row` (0..L) and the label as a string; JSON: "embed", then the blocks 0..L-1
    assert [r["layer"] for r in data["layers"]] == ["embed", 0, 1]
    assert [r.pop("row") for r in summary] == [0, 1, 2] and [r["layer"] for r in summary] == ["embed", "0", "1"]
    # the JSON adds ce_nats/ce_nats_se (= ce_bits × ln 2) beside the measured columns the Parquet file keeps
    assert summary == [{**{k: v for k, v in r.items() if k not in ("ce_nats", "ce_nats_se")},
                        "layer": str(r["layer"])} for r in data["layers"]]
    # drop two finished shards: the rerun computes them again and reads the others
    for i in (2, 5):
        (out / f"shards/shard-0000{i}.parquet").unlink()
    again = invoke(*args, "--out", out)
    assert again.exit_code == 0, again.output
    assert "resumed: 5 of 7 shards" in again.stderr
    assert json.loads(again.stdout)["layers"] == data["layers"]
    changed = invoke(*[a if a != 16 else 8 for a in args], "--out", out)
    assert changed.exit_code == 2
    assert "error: --out" in changed.stderr and "--ctx 16, now 8" in changed.stderr
    src.write_text(src.read_text() + "more")
    moved = invoke(*args, "--out", out)
    assert moved.exit_code == 2 and "the source changed" in moved.stderr
    assert invoke(*args, "--out", out, "--overwrite").exit_code == 0


def test_interrupted_run_resumes_to_the_same_result(tiny_model_dir, tmp_path, cached_load):
    model = tiny_model_dir("gpt2")
    args = [sys.executable, "-m", "anatomy_cli", "corpus", str(ROOT / "docs"), "--model", str(model), "--ctx", "16",
            "--shard-windows", "1", "--max-tokens", "960", "--no-lens", "--format", "json"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    proc = subprocess.Popen([*args, "--out", str(out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline:
        manifest = out / "manifest.json"  # replaced atomically: always whole
        if manifest.exists() and len(json.loads(manifest.read_text())["shards"]) >= 3:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(json.loads((out / "manifest.json").read_text())["shards"])
    assert 3 <= done < 60, "the run was not interrupted mid-way"
    resumed = invoke(*args[3:], "--out", out)  # resumed in-process: the killed run was the separate process
    assert resumed.exit_code == 0, resumed.output
    assert f"resumed: {done} of 60 shards" in resumed.stderr
    whole = invoke(*args[3:])  # the same command, uninterrupted, in-process
    assert whole.exit_code == 0, whole.output
    a, b = json.loads(resumed.stdout), json.loads(whole.stdout)
    assert a["layers"] == b["layers"] and a["tokens"] == b["tokens"] == 960


# ---- the command

def test_cli_formats_heads_and_stdin(tiny_model_dir, cached_load):
    model = tiny_model_dir("gpt2")
    text = ARTICLE.read_text()[:3000]
    res = invoke("corpus", "-", "--model", model, "--ctx", 16, "--max-tokens", 64, "--heads", input=text)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("layer\tkl_nats\tkl_nats_se\ttop1_agree")
    assert "layer\thead\tentropy_nats" in res.stdout
    data = json.loads(invoke("corpus", "-", "--model", model, "--ctx", 16, "--max-tokens", 64, "--format", "json",
                             input=text).stdout)
    assert data["tokens"] == 64 and data["source"]["path"] == "-" and data["heads"] == []
    assert data["perplexity"] == pytest.approx(2 ** data["loss_bits"])
    # cross-entropy in nats beside bits (sae's and verify's unit), the documented bits keys kept
    assert data["loss_nats"] == pytest.approx(data["loss_bits"] * math.log(2))
    for row in data["layers"]:
        assert row["ce_nats"] == pytest.approx(row["ce_bits"] * math.log(2))
        assert row["ce_nats_se"] == pytest.approx(row["ce_bits_se"] * math.log(2))
    assert "\tce_nats\t" in lines[0]


@pytest.mark.parametrize("options", [[], ["--dtype", "bf16"], ["--init", "random"]])
def test_corpus_and_trace_name_the_model_the_same_way(tiny_model_dir, cached_load, options):
    model = str(tiny_model_dir("gpt2"))
    keys = ("model", "untrained", "dtype", "dequantized_from")
    corpus = json.loads(invoke("corpus", "-", "--model", model, "--ctx", 16, "--max-tokens", 32, "--no-lens",
                               "--format", "json", *options, input=ARTICLE.read_text()[:500]).stdout)
    trace = json.loads(invoke("trace", "Thank you", "--model", model, "--format", "json", *options).stdout)
    assert {k: corpus[k] for k in keys} == {k: trace[k] for k in keys}
    from anatomy_cli.cli.records import spec_record  # `corpus --ray`: the driver loads no model, the spec says it

    spec = ModelSpec(model, dtype=options[1] if options[:1] == ["--dtype"] else "fp32",
                     init="random" if options[:1] == ["--init"] else "pretrained")
    assert spec_record(spec) == {k: trace[k] for k in keys}
    assert corpus["model"] == model and corpus["dtype"] == (options[1] if options[:1] == ["--dtype"] else "fp32")
    assert corpus["untrained"] is (options == ["--init", "random"])


def test_a_gguf_spec_names_its_quantization_as_loading_it_does(smollm2_lm, smollm2_gguf):
    from anatomy_cli.cli.records import model_record
    from anatomy_cli.cli.records import spec_record

    # (the session's model is renamed; its file is the same)
    assert spec_record(ModelSpec(str(smollm2_gguf))) == {**model_record(smollm2_lm), "model": str(smollm2_gguf)}
    assert model_record(smollm2_lm)["dequantized_from"] == "Q4_1 (Q4_1, Q8_0)"


def test_the_progress_line_goes_through_the_one_stderr_sink(tiny_model_dir, cached_load, monkeypatch):
    # corpus (a layer below the CLI) gets a callable; the CLI's one status line shows what it reports.
    import contextlib

    from anatomy_cli.tasks import corpus as command

    shown = []

    class Line:
        def update(self, text):
            shown.append(text)

    @contextlib.contextmanager
    def status(message):
        shown.append(message)
        yield Line()

    monkeypatch.setattr(command, "status", status)
    res = invoke("corpus", "-", "--model", tiny_model_dir("gpt2"), "--ctx", 16, "--max-tokens", 64,
                 "--shard-windows", 2, "--no-lens", "--format", "json", input=ARTICLE.read_text()[:3000])
    assert res.exit_code == 0, res.stderr
    # 64 tokens: 4 windows in 2 shards of one batch each; a line when the first shard is planned (issue 41 item 9)
    assert shown[0] == "corpus: planning the first shard" and len(shown) == 4
    assert shown[-1].startswith("corpus: 64 tokens · ") and "tokens/s" in shown[-1] and "ETA 0:00" in shown[-1]


def test_the_status_line_comes_at_once_and_per_window(tiny_model_dir, cached_load, monkeypatch):
    """Issue 41 item 9: the first line as soon as the first shard is planned, then one per batch of windows."""
    import contextlib

    from anatomy_cli.tasks import corpus as command

    shown = []

    class Line:
        def update(self, text):
            shown.append(text)

    monkeypatch.setattr(command, "status", contextlib.contextmanager(lambda message: (yield Line())))
    res = invoke("corpus", "-", "--model", tiny_model_dir("gpt2"), "--ctx", 16, "--max-tokens", 64,
                 "--shard-windows", 4, "--batch-size", 1, "--no-lens", "--format", "json",
                 input=ARTICLE.read_text()[:3000])
    assert res.exit_code == 0, res.stderr
    assert shown[0] == "corpus: 4 windows planned · 0 tokens · measuring the first window"
    assert [line.split(" · ")[:2] for line in shown[1:]] == [
        [f"corpus: {16 * n} tokens", f"{n} windows (4 planned)"] for n in (1, 2, 3, 4)]


def test_cli_errors_are_one_line(tiny_model_dir, tmp_path, cached_load, monkeypatch):
    model = tiny_model_dir("gpt2")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    res = invoke("corpus", empty, "--model", model)
    assert res.exit_code == 2 and res.stderr.strip() == "error: the corpus has no text: nothing to measure (it needs at least 2 tokens)"
    res = invoke("corpus", empty, "--model", model, "--ctx", 100000)
    assert res.exit_code == 2 and "--ctx 100000 is more than" in res.stderr
    res = invoke("corpus", ARTICLE, "--model", tiny_model_dir("bert"))
    assert res.exit_code == 2 and "is an encoder (bert), not a next-token predictor: `corpus` needs" in res.stderr
    res = invoke("corpus", tmp_path / "nope.txt", "--model", model)
    assert res.exit_code == 2 and res.stderr.strip().endswith("nope.txt' does not exist")
    monkeypatch.setitem(sys.modules, "ray", None)
    res = invoke("corpus", ARTICLE, "--model", model, "--ray")
    assert res.exit_code == 1
    assert res.stderr.strip() == "error: --ray needs Ray: in a clone of anatomy, pip install -e '.[ray]'"


def test_plot_draws_a_png(tiny_model_dir, tmp_path, cached_load):
    model = tiny_model_dir("gpt2")
    res = invoke("corpus", ARTICLE, "--model", model, "--ctx", 16, "--max-tokens", 48, "--heads",
                 "--plot", tmp_path / "c.png")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_picture_names_its_rows_embed_then_blocks(tiny_model_dir, tmp_path, cached_load):
    """The API's Result.plot() draws what --plot draws: x at rows 0..L, their tick labels embed, 0, 1."""
    from anatomy_cli import api as anatomy

    result = anatomy.corpus_stats(str(tiny_model_dir("gpt2")), ARTICLE, ctx=16, max_tokens=48)
    assert [r["layer"] for r in result.rows] == ["embed", 0, 1]
    fig = result.plot()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["embed", "0", "1"]
    assert list(ax.get_xticks()) == [0, 1, 2]


def test_the_options_refuse_before_anything_opens():
    """CorpusOptions (the CLI's and anatomy.corpus_stats's one options object) refuses what needs no model."""
    from anatomy_cli.errors import UsageError
    from anatomy_cli.tasks.corpus import CorpusOptions

    for kwargs, words in (({"ctx": 1}, "--ctx takes a whole number of at least 2"),
                          ({"lens_every": 0}, "--lens-every takes"),
                          ({"save_activations": "blocks.0.hook_resid_post"}, "--save-activations needs --out DIR"),
                          ({"save_activations": "x", "out": "o", "activation_dtype": "bf16"}, "fp32 or fp16"),
                          ({"save_activations": "blocks.0.resid", "out": "o"}, "is not a hook point")):
        with pytest.raises(UsageError, match=words):
            CorpusOptions(**kwargs)
    assert CorpusOptions(out="o").out == Path("o")
    assert CorpusOptions(save_activations="blocks.1.attn.hook_z,blocks.0.hook_mlp_out", out="o").sites == (
        "blocks.1.attn.hook_z", "blocks.0.hook_mlp_out")


def test_the_lens_needs_an_lm_head_and_says_so_in_the_one_wording(tiny_model_dir):
    import dataclasses
    from types import SimpleNamespace

    from anatomy_cli.errors import UsageError
    from anatomy_cli.models.capabilities import Need
    from anatomy_cli.models.capabilities import refusal
    from anatomy_cli.tasks import corpus as task
    from anatomy_cli.tasks.session import open_model

    opened = open_model(ModelSpec(str(tiny_model_dir("gpt2"))))
    headless = SimpleNamespace(info=dataclasses.replace(opened.info, has_lm_head=False), name=opened.name)
    with pytest.raises(UsageError) as caught:
        task.check(headless, task.CorpusOptions())
    assert str(caught.value) == refusal(headless.info, Need.lm_head, "corpus")
    assert task.check(headless, task.CorpusOptions(lens=False)).ctx == min(512, opened.info.n_ctx)
