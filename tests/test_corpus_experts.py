"""`anatomy corpus --experts` (issue 50): expert load over a corpus, against a hand count from transformers' own
router logits; exact merges across shards, resume and Ray; the dense-model refusal.

Tiny random Mixtral (renormalised top-k) and Qwen3-MoE (``norm_topk_prob``) from tests/models.py, Qwen2-MoE
(block 1 dense). The reference runs each window alone through transformers with ``output_router_logits=True``
and routes by hand (softmax, top k, the family's normalisation: :func:`test_moe._reference`), then counts in
Python.
"""

from __future__ import annotations

import json
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from test_corpus import windows_of
from test_moe import _reference
from test_moe import _sparse
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.runner import Settings
from anatomy_cli.corpus.runner import run
from anatomy_cli.corpus.sources import open_source
from anatomy_cli.models.spec import ModelSpec

CTX, N = 16, 5
TEXTS = ["The bank of the river was muddy after the rain, and the boats stayed in. ",
         "Thank you very much for the letter; it came on a Tuesday, as letters do."]


def invoke(*args, input=None):
    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def _source(tmp_path) -> Path:
    path = tmp_path / "two.txt"
    path.write_text((TEXTS[0] + TEXTS[1]) * 3)
    return path


def _settings(**kw) -> Settings:
    return Settings(**{"ctx": CTX, "bos": False, "max_tokens": CTX * N, "lens": False, "shard_windows": 2,
                       "batch_size": 2, "experts": True, **kw})


def hand_count(lm, arch, wins):
    """Per sparse block: slots per expert, weight sums per expert, co-chosen pair counts, tokens; each window
    alone through transformers (output_router_logits=True), routed by the family's rule, counted in Python."""
    e = lm.info.moe.n_experts
    out = {b: {"slots": [0] * e, "weight": [0.0] * e, "pairs": {}, "tokens": 0} for b in _sparse(lm)}
    for ids in wins:
        ref, _ = _reference(lm, arch, ids)
        for b, (_logits, idx, w) in ref.items():
            c = out[b]
            for experts, weights in zip(idx.tolist(), w.double().tolist()):
                c["tokens"] += 1
                for x, y in zip(experts, weights):
                    c["slots"][x] += 1
                    c["weight"][x] += y
                for pair in combinations(sorted(experts), 2):
                    c["pairs"][pair] = c["pairs"].get(pair, 0) + 1
    return out


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe", "qwen2_moe"])
def test_loads_weights_and_pairs_equal_a_hand_count(tiny_lm, tiny_model_dir, tmp_path, arch):
    lm = tiny_lm(arch)
    src = _source(tmp_path)
    result = run(open_source(str(src)), ModelSpec(str(tiny_model_dir(arch))), _settings(), tokenizer=lm.tokenizer,
                 lm=lm)
    wins = windows_of(lm.tokenizer.hf, src.read_text(), CTX, N, False)
    assert result.stats.tokens == sum(map(len, wins)) == CTX * N
    ref = hand_count(lm, arch, wins)
    k = lm.info.moe.top_k
    stats = result.stats
    assert [r["block"] for r in stats.expert_blocks] == _sparse(lm) == list(ref)
    for block in stats.expert_blocks:
        c = ref[block["block"]]
        slots = np.asarray(c["slots"], np.float64)
        assert block["tokens"] == c["tokens"] == CTX * N and block["top_k"] == k
        assert block["load_max_over_mean"] == pytest.approx(slots.max() / slots.mean(), rel=1e-12)
        assert block["load_cv"] == pytest.approx(slots.std() / slots.mean(), rel=1e-12)
        assert block["busiest_expert"] == int(slots.argmax()) and block["idle_experts"] == int((slots == 0).sum())
        rows = [r for r in stats.experts if r["block"] == block["block"]]
        assert [r["expert"] for r in rows] == list(range(lm.info.moe.n_experts))
        assert [r["slots"] for r in rows] == c["slots"]
        assert sum(r["load"] for r in rows) == pytest.approx(1.0, rel=1e-12)
        for r in rows:
            assert r["load"] == pytest.approx(c["slots"][r["expert"]] / (c["tokens"] * k), rel=1e-12)
            want = c["weight"][r["expert"]] / c["slots"][r["expert"]] if c["slots"][r["expert"]] else None
            assert r["mean_weight"] == pytest.approx(want, rel=1e-6)
        pairs = {(r["expert_a"], r["expert_b"]): r["count"] for r in stats.expert_pairs
                 if r["block"] == block["block"]}
        assert pairs == c["pairs"]
        assert sum(pairs.values()) == c["tokens"] * k * (k - 1) // 2
    if arch == "qwen2_moe":  # not renormalised: the mean weights are top-k probabilities, below 1 / k on average
        assert all(r["mean_weight"] < 1 for r in stats.experts if r["mean_weight"] is not None)


