"""`anatomy fit-lens tuned` (issue 48): tuned-lens' recipe against hand computations on a tiny random LLaMA: the
windows cut by hand from the tokenizer's ids, transformers' own ``hidden_states`` and logits, a hand-written RMSNorm
and LM head, the KL written out, autograd for the gradient and the SGD/Nesterov update written by hand; the files
read by tuned-lens 0.2.0's own ``TunedLens.from_model_and_pretrained``."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app

runner = CliRunner()
D, LAYERS = 32, 2
TEXT = ("The quick brown fox jumps over the lazy dog because it was tired of running in the sun all day. "
        "Once upon a time there was a small village at the edge of a dark forest, and nobody went there at night. "
        "In the beginning the universe was created and this has made a lot of people very angry and been widely "
        "regarded as a bad move. It was the best of times, it was the worst of times, it was the age of wisdom.")
PROMPT = "Thank you very much for the"


def _corpus(tmp_path, text=TEXT):
    path = tmp_path / "corpus.txt"
    path.write_text(text)
    return path


def _windows(lm, text, ctx, tokens):
    """tuned-lens' chunking by hand: EOS, the document's ids, EOS; cut at ``tokens``; windows of ``ctx``."""
    hf = lm.tokenizer.hf
    ids = ([hf.eos_token_id] + hf(text, add_special_tokens=False)["input_ids"] + [hf.eos_token_id])[:tokens]
    return [ids[i:i + ctx] for i in range(0, len(ids), ctx) if len(ids[i:i + ctx]) >= 2]


def _unembed(lm, h):
    norm = lm.model.model.norm
    x = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
    return x @ lm.model.lm_head.weight.T


def _kls(lm, ids, weights, biases):
    """Per translator i: mean over positions of KL(final ‖ unembed(h_i + A_i h_i + b_i)), h_i transformers'
    ``hidden_states[i]``, the final distribution the model's own logits."""
    with torch.no_grad():
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
    p = out.logits[0].float().log_softmax(-1)
    kls = []
    for i in range(LAYERS):
        h = out.hidden_states[i][0].float()
        q = _unembed(lm, h + h @ weights[i].T + biases[i]).log_softmax(-1)
        kls.append((p.exp() * (p - q)).sum(-1).mean())
    return kls


def _params(out):
    state = torch.load(out / "params.pt", weights_only=True)
    return [state[f"{i}.weight"] for i in range(LAYERS)], [state[f"{i}.bias"] for i in range(LAYERS)]


def test_two_steps_equal_hand_written_sgd_nesterov_steps(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    out = tmp_path / "lens"
    r = api.fit_lens(lm, "tuned", corpus=_corpus(tmp_path), tokens=64, ctx=16, steps=2, out=out)
    wins = _windows(lm, TEXT, 16, 64)
    assert len(wins) == 4 and r.result.windows == 4 and r.result.tokens == 64 and r.result.steps == 2
    order = torch.randperm(4, generator=torch.Generator().manual_seed(42)).tolist()  # the documented shuffle
    params = [torch.zeros(D, D, requires_grad=True) for _ in range(LAYERS)] + [
        torch.zeros(D, requires_grad=True) for _ in range(LAYERS)]
    buf = None
    for s, lr in enumerate((0.1, 0.05)):  # lr 1 · (1 − 0.9), linear to 0 over 2 steps, no warm-up
        batch = [wins[w] for w in order[2 * s:2 * s + 2]]
        loss = sum(sum(_kls(lm, ids, params[:LAYERS], params[LAYERS:])) for ids in batch) / len(batch)
        grads = torch.autograd.grad(loss, params)
        norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
        grads = [g * min(1.0, float(1.0 / (norm + 1e-6))) for g in grads]      # clip the total norm to 1
        with torch.no_grad():
            d = [g + 1e-3 * p for g, p in zip(grads, params)]                   # weight decay 1e-3
            buf = d if buf is None else [0.9 * b + x for b, x in zip(buf, d)]   # momentum 0.9
            for p, x, b in zip(params, d, buf):
                p -= lr * (x + 0.9 * b)                                         # Nesterov
    assert float(norm) < 1.0  # the tiny model's gradients are small: the clip is tested below, on its own
    weights, biases = _params(out)
    for mine, theirs in zip(weights + biases, params):
        torch.testing.assert_close(mine, theirs.detach(), atol=1e-6, rtol=0)
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["num_hidden_layers"], config["bias"], config["lens_type"]) == (
        D, LAYERS, True, "linear_tuned_lens")


