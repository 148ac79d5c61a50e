"""`corpus --save-activations`: the saved tensors against transformers' forward with a hook written here;
resume rewrites the same bytes; a wrong site is a one-line error before the weights load."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import torch
from safetensors.torch import load_file
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

runner = CliRunner()
DOCS = ["The cat sat on the mat. It was warm there, and the cat slept for a long time.",
        "Sparse autoencoders read a model's residual stream.",
        "A third document, short, ends the corpus here with a few more words to fill windows."]
SITES = "blocks.1.hook_resid_post,blocks.0.hook_mlp_out"


def invoke(*args):
    return runner.invoke(app, [str(a) for a in args])


def _source(tmp_path):
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    return src


def _run(model, src, out):
    return invoke("corpus", src, "--model", model, "--ctx", 8, "--bos", "--shard-windows", 2, "--batch-size", 2,
                  "--no-lens", "--save-activations", SITES, "--out", out, "--format", "json")


def _expected(model_dir):
    """Windows cut by hand (BOS, then 7 tokens of the documents joined with EOS) and transformers' activations
    at the two sites, read with forward hooks on the blocks."""
    from transformers import AutoModelForCausalLM
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    stream = []  # (token, document, offset)
    for d, text in enumerate(DOCS):
        ids = tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        stream += [(i, d, o) for o, i in enumerate(ids)]
    wins = [[(tok.bos_token_id, -1, -1), *stream[s:s + 7]] for s in range(0, len(stream), 7)]
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    got = {}
    blocks = model.transformer.h
    hooks = [blocks[1].register_forward_hook(lambda m, a, o: got.__setitem__("blocks.1.hook_resid_post",
                                                                          o[0] if isinstance(o, tuple) else o)),
             blocks[0].mlp.register_forward_hook(lambda m, a, o: got.__setitem__("blocks.0.hook_mlp_out", o))]
    acts = {s: [] for s in SITES.split(",")}
    with torch.no_grad():
        for w in wins:
            model(torch.tensor([[t for t, _, _ in w]]))
            for s in acts:
                acts[s].append(got[s][0])
    for h in hooks:
        h.remove()
    return [x for w in wins for x in w], {s: torch.cat(v) for s, v in acts.items()}


def test_saved_activations_equal_a_forward_hook_and_resume_rewrites_the_same_bytes(tiny_model_dir, tmp_path,
                                                                                   cached_load):
    model = tiny_model_dir("gpt2")
    src, out = _source(tmp_path), tmp_path / "run"
    res = _run(model, src, out)
    assert res.exit_code == 0, res.output
    index = pq.read_table(out / "activations" / "index.parquet")
    rows = index.to_pylist()
    meta = json.loads(index.schema.metadata[b"anatomy.activations"])
    assert meta["sites"] == SITES.split(",") and meta["dtype"] == "float32" and meta["width"]["blocks.0.hook_mlp_out"] == 32
    tokens, want = _expected(model)
    for site in SITES.split(","):
        mine = [r for r in rows if r["site"] == site]
        files = [load_file(out / "activations" / r["file"]) for r in mine]
        assert [r["rows"] for r in mine] == [f["activations"].shape[0] for f in files]
        cat = {k: torch.cat([f[k] for f in files]) for k in files[0]}
        assert cat["token_ids"].tolist() == [t for t, _, _ in tokens]
        assert cat["document"].tolist() == [d for _, d, _ in tokens]
        assert cat["offset"].tolist() == [o for _, _, o in tokens]
        assert cat["position"].tolist() == [p for w in range(len(tokens) // 8 + 1) for p in range(8)][:len(tokens)]
        torch.testing.assert_close(cat["activations"], want[site], rtol=1e-5, atol=1e-5)
        assert cat["activations"].dtype == torch.float32
        first = [(r["first_document"], r["first_token"]) for r in mine]
        assert first == [(d, o) for _, d, o in (tokens[r["first_window"] * 8 + 1] for r in mine)]
    before = {p.relative_to(out): p.read_bytes() for p in sorted((out / "activations").rglob("*")) if p.is_file()}
    # what a killed run leaves: a file missing, one truncated, a stats shard not written
    r0, r1 = rows[0], rows[3]
    (out / "activations" / r0["file"]).unlink()
    path = out / "activations" / r1["file"]
    path.write_bytes(path.read_bytes()[:100])
    (out / "shards" / "shard-00002.parquet").unlink()
    again = _run(model, src, out)
    assert again.exit_code == 0, again.output
    assert f"shard {r0['shard']}: activations at {r0['site']} missing; computed again" in again.stderr
    assert f"shard {r1['shard']}: activations at {r1['site']} damaged" in again.stderr
    after = {p.relative_to(out): p.read_bytes() for p in sorted((out / "activations").rglob("*")) if p.is_file()}
    assert after == before
    assert json.loads(again.stdout)["tokens"] == json.loads(res.stdout)["tokens"]
    other = invoke("corpus", src, "--model", model, "--ctx", 8, "--bos", "--shard-windows", 2, "--no-lens",
                   "--save-activations", "blocks.0.hook_resid_post", "--out", out)
    assert other.exit_code == 2 and "--save-activations" in other.stderr


def test_a_wrong_site_is_one_line_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    def no_weights(*a, **k):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr("anatomy_cli.tasks.corpus.load_weights", no_weights)
    model, src = tiny_model_dir("gpt2"), _source(tmp_path)
    base = ["corpus", src, "--model", model, "--out", tmp_path / "o", "--save-activations"]
    res = invoke(*base, "blocks.9.hook_resid_post")
    assert res.exit_code == 2
    assert res.stderr == (f"error: --save-activations: {model} has 2 layers (blocks.0 to blocks.1), "
                          "not blocks.9.hook_resid_post\n")
    res = invoke(*base, "blocks.1.resid_post")
    assert res.exit_code == 2 and res.stderr.startswith("error: --save-activations: 'blocks.1.resid_post' is not")
    assert len(res.stderr.splitlines()) == 1
    res = invoke("corpus", src, "--model", model, "--save-activations", "blocks.1.hook_resid_post")
    assert res.exit_code == 2 and res.stderr == ("error: --save-activations needs --out DIR and runs in-process "
                                                 "(not with --ray)\n")