def _expert_keys(stats) -> tuple:
    return stats.expert_blocks, stats.experts, stats.expert_pairs


def test_shards_merge_to_one_run_exactly_and_read_back_from_parquet(tiny_lm, tiny_model_dir, tmp_path):
    lm = tiny_lm("mixtral")
    spec = ModelSpec(str(tiny_model_dir("mixtral")))
    src = open_source(str(_source(tmp_path)))
    one = run(src, spec, _settings(shard_windows=16), tokenizer=lm.tokenizer, lm=lm)
    out = tmp_path / "run"
    many = run(src, spec, _settings(shard_windows=2), tokenizer=lm.tokenizer, lm=lm, out=out)
    assert (one.shards, many.shards) == (1, 3)
    assert _expert_keys(many.stats) == _expert_keys(one.stats)  # the same batches: to the last bit
    # the shards on disk, read back and merged by hand in shard order, give the same sums
    import pyarrow.parquet as pq

    parts = [Partial.from_table(pq.read_table(p))
             for p in sorted((out / "shards").glob("shard-*.parquet"))]
    merged = parts[0].experts.copy()
    for p in parts[1:]:
        merged.merge(p.experts)
    assert merged.tokens.tolist() == [CTX * N] * 2
    from anatomy_cli.corpus.expert_sums import summarize

    assert tuple(map(tuple, summarize(merged))) == _expert_keys(one.stats)
    assert np.array_equal(merged.pairs, merged.pairs.transpose(0, 2, 1))
    assert np.array_equal(np.diagonal(merged.pairs, axis1=1, axis2=2), merged.slots)


def test_resume_equals_one_run_and_the_parquet_files_are_typed(tiny_model_dir, tmp_path, cached_load):
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, out = _source(tmp_path), tmp_path / "run"
    args = ["corpus", src, "--model", tiny_model_dir("qwen3_moe"), "--ctx", CTX, "--max-tokens", CTX * N,
            "--shard-windows", 2, "--batch-size", 2, "--no-bos", "--experts", "--format", "json"]
    first = invoke(*args, "--out", out)
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert data["settings"]["experts"] is True and len(data["expert_blocks"]) == 2
    (out / "shards/shard-00001.parquet").unlink()
    again = invoke(*args, "--out", out)
    assert again.exit_code == 0, again.output
    assert "resumed: 2 of 3 shards" in again.stderr
    resumed = json.loads(again.stdout)
    for key in ("expert_blocks", "experts", "expert_pairs", "layers"):
        assert resumed[key] == data[key], key
    types = {name: dict(zip(t.schema.names, t.schema.types)) for name in ("expert_blocks", "experts", "expert_pairs")
             for t in [pq.read_table(out / f"{name}.parquet")]}
    assert types["experts"] == {"block": pa.int64(), "expert": pa.int64(), "slots": pa.int64(),
                                "load": pa.float64(), "mean_weight": pa.float64()}
    assert types["expert_pairs"] == {"block": pa.int64(), "expert_a": pa.int64(), "expert_b": pa.int64(),
                                     "count": pa.int64(), "share": pa.float64()}
    assert types["expert_blocks"]["load_cv"] == pa.float64() and types["expert_blocks"]["tokens"] == pa.int64()
    assert pq.read_table(out / "experts.parquet").to_pylist() == data["experts"]
    # a run without --experts is another run: refused, named
    other = invoke(*[a for a in args if a != "--experts"], "--out", out)
    assert other.exit_code == 2 and "--experts" in other.stderr


