"""`corpus --lens` (issue 48): per block and per lens KL to the final distribution, cross-entropy and entropy, in
nats per token and bits per byte, against an independent computation on a tiny random LLaMA: transformers' own
``hidden_states``, each translator applied by hand, a hand-written RMSNorm and LM head, float64 log-softmax; bytes
from the tokenizer's own decode of the windows' text."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from test_fitted_lens import LAYERS
from test_fitted_lens import D
from test_fitted_lens import _hidden_states
from test_fitted_lens import _save_jacobian
from test_fitted_lens import _save_tuned
from test_fitted_lens import _unembed
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.corpus.partial import Partial
from anatomy_cli.corpus.settings import Settings
from anatomy_cli.corpus.summary import summarize
from anatomy_cli.corpus.windows import Shard
from anatomy_cli.corpus.worker import Worker

runner = CliRunner()
TEXT = ("The quick brown fox jumps over the lazy dog because it was tired of running. Thank you very much for "
        "the help with the garden; the roses are blooming again and the bees are back.")
LN2 = math.log(2.0)


def _windows(lm, n: int = 4, ctx: int = 9) -> tuple[tuple[int, ...], ...]:
    ids = lm.tokenizer.hf(TEXT, add_special_tokens=False)["input_ids"]
    assert len(ids) >= n * ctx
    return tuple(tuple(ids[i * ctx:(i + 1) * ctx]) for i in range(n))


def _lenses(tmp_path, seed: int = 0):
    """A random tuned lens (translators for embed and block 0; block 1, the last, read as it is) and a Jacobian lens
    fitted at block 0 only (embed unfitted; the last block read as it is)."""
    g = torch.Generator().manual_seed(seed)
    weights = [0.1 * torch.randn(D, D, generator=g) for _ in range(LAYERS)]
    biases = [0.1 * torch.randn(D, generator=g) for _ in range(LAYERS)]
    jac = {0: torch.eye(D) + 0.2 * torch.randn(D, D, generator=g)}
    tuned = _save_tuned(tmp_path / "tuned", weights, biases)
    jfile = _save_jacobian(tmp_path / "j.pt", jac, dtype=torch.float32)
    return tuned, jfile, weights, biases, jac


def _run_shards(lm, lens: tuple[str, ...], shards: list[Shard]) -> Partial:
    settings = Settings(ctx=9, bos=False, lens=lens, batch_size=2)  # the same forwards however the shards fall
    worker = Worker({"model": lm.name}, dataclasses.asdict(settings), lm=lm)
    parts = [worker(s) for s in shards]
    merged = Partial(lm.n_layers, lm.n_heads, lm.d_model, parts[0].fitted)
    for p in parts:
        merged.merge(p)
    return merged


def _reference(lm, windows, read) -> dict[str, list[float | None]]:
    """Per residual row, the mean KL(final || lens) (nats), CE (nats, positions with a next token) and entropy
    (nats) over every position; ``read(row, h)`` the lens' reading of row ``row`` (None: the lens has none)."""
    rows = lm.n_layers + 1
    sums = {m: [0.0] * rows for m in ("kl", "ce", "entropy")}
    counts = {m: [0] * rows for m in ("kl", "ce", "entropy")}
    for ids in windows:
        hs = _hidden_states(lm, list(ids)).detach()                          # [L + 1, pos, d]
        with torch.no_grad():
            logp = {r: torch.log_softmax(_unembed(lm, read(r, hs[r])).double(), -1)
                    for r in range(rows) if read(r, hs[r]) is not None}
            final = torch.log_softmax(_unembed(lm, hs[-1]).double(), -1)
        for r, lp in logp.items():
            kl = (final.exp() * (final - lp)).sum(-1).clamp_min(0)
            sums["kl"][r] += float(kl.sum())
            sums["entropy"][r] += float(-(lp.exp() * lp).sum(-1).sum())
            sums["ce"][r] += float(-lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].sum())
            counts["kl"][r] += len(ids)
            counts["entropy"][r] += len(ids)
            counts["ce"][r] += len(ids) - 1
    return {m: [s / n if n else None for s, n in zip(sums[m], counts[m])] for m in sums}


def _check(rows, ref, per_byte):
    for r, row in enumerate(rows):
        for key, m in (("kl_nats", "kl"), ("ce_nats", "ce"), ("entropy_nats", "entropy")):
            want = ref[m][r]
            unit = key.replace("_nats", "_bits_per_byte")
            if want is None:
                assert row[key] is None and row[unit] is None, (row["layer"], key)
                continue
            assert row[key] == pytest.approx(want, rel=1e-5, abs=1e-7), (row["layer"], key)
            assert row[unit] == pytest.approx(want / LN2 * per_byte, rel=1e-5, abs=1e-7), (row["layer"], unit)


