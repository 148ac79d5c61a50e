"""`anatomy fit-sae`: a TopK SAE and an MLP transcoder trained on a tiny random model's activations (anatomy's
hooks), written in sparsify's format and read back by `anatomy sae`; the health warnings of issue 51."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli.analyses import sae as analysis
from anatomy_cli.cli.main import app
from anatomy_cli.declare.shared import MIN_ROWS
from anatomy_cli.engine import sae_fit
from anatomy_cli.engine.threads import machine_threads
from anatomy_cli.errors import UsageError
from anatomy_cli.models.sae.read import read
from anatomy_cli.tasks import notes
from anatomy_cli.tasks.session import busy_threads

runner = CliRunner()
# eai-sparsify is the optional [train] extra, not in the test environment: a Python that has it, named here
SPARSIFY_PYTHON = os.environ.get("SPARSIFY_PYTHON")


@pytest.fixture
def corpus(tmp_path):
    text = " ".join(f"The {w} sat on the mat and looked at the {v}." for w in ("cat", "dog", "bird", "fox")
                    for v in ("door", "sky", "tree", "moon", "sea"))
    path = tmp_path / "corpus.txt"
    path.write_text((text + "\n") * 6)
    return path


def fit(model_dir, corpus, out, *more, layer="1"):
    return runner.invoke(app, ["fit-sae", str(corpus), "--model", str(model_dir), "--layer", layer, "--out", str(out),
                               "--ctx", "32", "--max-tokens", "640", "--d-sae", "64", "--k", "4", "--epochs", "30",
                               "--batch-size", "64", "--lr", "0.01", "--format", "json", *more])


@pytest.mark.parametrize("transcoder", [False, True])
def test_trained_sae_reconstructs_better_than_its_init_and_loads_in_sae(tiny_model_dir, corpus, tmp_path,
                                                                         transcoder):
    from anatomy_cli.engine import load
    from anatomy_cli.engine.sae import Dictionary

    model = tiny_model_dir("gpt2")
    out = tmp_path / "sae"
    result = fit(model, corpus, out, *(["--transcoder"] if transcoder else []))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    folder = out / ("layers.1.mlp" if transcoder else "layers.1")
    assert data["out"] == str(out) and [(b["layer"], b["folder"]) for b in data["blocks"]] == [(1, str(folder))]
    assert "fit-sae: a TopK" in result.stderr and "timed on this machine now" in result.stderr  # the cost first
    # the held-out window is the last full one (a short remainder held out left its FVE unjudged); the remainder
    # trains, and the cost line says how long it is
    assert data["held_out_tokens"] == 32 and data["tokens"] == 640 - 32
    windows, short = divmod(data["tokens"], 32)  # each window's first position is no row: 31 rows a window
    assert short == 0 or short >= 2
    assert data["cost"]["rows"] == windows * 31 + max(short - 1, 0)
    said = f"{data['tokens']:,} tokens ({windows + (short > 0)} windows of 32" + (f", the last of {short}" if short
                                                                                  else "") + \
        f"; {int(data['cost']['rows']):,} rows, each window's first position left out) x 30 epochs, 32 tokens held out " \
        "(the last full window):"
    assert said in " ".join(result.stderr.split()), result.stderr
    sae = read(folder)
    assert (sae.format, sae.k, sae.d_sae, sae.transcoder) == ("sparsify", 4, 64, transcoder)
    # the model as it resolves from anywhere (as a JumpReLU fit names it: the test below), a key sparsify drops
    assert json.loads((folder / "cfg.json").read_text())["model_name"] == sae.model_name == str(model.resolve())
    # the windows' length it trained on (--ctx 32), another key sparsify drops: features' and sae's default
    assert json.loads((folder / "cfg.json").read_text())["context_size"] == sae.context_size == 32
    # MSE on the training activations, computed here through anatomy's hooks: trained vs the same init
    lm = load(str(model), device="cpu")
    ids = lm.tokenizer.hf(corpus.read_text())["input_ids"]
    x, y = sae_fit.collect(lm, [ids[:32], ids[32:64]], [sae.site, sae.site_out])
    torch.manual_seed(0)  # fit-sae's --seed: the same initial coder
    init = sae_fit.TopKCoder(x.shape[1], 64, 4, transcode=transcoder)
    sae_fit.train(x, y, init, epochs=0, batch=64, lr=0.01)  # no step: sparsify's initial biases only
    with torch.no_grad():
        mse_init = float((init(x) - y).pow(2).mean())
    d = Dictionary(sae)
    mse_trained = float((d.decode(d.encode(x), x) - y).pow(2).mean())
    assert mse_trained < 0.5 * mse_init, (mse_trained, mse_init)
    # the file reads in `anatomy sae`, and its health is what fit-sae reported on the held-out window
    shown = runner.invoke(app, ["sae", "The cat sat on the mat", "--sae", str(folder), "--model", str(model),
                                "--format", "json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout)["sae"]["transcoder"] is transcoder
    # the fit records the positions its rows left out, and sae measures its health as the fit did (issue 68): FVE
    # over positions >= 1 by plain HF hooks and the dictionary's encode/decode, not over every position
    assert json.loads((folder / "cfg.json").read_text())["skipped_positions"] == sae.skipped_positions == 1
    health = json.loads(shown.stdout)["health"]
    fve_from_1, fve_all = _hand_fve(lm, sae, "The cat sat on the mat", transcoder)
    assert health["fve"] == pytest.approx(fve_from_1, abs=1e-5) and health["skipped_positions"] == 1
    assert abs(fve_all - fve_from_1) > 1e-3 and len(health["l0"]) == len(ids_of(lm, "The cat sat on the mat")) - 1
    assert "the health leaves out the prompt's first position, as the fit did" in shown.stderr
    said = json.loads(shown.stdout)  # the per-token tables keep every position
    assert sorted({r["position"] for r in said["top_features"]}) == list(range(len(said["tokens"])))
    table = runner.invoke(app, ["sae", "The cat sat on the mat", "--sae", str(folder), "--model", str(model),
                                "--format", "tsv"]).stdout.split("\n\n")
    l0_rows = next(t for t in table if t.startswith("position\ttoken\tl0")).splitlines()[1:]
    assert [r.split("\t")[0] for r in l0_rows] == [str(i) for i in range(len(said["tokens"]))]
    # the fit report beside it holds the held-out health fit-sae printed; features warns by fit-sae's rule
    report = json.loads((folder / "anatomy-fit.json").read_text())
    assert report["health"] == data["blocks"][0]["health"] and report["held_out_tokens"] == data["held_out_tokens"]
    fve = data["blocks"][0]["health"]["fve"]
    for written, weak in ((fve, fve < 0.5), (0.7, False) if fve < 0.5 else (0.2, True))[:2 - transcoder]:
        (folder / "anatomy-fit.json").write_text(json.dumps({**report, "health": {**report["health"], "fve": written}}))
        feats = runner.invoke(app, ["features", str(folder), "--corpus", str(corpus), "--model", str(model),
                                    "--max-tokens", "64", "--ctx", "32", "--format", "json"])
        assert feats.exit_code == 0, feats.output
        assert ("too weak to read" in feats.stderr) is weak, (written, feats.stderr)
        assert (f"held-out FVE of {written:.3f}, under 0.5" in feats.stderr) is weak
        said = json.loads(feats.stdout)["fit_report"]  # the JSON says it too (it had only the stderr line)
        assert said["held_out_fve"] == written and said["too_weak"] is (written < 0.5)
        assert said["path"] == str(folder / "anatomy-fit.json")
        assert (said["warning"] is not None and f"warning: {said['warning']}" in feats.stderr) is weak
    # the hook point is in cfg.json (sparsify keeps it in the folder's name only): a renamed folder keeps it, and
    # sae reads it without --hook as the folder named after it read
    assert json.loads((folder / "cfg.json").read_text())["hook_name"] == folder.name
    moved = folder.rename(tmp_path / "my dictionary")
    again = runner.invoke(app, ["sae", "The cat sat on the mat", "--sae", str(moved), "--model", str(model),
                                "--format", "json"])
    assert again.exit_code == 0, again.output
    assert again.stdout.replace(str(moved), str(folder)) == shown.stdout
    if not transcoder:  # features too: the same features at the same hook as before the rename
        moved_feats = runner.invoke(app, ["features", str(moved), "--corpus", str(corpus), "--model", str(model),
                                          "--max-tokens", "64", "--ctx", "32", "--format", "json"])
        assert moved_feats.exit_code == 0, moved_feats.output
        before, after = json.loads(feats.stdout), json.loads(moved_feats.stdout)
        assert after["dictionary"]["hook"] == before["dictionary"]["hook"] == "layers.1"
        assert after["dictionary"]["site"] == before["dictionary"]["site"] and after["features"] == before["features"]


def ids_of(lm, text):
    return lm.tokenizer.hf(text)["input_ids"]


def _hand_fve(lm, sae, text, transcoder):
    """FVE of ``sae`` on ``text`` from positions 1 on and over every position: block 1's MLP input and output
    (a transcoder) or its residual output (the block's output: the last block's hidden_states has ln_f applied)
    by plain hooks, through encode/decode."""
    from anatomy_cli.engine.sae import Dictionary

    seen = {}
    block = lm.model.transformer.h[1]
    handles = [block.mlp.register_forward_hook(lambda m, a, out: seen.update(x=a[0][0], y=out[0])),
               block.register_forward_hook(lambda m, a, out: seen.update(resid=(out[0] if isinstance(out, tuple) else out)[0]))]
    with torch.no_grad():
        lm.model(torch.tensor([ids_of(lm, text)]))
    for h in handles:
        h.remove()
    x, y = (seen["x"], seen["y"]) if transcoder else (seen["resid"], seen["resid"])
    d = Dictionary(sae)
    with torch.no_grad():
        recon = d.decode(d.encode(x.float()), x.float()).double()

    def fve(start):
        t, r = y.double()[start:], recon[start:]
        return float(1 - (t - r).pow(2).sum() / (t - t.mean(0)).pow(2).sum())

    return fve(1), fve(0)


def test_written_files_load_in_sparsify_itself(tiny_model_dir, corpus, tmp_path):
    import importlib.util

    python = sys.executable if importlib.util.find_spec("sparsify") else SPARSIFY_PYTHON
    if python is None:
        pytest.skip("eai-sparsify is not installed here (pip install -e '.[train]') and SPARSIFY_PYTHON is unset")
    out = tmp_path / "sae"
    assert fit(tiny_model_dir("gpt2"), corpus, out, "--epochs", "2").exit_code == 0
    x = torch.randn(5, 32)
    torch.save(x, tmp_path / "x.pt")
    code = ("import sys, torch; from sparsify import SparseCoder; "
            f"s = SparseCoder.load_from_disk({str(out / 'layers.1')!r}); x = torch.load({str(tmp_path / 'x.pt')!r}); "
            "e = s.encode(x); torch.save(s.decode(e.top_acts, e.top_indices), sys.argv[1])")
    subprocess.run([python, "-c", code, str(tmp_path / "y.pt")], check=True, capture_output=True)
    from anatomy_cli.engine.sae import Dictionary

    d = Dictionary(read(out / "layers.1"))
    torch.testing.assert_close(d.decode(d.encode(x), x), torch.load(tmp_path / "y.pt"), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("args, message", [
    (["--layer", "1", "--out", "OUT"], "does not exist"),
    (["--layer", "1"], "Missing option '--out'"),
    (["--layer", "1", "--out", "OUT", "--k", "9", "--d-sae", "8"], "--d-sae 8 is below --k 9"),
    (["--layer", "1", "--out", "FULL"], "is not empty"),
    (["--layer", "0,all", "--out", "OUT"], "'all' stands alone"),
    (["--layer", "0", "--layer", "x", "--out", "OUT"], "--layer '0,x': give block numbers"),
    # the syntax error names every form the option takes (a new user's `--layer -` was told "commas" only)
    (["--layer", "-", "--out", "OUT"], "e.g. 0,6,11, a range 2-5, -1 (the last) or all"),
    # JumpReLU-only settings on a TopK fit were ignored without a word (a new user's trial)
    (["--layer", "1", "--out", "OUT", "--bandwidth", "0.1"], "--bandwidth sets a JumpReLU's thresholds"),
    (["--layer", "1", "--out", "OUT", "--l0-coeff", "2", "--bandwidth", "0.1"], "--bandwidth and --l0-coeff set"),
])
def test_bad_input_is_one_line_before_the_model_opens(tmp_path, args, message):
    """--model nowhere would fail to open: each message comes first, from the options alone."""
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    args = [{"OUT": str(tmp_path / "o"), "FULL": str(tmp_path / "full")}.get(a, a) for a in args]
    missing = str(tmp_path / "missing.txt") if message == "does not exist" else str(tmp_path / "full" / "x")
    result = runner.invoke(app, ["fit-sae", missing, "--model", "nowhere", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def test_the_memory_estimate_counts_the_batch_the_fit_takes_not_the_flag(tiny_model_dir, corpus, tmp_path):
    """--batch-size past the training rows: a batch is all the rows (``min(batch, rows)``), and so is the estimate's
    batch of latents (it followed the flag: --batch-size 10^6 estimated 512 MB of latents for 589 rows)."""
    model = tiny_model_dir("gpt2")
    said = []
    for batch in ("589", "1000000"):
        result = fit(model, corpus, tmp_path / "o", "--estimate", "--batch-size", batch)
        assert result.exit_code == 0, result.output
        said.append(json.loads(result.stdout))
    assert said[0]["cost"]["rows"] == 589
    assert said[0]["cost"]["memory_bytes"] == said[1]["cost"]["memory_bytes"]


def test_jumprelu_settings_pass_with_jumprelu_and_their_defaults_with_topk(tmp_path):
    from anatomy_cli.tasks import fit_sae as task

    corpus = tmp_path / "c.txt"
    corpus.write_text("x")
    for more in ({"activation": "jumprelu", "bandwidth": 0.1, "l0_coeff": 2.0}, {"bandwidth": 0.05, "l0_coeff": 1.0}):
        opts = task.FitSaeOptions(corpus=(str(corpus),), layer=1, out=tmp_path / "o", **more)
        assert (opts.bandwidth, opts.l0_coeff) == (more["bandwidth"], more["l0_coeff"])


def test_too_small_a_corpus_is_refused_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    from anatomy_cli.tasks import session

    monkeypatch.setattr(session, "load_weights", lambda *a, **k: pytest.fail("weights loaded"))
    (tmp_path / "c.txt").write_text("The cat sat.")
    result = runner.invoke(app, ["fit-sae", str(tmp_path / "c.txt"), "--model", str(tiny_model_dir("gpt2")),
                                 "--layer", "1", "--out", str(tmp_path / "o"), "--ctx", "8", "--max-tokens", "64"])
    assert result.exit_code == 2 and "under two --ctx 8 windows" in result.output, result.output
    # --max-tokens under two windows: refused once --ctx is known to fit the model (a --ctx past its context is
    # that, not a budget: tests/test_trial_counts.py), still before the corpus is read or the weights load
    result = runner.invoke(app, ["fit-sae", str(tmp_path / "c.txt"), "--model", str(tiny_model_dir("gpt2")),
                                 "--layer", "1", "--out", str(tmp_path / "o"), "--max-tokens", "100", "--ctx", "64"])
    assert result.exit_code == 2, result.output
    assert result.stderr.splitlines() == ["error: --max-tokens 100 is under two --ctx 64 windows (one is held out)"]
    result = runner.invoke(app, ["fit-sae", str(tmp_path / "c.txt"), "--model", str(tiny_model_dir("gpt2")),
                                 "--layer", "7", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--layer" in result.output, result.output


def test_a_fit_of_fewer_than_8_training_rows_is_refused_before_the_weights_load(tiny_model_dir, tmp_path,
                                                                                monkeypatch):
    """The training windows' rows (each window's ctx tokens less its first position) under 8, the positions an FVU
    needs to be judged (analyses/sae.py MIN_ROWS): refused in one line before any weight loads, the rows
    counted as windows x (ctx - 1) of a corpus longer than --max-tokens (its last window held out): --ctx 8
    --max-tokens 16 gives 1 x 7 = 7 rows (refused; before, a fit of 1 row ran with warnings only); --ctx 5
    --max-tokens 15 gives 2 x 4 = 8, which fits (the JSON's cost.rows)."""
    from anatomy_cli.tasks import session

    model = tiny_model_dir("llama")
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat. " * 8)  # more tokens than any budget here
    load = session.load_weights

    def args(ctx, budget):
        return ["fit-sae", str(corpus), "--model", str(model), "--layer", "1", "--out", str(tmp_path / f"o{ctx}"),
                "--ctx", str(ctx), "--max-tokens", str(budget), "--d-sae", "16", "--k", "2", "--epochs", "1",
                "--format", "json"]

    monkeypatch.setattr(session, "load_weights", lambda *a, **k: pytest.fail("weights loaded"))
    for ctx, budget in ((8, 16), (2, 4)):
        n = (budget // ctx - 1) * (ctx - 1)
        result = runner.invoke(app, args(ctx, budget))
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            f"error: the corpus gives {n} training row{'s' * (n != 1)} (1 window of {ctx} tokens, each window's first "
            "position left out), under the 8 a fit needs: its loss is each batch's FVU, the error over the rows' "
            "variance around their own mean, which fewer rows do not measure (nor is an FVE judged on fewer): give "
            "more text, or a larger --ctx or --max-tokens"]
    monkeypatch.setattr(session, "load_weights", load)
    result = runner.invoke(app, args(5, 15))
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["cost"]["rows"] == (15 // 5 - 1) * (5 - 1) == 8


def test_a_ctx_past_the_context_is_refused_before_the_weights_load(tiny_model_dir, corpus, tmp_path, monkeypatch):
    """The model's context read from its config.json (transformers' own): one over it is a usage error naming
    --ctx (the API: ctx=), before any weight loads."""
    from anatomy_cli import api
    from anatomy_cli.tasks import session

    model = tiny_model_dir("gpt2")
    n_ctx = json.loads((model / "config.json").read_text())["n_positions"]
    fit_sae = api.fit_sae  # imported before the patch: a module imported under it would keep the patched name
    monkeypatch.setattr(session, "load_weights", lambda *a, **k: pytest.fail("weights loaded"))
    result = fit(model, corpus, tmp_path / "o", "--ctx", str(n_ctx + 1), "--max-tokens", "640")
    assert result.exit_code == 2, result.output
    assert f"error: --ctx {n_ctx + 1} is more than {model}'s context of {n_ctx} tokens" in result.output
    with pytest.raises(UsageError, match=f"^ctx= {n_ctx + 1} is more than .*'s context of {n_ctx} tokens$"):
        fit_sae(str(model), corpus, layer=1, out=tmp_path / "o", ctx=n_ctx + 1, max_tokens=640)


def test_the_default_ctx_is_the_context_of_a_model_under_256(tiny_model_dir, corpus, tmp_path):
    """No --ctx: min(256, the model's context): a 64-token model's windows are 64 tokens (the cost line says it)."""
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks import fit_sae as task
    from anatomy_cli.tasks.session import open_model

    model = tiny_model_dir("gpt2")
    n_ctx = json.loads((model / "config.json").read_text())["n_positions"]
    assert n_ctx < 256
    plan = task.check(open_model(ModelSpec(str(model))), task.FitSaeOptions(corpus=(str(corpus),), layer=1,
                                                                              out=tmp_path / "o", max_tokens=640))
    assert plan.ctx == n_ctx and max(map(len, plan.windows)) == n_ctx and len(plan.windows[0]) == n_ctx


def test_a_short_remainder_trains_and_the_last_full_window_is_held_out(tiny_model_dir, corpus, tmp_path):
    """--max-tokens 2000 --ctx 64 held out the 16 tokens left over (at 1,992: 7 positions, every FVE unjudged
    without a word): the remainder now trains and the full window before it is held out; the cost line says so."""
    from anatomy_cli.corpus.sources import open_source
    from anatomy_cli.corpus.windows import token_stream
    from anatomy_cli.corpus.windows import windows
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks import fit_sae as task
    from anatomy_cli.tasks.session import open_model

    opened = open_model(ModelSpec(str(tiny_model_dir("gpt2"))))
    hf = opened.tokenizer.hf
    plain = list(windows(token_stream(open_source(str(corpus)).pieces(), hf, eos=hf.eos_token_id), ctx=32,
                         max_tokens=32 * 20 + 9))
    assert [len(w) for w in plain[-2:]] == [32, 9]
    opts = task.FitSaeOptions(corpus=(str(corpus),), layer=1, out=tmp_path / "o", ctx=32, max_tokens=32 * 20 + 9)
    plan = task.check(opened, opts)
    assert plan.windows == (*plain[:-2], plain[-1], plain[-2])
    cost = {"tokens": 32 * 19 + 9, "rows": 19 * 31 + 8, "memory_bytes": 1.0, "activation_bytes": 1.0,
            "estimate": SimpleNamespace(describe=lambda: "now")}
    line = " ".join(task.cost_line(opts, plan, cost).split())  # type: ignore[arg-type]
    assert "(20 windows of 32, the last of 9; 597 rows" in line and "32 tokens held out (the last full window)" in line


def _health(**changes):
    base = dict(l0=(8,) * MIN_ROWS, l0_mean=8.0, stated_l0=8.0, fve=0.9, mse=1.0, error_ratio=0.3, norm_ratio=1.0,
                ce_clean_nats=3.0, ce_spliced_nats=3.1, ce_with_error_nats=3.0, kl_spliced_nats=0.1,
                kl_with_error_nats=0.0, max_logit_diff_with_error=0.0)
    return analysis.Health(**{**base, **changes})


def _warnings(h):
    return analysis.warnings(h, n_tokens=2, context_size=None, sae_bos=None, prompt_bos=None, centred=False,
                             centred_now=0.0)


def test_a_spliced_kl_of_6_8_nats_and_a_low_fve_are_warned():
    kl = _warnings(_health(kl_spliced_nats=6.8))  # the issue's SAE: no warning before
    assert len(kl) == 1 and "KL 6.80 nats > 1" in kl[0] and "does not fit" in kl[0]
    assert _warnings(_health()) == []
    assert _warnings(_health(kl_spliced_nats=1.0)) == []  # the threshold itself passes
    fve = _warnings(_health(fve=0.3))
    assert len(fve) == 1 and "FVE 0.300 < 0.5" in fve[0]
    assert len(_warnings(_health(fve=-0.2))) == 1  # under 0: the one, stronger, warning
    # over fewer positions (a 3-token prompt): a low FVE is not judged, only said to say little
    few = _warnings(_health(fve=-0.46, l0=(8, 8, 8)))
    assert len(few) == 1 and "over 3 positions says little" in few[0] and "does not fit" not in few[0]
    assert _warnings(_health(fve=0.9, l0=(8, 8))) == []


def test_the_sae_benchmark_defaults_to_this_python_not_a_path_on_one_machine():
    import importlib.util

    path = Path(__file__).parents[1] / "benchmarks" / "train_sae_smollm2.py"
    spec = importlib.util.spec_from_file_location("train_sae_smollm2", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.parser().parse_args([]).sae_python == sys.executable


def test_fit_sae_leaves_the_global_rng_as_it_was(tiny_model_dir, corpus, tmp_path):
    # A served fit-sae runs in the server's process: its --seed must not reseed (or advance) the RNG that later
    # commands there (and an API caller's own code) draw from.
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    result = fit(tiny_model_dir("gpt2"), corpus, tmp_path / "sae", "--epochs", "1")
    assert result.exit_code == 0, result.output
    assert torch.equal(torch.random.get_rng_state(), before)


def _files(folder):
    return {f.relative_to(folder).as_posix(): f.read_bytes() for f in sorted(folder.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("transcoder", [False, True])
def test_two_blocks_in_one_pass_write_the_files_of_two_single_block_runs(tiny_model_dir, tiny_lm, corpus, tmp_path,
                                                                          monkeypatch, cached_load, transcoder):
    """`--layer 0,1`: the corpus is forwarded once for both blocks (as many forwards as a one-block run), and each
    block's files are byte for byte those of a run of that block alone with the same seed: the hooks only read,
    so the activations are the same floats, and each block's coder and shuffle start from --seed. The held-out
    check runs the window's clean forward once for both blocks (then two spliced forwards per block), and its
    figures equal, float for float, those of a splice that runs its own clean forward (as before issue 62)."""
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks import fit_sae as task
    from anatomy_cli.tasks.session import open_model

    model = tiny_model_dir("gpt2")
    more = ["--max-tokens", "320", "--epochs", "2", *(["--transcoder"] if transcoder else [])]
    forwards, checks = [], []
    real, check = sae_fit.forward, engine_sae.forward
    monkeypatch.setattr(sae_fit, "forward", lambda lm, ids: forwards.append(ids.shape) or real(lm, ids))
    monkeypatch.setattr(engine_sae, "forward", lambda lm, ids: checks.append(ids.shape) or check(lm, ids))
    both = fit(model, corpus, tmp_path / "both", *more, layer="0,1")
    assert both.exit_code == 0, both.output
    n_both = len(forwards)
    assert len(checks) == 1 + 2 * 2
    singles = {}
    for layer in (0, 1):
        forwards.clear()
        checks.clear()
        one = fit(model, corpus, tmp_path / f"one{layer}", *more, layer=str(layer))
        assert one.exit_code == 0, one.output
        assert len(forwards) == n_both > 0  # one pass over the corpus, whatever the number of blocks
        assert len(checks) == 3
        singles[layer] = json.loads(one.stdout)["blocks"][0]
        singles.update(_files(tmp_path / f"one{layer}"))
    written = _files(tmp_path / "both")
    suffix = ".mlp" if transcoder else ""
    assert sorted(written) == [f"layers.{i}{suffix}/{f}" for i in (0, 1)
                               for f in ("anatomy-fit.json", "cfg.json", "sae.safetensors")]
    assert all(written[name] == singles[name] for name in written)
    rows = json.loads(both.stdout)["blocks"]
    assert [r["layer"] for r in rows] == [0, 1]
    for r in rows:  # the health of each block is what its own run measured on the same held-out window
        measured = ("seconds", "folder")  # the wall time; the folder: the same name under another --out
        assert {k: v for k, v in r.items() if k not in measured} == {
            k: v for k, v in singles[r["layer"]].items() if k not in measured}
    opts = task.FitSaeOptions(corpus=(str(corpus),), layer="0,1", transcoder=transcoder, out=tmp_path / "plan",
                              ctx=32, max_tokens=320)
    held_ids = list(task.check(open_model(ModelSpec(str(model))), opts).windows[-1])
    assert len(held_ids) == json.loads(both.stdout)["held_out_tokens"]
    lm = tiny_lm("gpt2")
    for r in rows:  # the splice with its own clean forward, as before: the same figures, float for float
        sae = read(Path(r["folder"]))
        alone = engine_sae.splice_run(lm, held_ids, engine_sae.Dictionary(sae), skip=sae_fit.SKIPPED)
        assert analysis.health(alone, held_ids[sae_fit.SKIPPED:], sae.stated_l0).to_dict() == r["health"]
    assert "the activations of 4 hook points in one pass" in both.stderr if transcoder else \
        "the activations of 2 hook points in one pass" in both.stderr


def test_layer_all_trains_a_transcoder_per_block_that_circuit_reads(tiny_model_dir, tiny_lm, corpus, tmp_path,
                                                                    cached_load):
    """`--layer all --transcoder` writes layers.0.mlp .. layers.{L-1}.mlp; `anatomy circuit --transcoders DIR`
    computes a graph whose active features are, at every block and position after the first, the positive TopK
    of the written encoder applied to the MLP input that a plain PyTorch hook on transformers' own MLP reads."""
    from safetensors.torch import load_file
    from test_circuit import _stub_pickle

    lm = tiny_lm("gpt2")
    model = tiny_model_dir("gpt2")
    out = tmp_path / "tc"
    trained = fit(model, corpus, out, "--transcoder", "--epochs", "2", "--max-tokens", "320", layer="all")
    assert trained.exit_code == 0, trained.output
    prompt = "The capital of France is"
    graph = tmp_path / "graph.pt"
    # no --model: the one the transcoders record (fit-sae's follow-up line names none)
    result = runner.invoke(app, ["circuit", prompt, "--transcoders", str(out), "--bos",
                                 "--out", str(graph), "--batch-size", "8", "--format", "json"])
    assert result.exit_code == 0, result.output
    assert f"the model: {model.resolve()} (as the dictionary's metadata names it" in result.stderr
    import anatomy_cli as anatomy  # the API left without a model: the same rule (tasks/recorded_model.py)

    bos = anatomy.PromptOptions(bos=True)
    bare, named = (anatomy.circuit(m, prompt, transcoders=str(out), estimate=True, prompts=bos).to_dict()
                   for m in (None, str(model.resolve())))
    assert bare == named and bare["model"] == str(model.resolve())
    g = torch.load(graph, weights_only=False, pickle_module=_stub_pickle())
    ids = g["input_tokens"][None]
    seen = {}
    hf = lm.model
    handles = [hf.transformer.h[i].mlp.register_forward_pre_hook(
        lambda m, args, i=i: seen.__setitem__(i, args[0][0].detach())) for i in range(lm.n_layers)]
    try:
        with torch.no_grad():
            hf(ids)
    finally:
        for h in handles:
            h.remove()
    want = set()
    for layer in range(lm.n_layers):
        w = load_file(str(out / f"layers.{layer}.mlp" / "sae.safetensors"))
        acts, idx = torch.relu(seen[layer] @ w["encoder.weight"].T + w["encoder.bias"]).topk(4, dim=-1)
        want |= {(layer, p, int(f)) for p in range(1, ids.shape[1]) for a, f in zip(acts[p], idx[p]) if a > 0}
    assert {tuple(int(v) for v in row) for row in g["active_features"]} == want and want
    assert json.loads(result.stdout)["paths"]


@pytest.mark.parametrize("layer, blocks", [("all", [0, 1]), (("1", "0"), [0, 1]), ([1, 0, 1], [0, 1]), (-1, [1]),
                                           ("0-1", [0, 1])])
def test_the_blocks_are_read_as_every_block_list_is_before_the_weights_load(tiny_model_dir, corpus, tmp_path,
                                                                            layer, blocks):
    """`--layer all`, a repeated `--layer` (the CLI's tuple), an API list, a negative block, a range: the plan's
    blocks in order without repeats, each with its sparsify folder and hook points; block 2 of 2 is refused."""
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks import fit_sae as task
    from anatomy_cli.tasks.session import open_model

    opened = open_model(ModelSpec(str(tiny_model_dir("gpt2"))))
    opts = task.FitSaeOptions(corpus=(str(corpus),), layer=layer, transcoder=True, out=tmp_path / "o", ctx=32)
    plan = task.check(opened, opts)
    assert [b.layer for b in plan.blocks] == blocks
    assert [(b.folder.name, b.points) for b in plan.blocks] == [
        (f"layers.{b}.mlp", (f"blocks.{b}.mlp.hook_in", f"blocks.{b}.hook_mlp_out")) for b in blocks]
    with pytest.raises(UsageError, match="--layer 2 is out of range"):
        task.check(opened, task.FitSaeOptions(corpus=(str(corpus),), layer="0,2", out=tmp_path / "o", ctx=32))


def test_a_busy_machine_fits_with_one_thread_and_gets_its_threads_back(monkeypatch):
    """engine/threads.py machine_threads: one intra-op thread where the 1-minute load average is at or over the CPUs
    (OpenMP's threads would wait for each other at every op), torch's own count otherwise; restored after the
    block. tasks/session.py busy_threads (fit-sae, fit-lens, circuit, explain) says so in one line, once when
    nested."""
    before = torch.get_num_threads()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(os, "getloadavg", lambda: (2.0, 0.0, 0.0))
        with machine_threads() as threads:
            assert (threads, torch.get_num_threads()) == (1, 1)
        assert torch.get_num_threads() == 2
        collected = notes.Collected()
        with notes.using_notes(collected), busy_threads("fit-sae"), busy_threads("inner"):
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2 and collected.infos == [
            "fit-sae: the machine is busy (load average at or over its CPUs): 1 thread, not 2 (they would wait "
            "for each other at every op)"]
        monkeypatch.setattr(os, "getloadavg", lambda: (1.5, 9.0, 9.0))
        with machine_threads() as threads:
            assert (threads, torch.get_num_threads()) == (2, 2)
    finally:
        torch.set_num_threads(before)


def typical_rms(rows: torch.Tensor) -> float:
    """By hand: the lower median over the rows of each row's root mean square (``sae_fit.typical_rms``)."""
    per_row = sorted(float(r.pow(2).mean()) ** 0.5 for r in rows)
    return per_row[(len(per_row) - 1) // 2]


def test_a_transcoder_trained_at_unit_scale_is_written_in_the_activations_units():
    """fit-sae trains a TopK transcoder on x / s(x) and target / s(target) (s the typical row's RMS) and folds the
    scales into the weights: the folded coder on the raw input gives the scaled coder's output times s(target), by
    hand (the TopK of relu(W x / sx + b), decoded, times sy); an SAE is not scaled (a JumpReLU transcoder is:
    tests/test_fit_jumprelu.py)."""
    torch.manual_seed(0)
    x, t = 0.1 * torch.randn(40, 8), 3 * torch.randn(40, 8) + 1
    coder = sae_fit.TopKCoder(8, 16, 3, transcode=True)
    coder.W_dec.data = torch.randn(16, 8)  # a trained decoder (it starts at zero)
    sx, sy = sae_fit.unit_scales(coder, x, t)
    assert sx == pytest.approx(typical_rms(x)) and sy == pytest.approx(typical_rms(t))
    w, b, w_dec, b_dec = (p.detach().clone() for p in (coder.encoder.weight, coder.encoder.bias, coder.W_dec,
                                                       coder.b_dec))
    pre = torch.relu(x / sx @ w.T + b)
    top = pre.topk(3, dim=-1)
    by_hand = (torch.zeros_like(pre).scatter(1, top.indices, top.values) @ w_dec + b_dec) * sy
    sae_fit.fold_scales(coder, sx, sy)
    with torch.no_grad():
        assert torch.allclose(coder(x), by_hand, rtol=1e-5, atol=1e-5)
    assert sae_fit.unit_scales(sae_fit.TopKCoder(8, 16, 3), x, x) == (1.0, 1.0)


def test_a_few_massive_rows_do_not_set_a_transcoders_unit():
    """SmolLM2's block 11: twenty attention-sink rows of 31,500 (MLP outputs of norm up to 29,000 against a median
    of 30) held 99.6% of the variance, so the RMS of every entry made the other targets 18 times smaller at unit
    scale and 67% of the features died. The unit is the typical row's RMS: two rows 10,000 times larger move it by one
    row's rank, where the RMS of every entry grows about 1,400-fold."""
    gen = torch.Generator().manual_seed(3)
    t = torch.randn(100, 16, generator=gen)
    massive = torch.cat([t, 1e4 * torch.randn(2, 16, generator=gen)])
    coder = sae_fit.TopKCoder(16, 32, 4, transcode=True)
    plain, _ = sae_fit.unit_scales(coder, t, t)
    with_sinks, _ = sae_fit.unit_scales(coder, massive, massive)
    assert with_sinks == pytest.approx(typical_rms(massive))
    assert with_sinks == pytest.approx(plain, rel=0.05)
    assert float((massive ** 2).mean().sqrt()) > 100 * with_sinks


def test_a_fit_names_the_model_so_that_features_opens_it_from_anywhere(tiny_model_dir, corpus, tmp_path,
                                                                              monkeypatch, cached_load):
    """A new user's JumpReLU fit named its model `SmolLM2-135M-Instruct.Q4_1` (the file's stem, which resolves to
    nothing) and a TopK fit named none, so `features` without --model fell back to the default model. Both now
    record the spec as it resolves from any folder (models/resolve.py ``recorded``): a relative path made absolute,
    a packaged name as given; `features` run elsewhere without --model opens that model."""
    from anatomy_cli.models.resolve import recorded
    from anatomy_cli.models.resolve import resolve

    model = tiny_model_dir("gpt2")
    monkeypatch.chdir(model.parent)
    given = f"./{model.name}"
    assert recorded("smollm2") == "smollm2" and recorded(given) == str(model.resolve())
    assert resolve(recorded("smollm2")).ref == resolve("smollm2").ref
    out = tmp_path / "jumprelu"  # TopK's: the first test of this module
    result = fit(given, corpus, out, "--epochs", "1", "--max-tokens", "96", "--activation", "jumprelu", layer="0")
    assert result.exit_code == 0, result.output
    cfg = json.loads((out / "layers.0" / "cfg.json").read_text())
    assert cfg["model_name"] == read(out / "layers.0").model_name == str(model.resolve())
    monkeypatch.chdir(tmp_path)  # elsewhere: the relative spec would name nothing here
    assert cfg["context_size"] == read(out / "layers.0").context_size == 32  # the fit's --ctx
    feats = runner.invoke(app, ["features", str(tmp_path / "jumprelu" / "layers.0"), "--corpus", str(corpus),
                                "--max-tokens", "64", "--format", "json"])  # no --ctx: the fit's 32, not 512
    assert feats.exit_code == 0, feats.output
    assert json.loads(feats.stdout)["model"] == str(model.resolve())
    assert json.loads(feats.stdout)["ctx"] == 32
    assert f"the model: {model.resolve()} (as the dictionary's metadata names it" in feats.stderr
    # sae, as fit-sae's follow-up line gives it (no --model): the recorded model, read as with --model
    args = ["sae", "The cat sat on the mat", "--sae", str(out / "layers.0"), "--format", "json"]
    bare, named = runner.invoke(app, args), runner.invoke(app, [*args, "--model", str(model.resolve())])
    assert bare.exit_code == named.exit_code == 0, bare.output
    assert f"the model: {model.resolve()} (as the dictionary's metadata names it" in bare.stderr
    assert json.loads(bare.stdout) == json.loads(named.stdout) and json.loads(bare.stdout)["model"] == str(model)


def test_several_blocks_warnings_are_one_line_and_one_block_s_each_its_own():
    """`fit-sae --layer all` printed two or three lines per block (~60 on SmolLM2); now one line names the blocks
    too weak to read and the blocks with other warnings, whose text the JSON and each anatomy-fit.json keep."""
    from anatomy_cli.tasks._fit_sae_block import BlockFit
    from anatomy_cli.tasks.fit_sae import clt_splice_note
    from anatomy_cli.tasks.fit_sae import fit_notes

    def block(layer, fve, *warnings):
        return BlockFit(layer=layer, folder="f", site="s", site_out="s", d_in=4, d_sae=8, steps=1, fvu_first=1.0,
                        fvu_last=1.0, dead_fraction=0.0, seconds=0.0, health={"fve": fve}, warnings=warnings)

    fits = [block(0, 0.2, "FVE low", "KL high"), block(1, 0.9), block(2, 0.45, "FVE low"), block(3, 0.8, "KL high")]
    opts = SimpleNamespace(transcoder=True, clt=False)  # what fit_notes reads of the options
    collected = notes.Collected()
    with notes.using_notes(collected):
        fit_notes(opts, fits, 8)
    weak = [f.layer for f in fits if analysis.too_weak(f.health["fve"], 8)]
    assert weak == [0, 2] and len(collected.warnings) == 1
    line = collected.warnings[0]
    assert "2 of 4 transcoders too weak to read (held-out FVE under 0.5: blocks 0,2)" in line
    assert "4 warnings on blocks 0,2-3" in line and "anatomy-fit.json" in line
    one = notes.Collected()
    with notes.using_notes(one):
        fit_notes(opts, fits[:1], 8)
    assert one.warnings[:2] == ["block 0: FVE low", "block 0: KL high"] and "1 of 1 transcoders" in one.warnings[2]
    clt = notes.Collected()  # a CLT's splice is every block's at once: one word for the whole, not per block
    splice = {"ce_clean_nats": 3.18, "ce_spliced_nats": 11.9, "kl_spliced_nats": 9.8}
    with notes.using_notes(clt):
        fit_notes(SimpleNamespace(transcoder=True, clt=True), [block(b, 0.9) for b in range(3)], 8)
    assert clt.warnings == []  # no figures (their health lacks them): nothing said
    for f, kl in ((block(0, 0.9), 9.8), (block(0, 0.9), 0.7)):
        f.health.update(splice, kl_spliced_nats=kl)
        said = notes.Collected()
        with notes.using_notes(said):
            fit_notes(SimpleNamespace(transcoder=True, clt=True), [f, f], 8)
        assert bool(said.warnings) is (kl > analysis.KL_HIGH_NATS)
    assert "KL 9.80 nats (over 1; CE 3.18 -> 11.90)" in clt_splice_note(splice)[0]
    short = notes.Collected()  # a held-out window of 7 positions: its FVEs say little, none is judged too weak
    with notes.using_notes(short):
        fit_notes(opts, fits, MIN_ROWS - 1)
    assert [analysis.too_weak(f.health["fve"], MIN_ROWS - 1) for f in fits] == [False] * 4
    assert len(short.warnings) == 1 and "too weak" not in short.warnings[0] and "4 warnings" in short.warnings[0]


def test_collect_writes_each_batch_in_place_equal_to_plain_hooks(tiny_lm):
    """``collect`` copies each batch's rows into one tensor per point (issue 62: no pieces joined after, half the
    peak): the rows equal what PyTorch hooks on transformers' own MLP read and write, window by window, each
    window's first position left out (issue 62: the attention sink is no row), with windows of two lengths (two
    batches of 2, then a shorter one alone). Each forward stops once both points are read: the final norm never
    runs."""
    from anatomy_cli.models import sites

    lm = tiny_lm("llama")
    wins = [[1, 5, 9, 22, 7], [3, 14, 30, 2, 8], [4, 4, 6, 10, 11], [12, 13], [9, 9, 9]]
    points = [sites.hook_name(1, sites.Site.mlp_in), sites.hook_name(0, sites.Site.mlp_out)]
    ran = []
    head = lm.model.model.norm.register_forward_hook(lambda m, args, out: ran.append(1))
    try:
        x, y = sae_fit.collect(lm, wins, points, batch=2)
    finally:
        head.remove()
    assert ran == []
    layers, seen = lm.model.model.layers, {}
    hooks = [layers[1].mlp.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0][0])),
             layers[0].mlp.register_forward_hook(lambda m, args, out: seen.__setitem__("y", out[0]))]
    want_x, want_y = [], []
    try:
        with torch.no_grad():
            for w in wins:
                lm.model(torch.tensor([w]))
                want_x.append(seen["x"][1:])
                want_y.append(seen["y"][1:])
    finally:
        for h in hooks:
            h.remove()
    assert x.shape == (sum(len(w) - 1 for w in wins), lm.info.d_model) == (sae_fit.rows(wins), lm.info.d_model)
    assert x.dtype == torch.float32
    torch.testing.assert_close(x, torch.cat(want_x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y, torch.cat(want_y), rtol=1e-5, atol=1e-6)


def test_a_huge_first_position_sets_no_unit_scale(tiny_lm):
    """Issue 62: one window's first position carrying a huge activation (x1000, SmolLM2's attention sink) is no
    row, so a transcoder's unit scales are those of the other rows, computed here by hand from plain hooks (the
    root mean square of every entry of positions 1..)."""
    from anatomy_cli.models import sites

    lm = tiny_lm("llama")
    wins = [[1, 5, 9, 22, 7], [3, 14, 30, 2, 8]]
    points = [sites.hook_name(1, sites.Site.mlp_in), sites.hook_name(1, sites.Site.mlp_out)]
    mlp, calls = lm.model.model.layers[1].mlp, [0]

    def huge(m, args, out):  # the first window's first position x1000 (each pass runs window 0, then window 1)
        out = out.clone()
        if calls[0] % 2 == 0:
            out[0, 0] *= 1000
        calls[0] += 1
        return out

    handle = mlp.register_forward_hook(huge)
    try:
        x, y = sae_fit.collect(lm, wins, points, batch=1)
        ins, outs = [], []
        pre = mlp.register_forward_pre_hook(lambda m, args: ins.append(args[0][0]))
        post = mlp.register_forward_hook(lambda m, args, out: outs.append(out[0]))
        try:
            with torch.no_grad():
                for w in wins:
                    lm.model(torch.tensor([w]))
        finally:
            pre.remove()
            post.remove()
        plain = list(zip(ins, outs))
    finally:
        handle.remove()
    assert float(plain[0][1][0].abs().max()) > 100 * float(plain[0][1][1:].abs().max())  # the huge one is there
    rows_x = torch.cat([a[1:] for a, _ in plain])
    rows_y = torch.cat([b[1:] for _, b in plain])
    want = (typical_rms(rows_x), typical_rms(rows_y))
    coder = sae_fit.TopKCoder(x.shape[1], 16, 2, transcode=True)
    assert sae_fit.unit_scales(coder, x, y) == pytest.approx(want, rel=1e-5)


def test_one_epoch_is_said_in_the_singular(tiny_model_dir, corpus, tmp_path):
    """A new user read `512 tokens x 1 epochs` on the text view's heading (the cost line said `1 epoch`): the view
    counts its epochs as the cost line does; its steps per block are one epoch's, ceil(train rows / batch)."""
    result = fit(tiny_model_dir("gpt2"), corpus, tmp_path / "sae", "--epochs", "1", "--format", "table")
    assert result.exit_code == 0, result.output
    said = " ".join(result.stdout.split())
    steps = int(re.search(r"x 1 epoch \((\d+) steps? per block", said).group(1))
    rows = int(re.search(r"wrote .*?; ([\d,]+) tokens x", said).group(1).replace(",", ""))
    assert "epochs" not in said and steps == -(-rows // 64), said


def test_a_batch_under_8_rows_is_refused(tiny_model_dir, tmp_path, monkeypatch):
    """A new user's --batch-size 1 trained on a loss of 4e32 (every batch one row: no variance around its own mean)
    and exited 0: --batch-size's least is the 8 rows a batch's FVU needs (declare.shared.MIN_ROWS, the tail rule's
    and the judged FVE's bound), refused as a usage error before any weight loads; 8 passes that check."""
    from anatomy_cli.tasks import session

    monkeypatch.setattr(session, "load_weights", lambda *a, **k: pytest.fail("weights loaded"))
    corpus = tmp_path / "c.txt"
    corpus.write_text("The cat sat on the mat. " * 8)
    for batch in (1, 7):
        result = runner.invoke(app, ["fit-sae", str(corpus), "--model", str(tiny_model_dir("llama")), "--layer", "1",
                                     "--out", str(tmp_path / "o"), "--batch-size", str(batch)])
        assert result.exit_code == 2 and "--batch-size" in result.stderr and "at least 8" in result.stderr, \
            result.output
