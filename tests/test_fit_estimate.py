"""The fits' estimates cover every phase of the run (issue 61, item 4): `fit-sae`, `fit-lens tuned` and
`fit-lens jacobian` print an estimate made of probes of their own phases (anatomy_cli/engine/estimate.py), then
record what each phase took.

No timing is asserted: the clock the estimates and the runs read is replaced by a fake one that only moves when
the phases' own work functions run (one fake second per token of a forward, per training step, per backward
pass), so the estimate of each phase must equal what the run then took, exactly, if and only if every phase's work
is probed and scaled to the whole run. Before the fix fit-sae counted FLOPs at a product's rate (no phase, the
held-out check and the training's own overheads left out) and fit-lens tuned assumed a rate.
"""

from __future__ import annotations

import pytest

import anatomy_cli as api


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine import estimate
    from anatomy_cli.engine import sae_fit
    from anatomy_cli.tasks import _jacobian_run
    from anatomy_cli.tasks import _tuned_fit
    from anatomy_cli.tasks import session

    fake = FakeClock()
    for module in (estimate, clt_fit, sae_fit, _jacobian_run, _tuned_fit, session):  # where `now` is read
        monkeypatch.setattr(module, "now", fake)
    return fake


@pytest.fixture
def slow_check(monkeypatch, clock):
    """A lens's held-out check costs one fake second per token of the text it is run on."""
    from anatomy_cli.analyses import lens_check
    from anatomy_cli.tasks import _lens_check

    real = lens_check.compare

    def compare(resid, lens, unembed):
        clock.t += resid.shape[1]
        return real(resid, lens, unembed)

    monkeypatch.setattr(_lens_check, "compare", compare)  # where the fits read it


def _phases_match(timings: dict) -> None:
    assert timings["phases"], timings
    for row in timings["phases"]:
        assert row["seconds"] == pytest.approx(row["estimated_seconds"], rel=1e-9, abs=1e-9), row
    assert timings["seconds"] == pytest.approx(timings["estimated_seconds"], rel=1e-9)


def _corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(" ".join(f"The quick brown fox number {i} jumps over the lazy dog again." for i in range(60)))
    return path


def _slow_sae_fit(monkeypatch, clock):
    """fit-sae's work costs fake seconds: a second per token of a collecting forward and of each held-out forward
    (one clean, two per block spliced), per training step (a cross-layer one too); returns the windows each collecting pass read."""
    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine import sae as engine_sae
    from anatomy_cli.engine import sae_fit

    collect, train, held_out_forward, clt_step = sae_fit.collect, sae_fit.train, engine_sae.forward, clt_fit.step
    passes = []

    def slow_collect(lm, windows, points, **kw):
        clock.t += sum(map(len, windows))  # a forward: a second per token
        passes.append(len(windows))
        return collect(lm, windows, points, **kw)

    def slow_train(x, target, coder, *, progress=None, **kw):
        def step(i, n):
            clock.t += 1.0  # a training step: a second
            if progress is not None:
                progress(i, n)
        return train(x, target, coder, progress=step, **kw)

    def slow_forward(lm, ids, **kw):  # each forward of the held-out check (one clean, two per block spliced)
        clock.t += ids.numel()
        return held_out_forward(lm, ids, **kw)

    monkeypatch.setattr(sae_fit, "collect", slow_collect)
    monkeypatch.setattr(sae_fit, "train", slow_train)
    def slow_clt_step(*args, **kw):  # a cross-layer training step: a second too
        clock.t += 1.0
        return clt_step(*args, **kw)

    monkeypatch.setattr(engine_sae, "forward", slow_forward)
    monkeypatch.setattr(clt_fit, "step", slow_clt_step)
    return passes