def test_the_step_clips_the_total_gradient_norm_to_1(tiny_lm):
    from anatomy_cli.engine import tuned_fit

    lens = tuned_fit.translators(D, LAYERS)
    opt, scheduler = tuned_fit.optimizer(lens, 4)
    g = torch.Generator().manual_seed(0)
    grads = [5 * torch.randn(p.shape, generator=g) for p in lens.parameters()]
    for p, x in zip(lens.parameters(), grads):
        p.grad = x.clone()
    tuned_fit.step(lens, opt, scheduler)
    norm = torch.sqrt(sum(x.pow(2).sum() for x in grads))
    for p, x in zip(lens.parameters(), grads):
        torch.testing.assert_close(p.detach(), -0.1 * 1.9 * x / (norm + 1e-6), atol=1e-7, rtol=0)
        assert float(p.grad.abs().max()) == 0.0                                # zeroed, kept
    assert scheduler.get_last_lr() == pytest.approx([0.1 * 3 / 4])


def test_training_reduces_the_kl_against_the_zero_lens(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    out = tmp_path / "lens"
    text = " ".join([TEXT] * 3)
    r = api.fit_lens(lm, "tuned", corpus=_corpus(tmp_path, text), tokens=256, ctx=32, steps=8, out=out)
    wins = _windows(lm, text, 32, 256)
    assert len(wins) == r.result.windows == 8 and r.result.steps == 8
    weights, biases = _params(out)
    zero = [torch.zeros(D, D)] * LAYERS, [torch.zeros(D)] * LAYERS
    before = torch.stack([torch.stack(_kls(lm, ids, *zero)) for ids in wins]).mean(0)
    after = torch.stack([torch.stack(_kls(lm, ids, weights, biases)) for ids in wins]).mean(0)
    assert (after < 0.9 * before).all(), (before, after)
    assert r.data["translators"][0]["reads"] == "embed" and r.data["translators"][1]["reads"] == 0
    first = torch.randperm(8, generator=torch.Generator().manual_seed(42))[0]  # step 1's window, the zero lens
    reported = torch.tensor([t["kl_first"] for t in r.data["translators"]])
    torch.testing.assert_close(reported, torch.stack(_kls(lm, wins[first], *zero)), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_written_lens_loads_in_tuned_lens_and_reads_as_anatomy_reads_it(tiny_lm, tmp_path, arch):
    lenses = pytest.importorskip("tuned_lens.nn.lenses")
    from anatomy_cli.tasks import notes

    lm = tiny_lm(arch)
    out = tmp_path / "lens"
    api.fit_lens(lm, "tuned", corpus=_corpus(tmp_path), tokens=96, ctx=32, steps=3, out=out)
    theirs = lenses.TunedLens.from_model_and_pretrained(lm.model, str(out))
    weights, biases = _params(out)
    for i, t in enumerate(theirs.layer_translators):
        assert torch.equal(t.weight, weights[i]) and torch.equal(t.bias, biases[i])
    assert theirs.config.unembed_hash == json.loads((out / "config.json").read_text())["unembed_hash"]
    collected = notes.Collected()
    with notes.using_notes(collected):
        r = api.lens(lm, PROMPT, k=3, lens=f"tuned:{out}")
    assert not [w for w in collected.warnings if "too weak" not in w]  # a 3-step lens is said to be too weak
    with torch.no_grad():
        hs = lm.model(torch.tensor([r.data["token_ids"]]), output_hidden_states=True).hidden_states
        rows = [theirs.forward(hs[i][0], i) for i in range(LAYERS)]
        last = lm.model(torch.tensor([r.data["token_ids"]])).logits[0]
    top = torch.topk(torch.log_softmax(torch.stack([*rows, last]).double(), -1), 3, dim=-1)
    assert torch.equal(r.result.top_ids, top.indices)
    torch.testing.assert_close(r.result.top_logprobs, top.values, atol=1e-5, rtol=0)


def test_the_cli_prints_the_cost_and_writes_the_lens(tiny_model_dir, tmp_path):
    out = tmp_path / "cli"
    res = runner.invoke(app, ["fit-lens", "tuned", "--model", str(tiny_model_dir("llama")), "--corpus",
                              str(_corpus(tmp_path)), "--tokens", "64", "--ctx", "32", "--steps", "2", "--out",
                              str(out), "--format", "json"])
    assert res.exit_code == 0, res.output
    assert "fit-lens tuned: 2 windows, 64 tokens, 2 steps, 2 translators: about" in res.output
    assert "timed on this machine now" in res.output and "memory about" in res.output
    data = json.loads(res.stdout[res.stdout.index("{"):])
    assert data["kind"] == "tuned" and data["windows"] == 2 and len(data["translators"]) == LAYERS
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "params.pt"]


def test_bad_input_is_one_line_before_the_weights_load(tiny_model_dir, tmp_path, monkeypatch):
    import anatomy_cli.cli.commands.fit_lens as command

    def no_weights(*a, **k):
        raise AssertionError("the weights were loaded")

    monkeypatch.setattr(command, "load_weights", no_weights)
    model = str(tiny_model_dir("llama"))
    corpus = str(_corpus(tmp_path))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    (tmp_path / "empty").mkdir()
    held = tmp_path / "held"
    held.mkdir()
    (held / "params.pt").write_text("x")
    ok = ["--corpus", corpus, "--tokens", "64", "--out", str(tmp_path / "o")]
    cases = [
        (["--corpus", str(tmp_path / "nope.txt"), "--tokens", "64", "--out", str(tmp_path / "o")],
         "does not exist"),
        (["--corpus", corpus, "--tokens", "0", "--out", str(tmp_path / "o")], "--tokens takes a whole number"),
        (["--corpus", corpus, "--out", str(tmp_path / "o")], "needs --tokens N"),
        (["--tokens", "64", "--out", str(tmp_path / "o")], "needs --corpus PATH"),
        (["--corpus", corpus, "--tokens", "64", "--out", str(a_file)], "is a file; a tuned lens is a directory"),
        (["--corpus", corpus, "--tokens", "64", "--out", str(held)], "holds a lens already"),
        ([*ok, "--dim-batch", "4"], "--dim-batch: for fit-lens jacobian only"),
        ([*ok, "--prompts", corpus], "not prompts"),
        ([*ok, "--steps", "0"], "--steps takes a whole number"),
        ([*ok, "--ctx", "65"], "more than"),
        (["--corpus", str(tmp_path / "empty"), "--tokens", "64", "--out", str(tmp_path / "o")], "no .txt or .md"),
        ([*ok[:-2], "--out", str(tmp_path / "o"), "--model", str(tiny_model_dir("bert"))], "decoder"),
    ]
    for args, message in cases:
        argv = ["fit-lens", "tuned", *(["--model", model] if "--model" not in args else []), *args]
        res = runner.invoke(app, argv)
        assert res.exit_code == 2 and message in res.output, (args, res.output)
        assert len([line for line in res.output.splitlines() if line.strip()]) == 1, res.output
    res = runner.invoke(app, ["fit-lens", "jacobian", "--model", model, "--prompts", corpus, "--out",
                              str(tmp_path / "j.pt"), "--tokens", "5"])
    assert res.exit_code == 2 and "--tokens: for fit-lens tuned only" in res.output, res.output


def test_an_interrupted_fit_resumed_from_its_checkpoint_equals_a_straight_run(tiny_lm, tiny_model_dir, tmp_path,
                                                                              monkeypatch):
    """Six steps straight, against: interrupted before step 4 (the checkpoint, every 2 steps, holds step 2), then
    resumed (step 3 run again from the saved translators, momentum and schedule): the same translators, bit for
    bit, and the same KLs. A resume with other settings is refused in one line."""
    from anatomy_cli.engine import tuned_fit
    from anatomy_cli.errors import UsageError

    lm = tiny_lm("llama")
    corpus = _corpus(tmp_path, " ".join([TEXT] * 2))
    kw = dict(corpus=corpus, tokens=192, ctx=16, steps=6)
    straight = api.fit_lens(lm, "tuned", out=tmp_path / "straight", **kw)
    real, calls = tuned_fit.step, []

    def dies_before_the_fourth(*args, **kwargs):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    ckpt = tmp_path / "tuned.ckpt"
    monkeypatch.setattr(tuned_fit, "step", dies_before_the_fourth)
    with pytest.raises(KeyboardInterrupt):
        api.fit_lens(lm, "tuned", out=tmp_path / "resumed", checkpoint=ckpt, checkpoint_every=2, **kw)
    state = torch.load(ckpt, weights_only=True)
    assert state["step"] == 2 and not (tmp_path / "resumed").exists()
    assert sorted(state) == ["kl_first", "kl_last", "optimizer", "scheduler", "settings", "step", "translators"]
    assert state["scheduler"]["last_epoch"] == 2 and len(state["optimizer"]["state"]) == 2 * LAYERS  # momentum
    monkeypatch.setattr(tuned_fit, "step", real)
    resumed = api.fit_lens(lm, "tuned", out=tmp_path / "resumed", checkpoint=ckpt, checkpoint_every=2, **kw)
    for mine, theirs in zip(*(_params(tmp_path / d) for d in ("resumed", "straight"))):
        for a, b in zip(mine, theirs):
            assert torch.equal(a, b)
    assert resumed.data["translators"] == straight.data["translators"]
    assert torch.load(ckpt, weights_only=True)["step"] == 6  # the last step is saved too
    with pytest.raises(UsageError, match="other settings \\(seed\\)"):
        api.fit_lens(lm, "tuned", out=tmp_path / "other", checkpoint=ckpt, **{**kw, "seed": 7})
    res = runner.invoke(app, ["fit-lens", "tuned", "--model", str(tiny_model_dir("llama")), "--corpus", str(corpus),
                              "--tokens", "192", "--ctx", "16", "--steps", "5", "--out", str(tmp_path / "other"),
                              "--checkpoint", str(ckpt)])
    assert res.exit_code == 2 and "other settings (steps)" in res.output, res.output
    assert len([line for line in res.output.splitlines() if line.strip().startswith("error")]) == 1, res.output