def test_tsv_sections_and_a_run_without_experts_has_none(tiny_model_dir, tmp_path, cached_load):
    src = _source(tmp_path)
    base = ["corpus", src, "--model", tiny_model_dir("mixtral"), "--ctx", CTX, "--max-tokens", CTX * 2, "--no-lens"]
    tsv = invoke(*base, "--experts")
    assert tsv.exit_code == 0, tsv.output
    lines = tsv.stdout.splitlines()
    assert "block\ttokens\ttop_k\tn_experts\tload_max_over_mean\tload_cv\tbusiest_expert\tidle_experts" in lines
    assert "block\texpert\tslots\tload\tmean_weight" in lines
    assert "block\texpert_a\texpert_b\tcount\tshare" in lines
    plain = json.loads(invoke(*base, "--format", "json").stdout)
    assert plain["experts"] == plain["expert_blocks"] == plain["expert_pairs"] == []
    assert "experts" not in plain["settings"]


def test_a_dense_model_is_refused_in_one_line_before_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    import anatomy_cli.tasks.corpus as corpus_task

    monkeypatch.setattr(corpus_task, "load_weights", lambda *_a, **_k: pytest.fail("weights loaded"))
    res = invoke("corpus", _source(tmp_path), "--model", tiny_model_dir("llama"), "--experts")
    assert res.exit_code == 2
    assert res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert "dense model (llama), not a mixture of experts: `corpus --experts` reads the routers" in res.stderr


def test_the_api_keyword(tiny_lm, tmp_path):
    import anatomy_cli as anatomy

    result = anatomy.corpus_stats(tiny_lm("olmoe"), _source(tmp_path), ctx=CTX, max_tokens=CTX * 2, lens=False,
                                  experts=True)
    data = result.to_dict()
    assert [r["block"] for r in data["expert_blocks"]] == [0, 1]
    assert sum(r["slots"] for r in data["experts"]) == 2 * CTX * 2 * 2  # 2 blocks x 32 tokens x k = 2


@pytest.mark.parametrize("arch", ["qwen2_moe", "olmoe"])
def test_the_expert_load_picture_draws_the_json_loads(tiny_model_dir, tmp_path, cached_load, monkeypatch, arch):
    """`corpus --experts --plot`: the heatmap's cells (MoE block x expert) are the JSON's `load` values, a row per
    MoE block only (Qwen2-MoE's block 1 is dense), and the PNG is written."""
    from anatomy_cli.output import plots

    drawn = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path: (drawn.append(fig), save(fig, path))[1])
    png = tmp_path / "load.png"
    res = invoke("corpus", _source(tmp_path), "--model", tiny_model_dir(arch), "--ctx", CTX, "--max-tokens", CTX * N,
                 "--no-lens", "--experts", "--plot", png, "--format", "json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    [ax] = [a for a in drawn[0].axes if a.get_xlabel() == "expert"]
    cells = np.asarray(ax.images[0].get_array())
    blocks = sorted({r["block"] for r in data["experts"]})
    assert blocks == ([0] if arch == "qwen2_moe" else [0, 1])
    assert cells.shape == (len(blocks), data["expert_blocks"][0]["n_experts"])
    for r in data["experts"]:
        assert cells[blocks.index(r["block"]), r["expert"]] == r["load"]
    assert [t.get_text() for t in ax.get_yticklabels()] == [str(b) for b in blocks]
    assert np.allclose(cells.sum(axis=1), 1.0)  # each block's slots, all of them
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    empty = [a for a in drawn[0].axes if a.get_title().startswith("logit lens")]  # --no-lens: said, not blank
    assert len(empty) == 2 and all(t.get_text() == "no lens measured (--no-lens)" for a in empty for t in a.texts)