@pytest.mark.parametrize("transcoder", [False, True])
def test_fit_sae_estimates_every_phase_it_runs(tiny_lm, tmp_path, monkeypatch, clock, transcoder):
    _slow_sae_fit(monkeypatch, clock)
    lm = tiny_lm("gpt2")
    r = api.fit_sae(lm, _corpus(tmp_path), layer="0-1", out=tmp_path / "sae", ctx=16, max_tokens=160,
                    epochs=1, batch_size=256, d_sae=32, k=4, transcoder=transcoder)
    timings = r.data["timings"]
    assert {p["phase"] for p in timings["phases"]} >= {"collecting activations", "training",
                                                       "writing and the held-out check", "loading the weights"}
    _phases_match(timings)
    assert r.data["cost"]["seconds"] == pytest.approx(timings["estimated_seconds"])
    # one batch of every row (9 windows of 15 rows): one step, said in the singular (a trial read "1 steps")
    from anatomy_cli.output.views import fit_sae as view

    assert r.data["blocks"][0]["steps"] == -(-r.data["cost"]["rows"] // 256) == 1
    assert "x 1 epoch (1 step per block," in view.report(lm, r.result).heading[1]


@pytest.mark.parametrize("more", [(), ("--transcoder", "--clt")])
def test_fit_sae_estimate_is_the_cost_a_run_prints_first_and_writes_nothing(tiny_model_dir, tmp_path, monkeypatch,
                                                                            clock, more):
    """Issue 62: `fit-sae --estimate` prints the cost as its result (stdout, exit 0) and stops: its figures are
    those the run of the same command line prints first (the fake clock makes both runs' probes read alike), its
    one collecting forward is the probe's (one window), and --out is not made."""
    import json

    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app

    passes = _slow_sae_fit(monkeypatch, clock)
    out = tmp_path / "sae"
    argv = ["fit-sae", str(_corpus(tmp_path)), "--model", str(tiny_model_dir("llama")), "--out", str(out),
            "--layer", "all" if "--clt" in more else "0-1", "--ctx", "16", "--max-tokens", "64", "--epochs", "1",
            "--batch-size", "32", "--d-sae", "16", "--k", "4", "--format", "json", *more]
    runner = CliRunner()
    said = runner.invoke(app, [*argv, "--estimate"])
    assert said.exit_code == 0, said.output
    assert not out.exists() and passes == [1]
    estimate = json.loads(said.stdout)
    assert "fit-sae: a TopK" not in said.stderr  # the cost is the result, not a line on stderr too
    run = runner.invoke(app, argv)
    assert run.exit_code == 0, run.output
    fitted = json.loads(run.stdout)
    assert estimate["estimate"] is True and estimate["out"] == fitted["out"] == str(out)
    assert estimate["cost"] == fitted["cost"] and estimate["phases"] == fitted["cost"]["phases"]
    assert estimate["line"] in run.stderr.splitlines()
    assert estimate["cost"]["tokens"] == fitted["tokens"] and estimate["cost"]["blocks"] == len(fitted["blocks"])
    training = [next(p["seconds"] for p in phases if p["phase"] == "training")
                for phases in (estimate["phases"], fitted["timings"]["phases"])]
    assert training[0] == pytest.approx(training[1]) and training[0] > 0


def test_fit_sae_clt_estimates_its_thresholds_and_files(tiny_lm, tmp_path, monkeypatch, clock):
    """Issue 62: a 30-block CLT's writing phase took 152 s where the cost line counted its held-out forward alone
    (1.6 s). Here each part of the phase costs a known number of fake seconds (a second per token of each
    forward, per block and training row of the thresholds, per thousand parameters written, per ten thousand
    parameters and held-out rows read back): the phase's estimate is that hand count, and what the run took."""
    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine import sae_fit

    collect, step, chosen = sae_fit.collect, clt_fit.step, clt_fit.thresholds
    save, held_out, spliced = clt_fit.save, clt_fit.held_out, clt_fit.spliced_logits

    def params(coder):
        return clt_fit.parameter_count(coder.n_layers, coder.d, coder.d_sae)

    def charged(real, cost):
        def fn(*args, **kw):
            clock.t += cost(*args)
            return real(*args, **kw)
        return fn

    monkeypatch.setattr(sae_fit, "collect", charged(collect, lambda lm, windows, points: sum(map(len, windows))))
    monkeypatch.setattr(clt_fit, "step", charged(step, lambda *a: 1.0))
    monkeypatch.setattr(clt_fit, "thresholds", charged(chosen, lambda coder, xs: xs.shape[0] * xs.shape[1]))
    monkeypatch.setattr(clt_fit, "save", charged(save, lambda coder, theta, folder: params(coder) / 1e3))
    monkeypatch.setattr(clt_fit, "held_out", charged(held_out, lambda coder, xs, t, theta: params(coder)
                                                     * xs.shape[1] / 1e4))
    monkeypatch.setattr(clt_fit, "spliced_logits", charged(spliced, lambda lm, ids, *a: 2 * len(ids)))
    lm = tiny_lm("llama")
    r = api.fit_sae(lm, _corpus(tmp_path), layer="all", transcoder=True, clt=True, out=tmp_path / "clt", ctx=16,
                    max_tokens=64, epochs=1, batch_size=32, d_sae=16, k=4)
    timings = r.data["timings"]
    _phases_match(timings)
    n, d, held = lm.n_layers, lm.info.d_model, r.data["held_out_tokens"]
    rows = r.data["cost"]["rows"]
    hand = 2 * held + n * rows + clt_fit.parameter_count(n, d, 16) * (1 / 1e3 + (held - 1) / 1e4)
    phase = next(p for p in timings["phases"] if p["phase"] == "writing and the held-out check")
    assert phase["estimated_seconds"] == pytest.approx(hand, rel=1e-9)


def test_fit_lens_tuned_estimates_every_phase_it_runs(tiny_lm, tmp_path, monkeypatch, clock, slow_check):
    from anatomy_cli.engine import tuned_fit

    backward, step = tuned_fit.window_backward, tuned_fit.step

    def slow_backward(lm, lens, ids, scale):
        clock.t += len(ids)
        return backward(lm, lens, ids, scale)

    def slow_step(*args):
        clock.t += 1.0
        return step(*args)

    monkeypatch.setattr(tuned_fit, "window_backward", slow_backward)
    monkeypatch.setattr(tuned_fit, "step", slow_step)
    r = api.fit_lens(tiny_lm("llama"), "tuned", corpus=_corpus(tmp_path), tokens=200, ctx=32, steps=3,
                     out=tmp_path / "tuned")
    assert {p["phase"] for p in r.data["timings"]["phases"]} >= {"training", "writing and the held-out check"}
    _phases_match(r.data["timings"])


def test_fit_lens_jacobian_estimates_every_phase_it_runs(tiny_lm, tmp_path, monkeypatch, clock, slow_check):
    from anatomy_cli.engine import jacobian_fit

    real = jacobian_fit.jacobian_for_prompt

    def slow_jacobian(lm, ids, *args, progress=None, **kw):
        clock.t += 5 * len(ids)  # the forward: five seconds per token; each backward pass: one

        def tick(done, total):
            clock.t += len(ids)
            if progress is not None:
                progress(done, total)
        return real(lm, ids, *args, progress=tick, **kw)

    monkeypatch.setattr(jacobian_fit, "jacobian_for_prompt", slow_jacobian)
    texts = ["The quick brown fox jumps over the lazy dog because it was tired of running",
             "Once upon a time there was a small village at the edge of a dark forest near the sea", "short"]
    r = api.fit_lens(tiny_lm("llama"), "jacobian", texts, out=tmp_path / "j.pt", skip_first=4, dim_batch=8)
    assert {p["phase"] for p in r.data["timings"]["phases"]} >= {"fitting", "writing and the held-out check"}
    _phases_match(r.data["timings"])


def test_a_phase_the_estimate_did_not_count_is_refused():
    from anatomy_cli.engine.estimate import Estimate
    from anatomy_cli.engine.estimate import Phase

    timings = Estimate((Phase("training", 1.0),)).timings()
    with timings.phase("training"):
        pass
    with pytest.raises(ValueError, match="not in the estimate"):
        with timings.phase("an uncounted phase"):
            pass