def test_each_lens_equals_the_hand_computation_in_nats_and_bits_per_byte(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    tuned, jfile, weights, biases, jac = _lenses(tmp_path)
    windows = _windows(lm)
    lens = ("logit", f"tuned:{tuned}", f"jacobian:{jfile}")
    stats = summarize(_run_shards(lm, lens, [Shard(0, 0, windows)]), lens)
    # bytes: the tokenizer's own decode of every window's text (ASCII text: whole characters)
    n_bytes = sum(len(lm.tokenizer.hf.decode(list(w)).encode("utf-8")) for w in windows)
    assert stats.bytes == n_bytes and stats.tokens == 36
    per_byte = stats.tokens / n_bytes
    by = {lens["lens"]: lens for lens in stats.lenses}
    assert [lens["lens"] for lens in stats.lenses] == ["logit", "tuned", "jacobian"]
    assert by["tuned"]["source"] == str(tuned.resolve()) and by["logit"]["source"] is None

    _check(by["logit"]["layers"], _reference(lm, windows, lambda r, h: h), per_byte)
    tuned_read = (lambda r, h: h if r == LAYERS else h + h @ weights[r].T + biases[r])
    _check(by["tuned"]["layers"], _reference(lm, windows, tuned_read), per_byte)
    jac_read = (lambda r, h: h if r == LAYERS else h @ jac[0].T if r == 1 else None)
    _check(by["jacobian"]["layers"], _reference(lm, windows, jac_read), per_byte)
    # the Jacobian lens is not fitted at embed: null there, and said
    assert by["jacobian"]["unfitted"] == ["embed"] and by["tuned"]["unfitted"] == []
    # the last row is the model's own distribution through every lens: KL 0, one loss
    assert {lens["layers"][-1]["kl_nats"] for lens in stats.lenses} == {0.0}
    assert stats.loss_bits == pytest.approx(by["logit"]["layers"][-1]["ce_nats"] / LN2, rel=1e-12)


def test_two_shards_merged_equal_one_run(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    tuned, jfile, *_ = _lenses(tmp_path, seed=1)
    windows = _windows(lm)
    lens = ("logit", f"tuned:{tuned}", f"jacobian:{jfile}")
    whole = _run_shards(lm, lens, [Shard(0, 0, windows)])
    halves = _run_shards(lm, lens, [Shard(0, 0, windows[:2]), Shard(1, 2, windows[2:])])
    assert whole.sums.keys() == halves.sums.keys() and "tuned.entropy_nats" in whole.sums
    for metric, sums in whole.sums.items():                # the float64 sums: equal up to the order of addition
        for key, value in sums.items():
            np.testing.assert_allclose(halves.sums[metric][key], value, rtol=1e-13, atol=0, err_msg=metric)
    one, two = (summarize(p, lens).to_dict() for p in (whole, halves))
    assert one["bytes"] == two["bytes"] and one["tokens"] == two["tokens"]
    for a, b in zip(one["lenses"], two["lenses"]):
        for ra, rb in zip(a["layers"], b["layers"]):
            assert ra.keys() == rb.keys()
            for key in ra:
                # a standard error is a difference of two near-equal sums (Σ m² - (Σ m)² / W): its last digits
                # follow the order of addition, the means' do not
                rel = 1e-2 if key.endswith("_se") else 1e-12
                want = rb[key] if not isinstance(rb[key], float) else pytest.approx(rb[key], rel=rel, abs=1e-15)
                assert ra[key] == want, (a["lens"], ra["layer"], key)


def test_identity_jacobian_and_zero_translators_read_exactly_the_logit_lens(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    jfile = _save_jacobian(tmp_path / "eye.pt", {0: torch.eye(D), 1: torch.eye(D)}, dtype=torch.float32)
    tuned = _save_tuned(tmp_path / "zero", [torch.zeros(D, D)] * LAYERS, [torch.zeros(D)] * LAYERS)
    lens = ("logit", f"tuned:{tuned}", f"jacobian:{jfile}")
    stats = summarize(_run_shards(lm, lens, [Shard(0, 0, _windows(lm))]), lens)
    logit, zero, eye = (lens["layers"] for lens in stats.lenses)
    assert zero == logit
    assert eye[1:] == logit[1:]                                         # J has no reading of embed
    assert all(v is None for k, v in eye[0].items() if k not in ("layer", "lens_positions", "ce_positions"))


def test_cli_json_parquet_and_resume(tiny_model_dir, tmp_path, cached_load):
    import pyarrow as pa
    import pyarrow.parquet as pq

    tuned, jfile, *_ = _lenses(tmp_path, seed=2)
    src = tmp_path / "c.txt"
    src.write_text(TEXT * 3)
    args = ["corpus", str(src), "--model", str(tiny_model_dir("llama")), "--ctx", "16", "--shard-windows", "2",
            "--lens", "logit", "--lens", f"tuned:{tuned}", "--lens", f"jacobian:{jfile}", "--out",
            str(tmp_path / "run"), "--format", "json"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    data = json.loads(first.stdout)
    assert data["settings"]["lens"] == ["logit", f"tuned:{tuned.resolve()}", f"jacobian:{jfile.resolve()}"]
    assert [lens["lens"] for lens in data["lenses"]] == ["logit", "tuned", "jacobian"]
    row = data["lenses"][1]["layers"][0]
    assert list(row) == ["layer", "kl_nats", "kl_nats_se", "kl_bits_per_byte", "ce_nats", "ce_nats_se",
                         "ce_bits_per_byte", "entropy_nats", "entropy_nats_se", "entropy_bits_per_byte",
                         "top1_agree", "top1_agree_se", "lens_positions", "ce_positions"]
    assert data["lenses"][2]["layers"][0]["kl_nats"] is None and data["bytes"] > 0
    table = pq.read_table(tmp_path / "run" / "lenses.parquet")
    assert table.schema.field("lens").type == pa.string() and table.schema.field("row").type == pa.int64()
    assert table.schema.field("kl_bits_per_byte").type == pa.float64()
    assert table.num_rows == 3 * (LAYERS + 1)
    again = runner.invoke(app, args)                                     # every shard read back: the same figures
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["resumed_shards"] == data["shards"]
    assert json.loads(again.stdout)["lenses"] == data["lenses"]


def test_todays_command_lines_and_refusals(tiny_model_dir, tmp_path, cached_load):
    src = tmp_path / "c.txt"
    src.write_text(TEXT)
    model = str(tiny_model_dir("llama"))
    base = ["corpus", str(src), "--model", model, "--ctx", "16", "--format", "json"]
    plain = runner.invoke(app, base)
    assert plain.exit_code == 0, plain.output
    data = json.loads(plain.stdout)
    assert data["settings"]["lens"] is True and [lens["lens"] for lens in data["lenses"]] == ["logit"]
    assert data["lenses"][0]["layers"][-1]["ce_nats"] == pytest.approx(data["layers"][-1]["ce_nats"], rel=1e-12)
    none = runner.invoke(app, [*base, "--no-lens"])
    assert none.exit_code == 0 and json.loads(none.stdout)["lenses"] == []
    both = runner.invoke(app, [*base, "--no-lens", "--lens", "logit"])
    assert both.exit_code == 2 and "--no-lens" in both.stderr
    twice = runner.invoke(app, [*base, "--lens", "logit", "--lens", "logit"])
    assert twice.exit_code == 2 and "given twice" in twice.stderr
    wide = _save_jacobian(tmp_path / "wide.pt", {0: torch.eye(D)})
    torch.save({"J": {0: torch.eye(2 * D)}, "n_prompts": 1, "source_layers": [0], "d_model": 2 * D}, wide)
    other = runner.invoke(app, [*base, "--lens", f"jacobian:{wide}"])
    assert other.exit_code == 2 and "d_model 64" in other.stderr, other.stderr


def test_a_shard_written_before_entropy_and_bytes_is_computed_again(tmp_path):
    """A run directory of before issue 48 resumes: its shards (no ``bytes`` in their metadata) are refused by
    ``Partial.from_table``, which the store reports as damaged, so the runner computes them again."""
    import pyarrow.parquet as pq

    from anatomy_cli.corpus.store import Store
    from anatomy_cli.models.identity import file_sha256

    part = Partial(2, 4, 32, windows=1, tokens=9, bytes=30)
    assert Partial.from_table(part.to_table()).bytes == 30
    table = part.to_table()
    meta = json.loads(table.schema.metadata[b"anatomy.partial"])
    del meta["bytes"], meta["fitted"]
    old = table.replace_schema_metadata({"anatomy.partial": json.dumps(meta)})
    with pytest.raises(ValueError, match="before the entropy"):
        Partial.from_table(old)
    store = Store(tmp_path / "run")
    store.open({"resolved": "m"}, {"path": "c.txt", "mtime": 0}, {"lens": True}, overwrite=False)
    store.save(0, part)
    pq.write_table(old, tmp_path / "run" / store.done[0]["file"])
    store.manifest["shards"][0]["sha256"] = file_sha256(tmp_path / "run" / store.done[0]["file"])
    why = store.load(0)
    assert isinstance(why, str) and "before the entropy" in why


def _drawn(ax, label):
    """The (x, y) of the curve labelled ``label`` in ``ax`` (NaN-free: the points matplotlib drew)."""
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == label]
    return [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()]


def _expected(rows, key, scale=1.0, skip=None):
    """The points a lens' JSON rows give: x = the residual row (embed 0, block N at N + 1), y = ``key`` × scale."""
    return ([0.0 if r["layer"] == "embed" else r["layer"] + 1.0 for r in rows if r[key] is not None and r["layer"] != skip],
            [r[key] * scale for r in rows if r[key] is not None and r["layer"] != skip])


@pytest.mark.parametrize("suffix", [".png", ".html"])
def test_the_picture_draws_every_lens_from_the_json_figures(tiny_model_dir, tmp_path, cached_load, monkeypatch,
                                                            suffix):
    """`corpus --lens ... --plot`: the KL and CE panels draw one curve per lens, each exactly the per-lens JSON
    numbers (CE in bits: ce_nats / ln 2); J = I at block 0 draws the logit lens' curve there (an independent
    check: J = I is the logit lens), and its unfitted embed row is not drawn."""
    from anatomy_cli.output import plots

    eye = _save_jacobian(tmp_path / "eye.pt", {0: torch.eye(D)}, dtype=torch.float32)
    tuned, *_ = _lenses(tmp_path, seed=3)
    src = tmp_path / "c.txt"
    src.write_text(TEXT * 3)
    drawn = []
    save = plots.save
    monkeypatch.setattr(plots, "save", lambda fig, path, index=None: (drawn.append(fig), save(fig, path, index))[1])
    out = tmp_path / f"c{suffix}"
    res = runner.invoke(app, ["corpus", str(src), "--model", str(tiny_model_dir("llama")), "--ctx", "16",
                              "--lens", "logit", "--lens", f"jacobian:{eye}", "--lens", f"tuned:{tuned}",
                              "--format", "json", "--plot", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert out.stat().st_size > 0 and len(drawn) == 1
    kl, ce = drawn[0].axes[:2]
    labels = {"logit": "logit lens", "jacobian": "Jacobian lens eye.pt (not fitted: embed)",
              "tuned": f"tuned lens {tuned.name}"}
    last = LAYERS - 1
    for lens in data["lenses"]:
        label = labels[lens["lens"]]
        x, y = _drawn(kl, label)
        want_x, want_y = _expected(lens["layers"], "kl_nats", skip=last)
        assert x == want_x and y == pytest.approx(want_y, rel=1e-12), label
        x, y = _drawn(ce, label)
        want_x, want_y = _expected(lens["layers"], "ce_nats", 1 / LN2)
        assert x == want_x and y == pytest.approx(want_y, rel=1e-12), label
    # J = I reads the logit lens: its drawn points are the logit lens' at every row it reads (embed not)
    for ax in (kl, ce):
        lx, ly = _drawn(ax, "logit lens")
        jx, jy = _drawn(ax, labels["jacobian"])
        assert jx == lx[1:] and jy == pytest.approx(ly[1:], rel=1e-5)
    # the logit lens' CE curve is the per-layer table's ce_bits, as the picture drew before fitted lenses
    assert _drawn(ce, "logit lens")[1] == pytest.approx([r["ce_bits"] for r in data["layers"]], rel=1e-12)
    assert "lenses" in kl.get_title()


def test_the_picture_of_the_logit_lens_alone_draws_the_per_layer_rows(tiny_model_dir, tmp_path, cached_load):
    from anatomy_cli import api as anatomy
    from anatomy_cli.output import statistics

    src = tmp_path / "c.txt"
    src.write_text(TEXT * 3)
    result = anatomy.corpus_stats(str(tiny_model_dir("llama")), str(src), ctx=16)
    kl, ce = result.plot().axes[:2]
    assert kl.get_title().startswith("logit lens: KL")
    rows = result.rows
    x, y = _drawn(ce, statistics.LENS["ce"].label)
    assert x == [0.0, 1.0, 2.0] and y == pytest.approx([r["ce_bits"] for r in rows], rel=1e-12)
