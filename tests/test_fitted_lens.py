"""Fitted lenses read by `lens --lens` (issue 48): the Jacobian lens (jlens' file) and the tuned lens (tuned-lens'
directory), against independent computations on a tiny random LLaMA: transformers' own ``hidden_states``, a
hand-written RMSNorm and LM head, and tuned-lens 0.2.0's own ``TunedLens`` where it is installed."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

runner = CliRunner()
PROMPT = "Thank you very much for the"
D, LAYERS = 32, 2  # tests/models.py's tiny width and depth


def _hidden_states(lm, ids):
    """transformers' own residual stream: ``hidden_states`` [L + 1, pos, d], the last one raw (the final norm
    hook-free: the last block's output is read from a forward hook on the last decoder layer)."""
    model = lm.model
    out: dict[str, torch.Tensor] = {}
    handle = model.model.layers[-1].register_forward_hook(
        lambda m, i, o: out.__setitem__("last", (o[0] if isinstance(o, tuple) else o).detach()))
    with torch.no_grad():
        hs = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    handle.remove()
    return torch.stack([h[0] for h in hs[:-1]] + [out["last"][0]])


def _unembed(lm, h):
    """A hand-written RMSNorm (LLaMA's, statistics from h) and the LM head's weight."""
    norm = lm.model.model.norm
    x = h.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
    return x @ lm.model.lm_head.weight.T


def _save_jacobian(path, jac, n_prompts=1, dtype=torch.float16):
    torch.save({"J": {b: m.to(dtype) for b, m in jac.items()}, "n_prompts": n_prompts,
                "source_layers": sorted(jac), "d_model": D}, path)
    return path


def _save_tuned(path, weights, biases, *, layers=LAYERS, d_model=D, unembed_hash=None):
    path.mkdir(parents=True, exist_ok=True)
    state = {}
    for i, (a, b) in enumerate(zip(weights, biases)):
        state[f"{i}.weight"], state[f"{i}.bias"] = a, b
    torch.save(state, path / "params.pt")
    (path / "config.json").write_text(json.dumps({
        "base_model_name_or_path": "tiny-llama", "d_model": d_model, "num_hidden_layers": layers, "bias": True,
        "base_model_revision": None, "unembed_hash": unembed_hash, "lens_type": "linear_tuned_lens"}))
    return path


def _same_cells(a, b, rows):
    """The grids ``a`` and ``b`` on the rows named ``rows``: the same top tokens, probabilities to float32 rounding."""
    ia, ib = [a.layers.index(r) for r in rows], [b.layers.index(r) for r in rows]
    assert torch.equal(a.top_ids[ia], b.top_ids[ib])
    torch.testing.assert_close(a.top_logprobs[ia], b.top_logprobs[ib], atol=1e-5, rtol=0)
    torch.testing.assert_close(a.entropies[ia], b.entropies[ib], atol=1e-5, rtol=0)


def test_identity_jacobians_read_exactly_the_logit_lens(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    eye = torch.eye(D)
    path = _save_jacobian(tmp_path / "eye.pt", {0: eye, 1: eye})
    logit = api.lens(lm, PROMPT, k=3).result
    jac = api.lens(lm, PROMPT, k=3, lens=f"jacobian:{path}").result
    assert jac.layers == (0, 1) and logit.layers == ("embed", 0, 1)
    assert torch.equal(jac.top_ids, logit.top_ids[1:])
    assert torch.equal(jac.top_logprobs, logit.top_logprobs[1:])
    assert jac.lens == "jacobian" and jac.unfitted == ("embed",)


def test_zero_translators_read_exactly_the_logit_lens(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    zeros = [torch.zeros(D, D)] * LAYERS
    path = _save_tuned(tmp_path / "tuned", zeros, [torch.zeros(D)] * LAYERS)
    logit = api.lens(lm, PROMPT, k=3).result
    tuned = api.lens(lm, PROMPT, k=3, lens=f"tuned:{path}").result
    assert tuned.layers == logit.layers == ("embed", 0, 1)
    assert torch.equal(tuned.top_ids, logit.top_ids)
    assert torch.equal(tuned.top_logprobs, logit.top_logprobs)
    assert torch.equal(tuned.kls, logit.kls)


def test_a_random_jacobian_reads_the_hand_computation(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    g = torch.Generator().manual_seed(0)
    j0 = (torch.eye(D) + 0.3 * torch.randn(D, D, generator=g)).half().float()  # as the fp16 file holds it
    path = _save_jacobian(tmp_path / "j.pt", {0: j0})
    r = api.lens(lm, PROMPT, k=5, lens=f"jacobian:{path}", target=" much")
    grid = r.result
    assert grid.layers == (0, 1) and grid.unfitted == ("embed",)
    hs = _hidden_states(lm, r.data["token_ids"])
    logits = torch.stack([_unembed(lm, hs[1] @ j0.T), _unembed(lm, hs[2])]).double()
    logp = torch.log_softmax(logits, -1)
    top = torch.topk(logp, 5, dim=-1)
    assert torch.equal(grid.top_ids, top.indices)
    torch.testing.assert_close(grid.top_logprobs, top.values, atol=1e-5, rtol=0)
    kl = (logp[-1].exp() * (logp[-1] - logp)).sum(-1)
    torch.testing.assert_close(grid.kls, kl.clamp_min(0), atol=1e-5, rtol=0)
    assert r.data["lens"] == {"kind": "jacobian", "source": str(path), "unfitted": ["embed"]}


def test_a_random_tuned_lens_reads_the_hand_computation(tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    g = torch.Generator().manual_seed(1)
    weights = [0.2 * torch.randn(D, D, generator=g) for _ in range(LAYERS)]
    biases = [0.1 * torch.randn(D, generator=g) for _ in range(LAYERS)]
    path = _save_tuned(tmp_path / "tuned", weights, biases)
    r = api.lens(lm, PROMPT, k=3, lens=f"tuned:{path}")
    hs = _hidden_states(lm, r.data["token_ids"])
    # translator i on hidden_states[i]: 0 = embed, 1 = block 0; block 1 (the last) as it is
    rows = [hs[i] + hs[i] @ weights[i].T + biases[i] for i in range(LAYERS)] + [hs[LAYERS]]
    top = torch.topk(torch.log_softmax(_unembed(lm, torch.stack(rows)).double(), -1), 3, dim=-1)
    assert torch.equal(r.result.top_ids, top.indices)
    torch.testing.assert_close(r.result.top_logprobs, top.values, atol=1e-5, rtol=0)


def test_tuned_lens_0_2_0_reads_the_same(tiny_lm, tmp_path):
    """tuned-lens' own TunedLens (saved by its own ``save``, read by anatomy) on the same hidden states."""
    tl = pytest.importorskip("tuned_lens.nn.lenses")
    from anatomy_cli.engine.fitted_lens import unembed_hash
    from anatomy_cli.tasks import notes

    lm = tiny_lm("llama")
    lens = tl.TunedLens.from_model(lm.model)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for t in lens.layer_translators:
            t.weight.copy_(0.2 * torch.randn(D, D, generator=g))
            t.bias.copy_(0.1 * torch.randn(D, generator=g))
    lens.save(tmp_path / "tl")
    assert json.loads((tmp_path / "tl" / "config.json").read_text())["unembed_hash"] == unembed_hash(
        lm.model.lm_head.weight)
    collected = notes.Collected()
    with notes.using_notes(collected):
        r = api.lens(lm, PROMPT, k=3, lens=f"tuned:{tmp_path / 'tl'}")
    assert not [w for w in collected.warnings if "too weak" not in w]  # the recorded unembed_hash matches
    hs = _hidden_states(lm, r.data["token_ids"])
    with torch.no_grad():
        theirs = [lens.forward(hs[i], i) for i in range(LAYERS)] + [lens.unembed.forward(hs[LAYERS])]
    top = torch.topk(torch.log_softmax(torch.stack(theirs).double(), -1), 3, dim=-1)
    assert torch.equal(r.result.top_ids, top.indices)
    torch.testing.assert_close(r.result.top_logprobs, top.values, atol=1e-5, rtol=0)


def test_an_unembed_hash_of_another_model_warns(tiny_lm, tmp_path):
    from anatomy_cli.tasks import notes

    lm = tiny_lm("llama")
    path = _save_tuned(tmp_path / "tuned", [torch.zeros(D, D)] * LAYERS, [torch.zeros(D)] * LAYERS,
                       unembed_hash="0" * 64)
    collected = notes.Collected()
    with notes.using_notes(collected):
        api.lens(lm, PROMPT, lens=f"tuned:{path}")
    hash_notes = [w for w in collected.warnings if "too weak to read" not in w]  # (the lens check: issue 61)
    assert len(hash_notes) == 1 and "unembed_hash differs" in hash_notes[0]


def test_lenses_of_another_model_are_refused_before_the_weights_load(tiny_model_dir, tmp_path):
    model = str(tiny_model_dir("llama"))
    wide = tmp_path / "wide.pt"
    torch.save({"J": {0: torch.eye(64).half()}, "n_prompts": 1, "source_layers": [0], "d_model": 64}, wide)
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"jacobian_sum": {0: torch.eye(D)}, "n_done": 1, "next_idx": 1, "source_layers": [0]}, checkpoint)
    deep = _save_tuned(tmp_path / "deep", [torch.zeros(D, D)] * 3, [torch.zeros(D)] * 3, layers=3)
    cases = {
        f"jacobian:{wide}": "was fitted for d_model 64; this model's is 32",
        f"jacobian:{checkpoint}": "a fit checkpoint",
        f"tuned:{deep}": "d_model 32 and 3 layers; this model has d_model 32 and 2",
        "jacobian:" + str(tmp_path / "missing.pt"): "does not exist",
        "tuned": "use logit, tuned:DIR",
        f"jacobian:{tmp_path / 'notes.md'}": "notes.md is not a Jacobian lens file (not a file torch.save wrote)",
    }
    (tmp_path / "notes.md").write_text("# a text file, not a lens\n", encoding="utf-8")
    for lens, message in cases.items():
        res = runner.invoke(app, ["lens", PROMPT, "--model", model, "--lens", lens])
        assert res.exit_code == 2, (lens, res.output)
        assert message in res.output, (lens, res.output)
        assert len([line for line in res.output.splitlines() if line.strip()]) == 1, res.output
    with pytest.raises(UsageError):
        api.lens(model, PROMPT, lens="jacobian")


def test_a_tuned_lens_of_another_depth_is_refused_from_its_config_alone(tiny_model_dir, tmp_path):
    """params.pt is not a torch file at all: the refusal comes from config.json, before any tensor is read."""
    deep = _save_tuned(tmp_path / "deep", [torch.zeros(D, D)] * 3, [torch.zeros(D)] * 3, layers=3)
    (deep / "params.pt").write_bytes(b"not a torch file")
    res = runner.invoke(app, ["lens", PROMPT, "--model", str(tiny_model_dir("llama")), "--lens", f"tuned:{deep}"])
    assert res.exit_code == 2 and "3 layers; this model has d_model 32 and 2" in res.output, res.output
    ok = _save_tuned(tmp_path / "ok", [torch.zeros(D, D)] * LAYERS, [torch.zeros(D)] * LAYERS)
    (ok / "params.pt").write_bytes(b"not a torch file")
    res = runner.invoke(app, ["lens", PROMPT, "--model", str(tiny_model_dir("llama")), "--lens", f"tuned:{ok}"])
    assert res.exit_code == 2 and "is not a tuned-lens params.pt" in res.output, res.output


def test_the_cli_table_says_which_lens_and_what_is_not_shown(tiny_model_dir, tmp_path):
    path = _save_jacobian(tmp_path / "eye.pt", {0: torch.eye(D)})
    res = runner.invoke(app, ["lens", PROMPT, "--model", str(tiny_model_dir("llama")), "--lens", f"jacobian:{path}",
                                 "--format", "table"])
    assert res.exit_code == 0, res.output
    assert "Jacobian lens: top token" in res.output
    assert "not shown: embed (no reading in the Jacobian lens)" in res.output


def test_trace_reads_the_same_fitted_lens_as_lens(tiny_lm, tiny_model_dir, tmp_path):
    """trace --lens at its position equals the lens grid's cell there; identity J gives the logit lens's columns;
    a Jacobian lens leaves ``embed`` without a reading."""
    lm = tiny_lm("llama")
    g = torch.Generator().manual_seed(3)
    j0 = (torch.eye(D) + 0.3 * torch.randn(D, D, generator=g)).half()
    path = _save_jacobian(tmp_path / "j.pt", {0: j0})
    tuned = _save_tuned(tmp_path / "tuned", [0.2 * torch.randn(D, D, generator=g) for _ in range(LAYERS)],
                        [0.1 * torch.randn(D, generator=g) for _ in range(LAYERS)])
    for lens in (f"jacobian:{path}", f"tuned:{tuned}"):
        tr = api.trace(lm, PROMPT, lens=lens, target=" much")
        grid = api.lens(lm, PROMPT, lens=lens, target=" much").result
        last = grid.positions.index(tr.data["position"])
        for row in tr.result.layers:
            if row.layer not in grid.layers:
                assert row.layer == "embed" and lens.startswith("jacobian") and row.lens_token_id is None
                assert row.target_rank is None
                continue
            r = grid.layers.index(row.layer)
            assert row.lens_token_id == int(grid.top_ids[r, last, 0]), (lens, row.layer)
            assert row.lens_probability == pytest.approx(float(grid.probability()[r, last]), abs=1e-6)
            assert row.target_rank == int(grid.target_ranks[r, last])
        assert tr.data["lens"]["kind"] == lens.split(":")[0]
    eye = _save_jacobian(tmp_path / "eye.pt", {0: torch.eye(D)})
    plain, through = api.trace(lm, PROMPT).result, api.trace(lm, PROMPT, lens=f"jacobian:{eye}").result
    assert [r.lens_token_id for r in through.layers[1:]] == [r.lens_token_id for r in plain.layers[1:]]
    assert [r.lens_probability for r in through.layers[1:]] == pytest.approx(
        [r.lens_probability for r in plain.layers[1:]], abs=1e-6)
    model = str(tiny_model_dir("llama"))
    res = runner.invoke(app, ["trace", PROMPT, "--model", model, "--lens", "jacobian:/nope.pt"])
    assert res.exit_code == 2 and "/nope.pt does not exist" in res.output, res.output
    res = runner.invoke(app, ["trace", PROMPT, "--model", model, "--lens", f"jacobian:{path}", "--format", "table"])
    assert res.exit_code == 0 and "no reading for embed" in res.output, res.output


def test_a_missing_lens_path_is_refused_by_the_options_before_any_model_opens(tmp_path):
    # the options are built before the model is opened (tasks/lens.py, tasks/trace.py): no config is read first
    from anatomy_cli.errors import UsageError
    from anatomy_cli.tasks.lens import LensOptions
    from anatomy_cli.tasks.trace import TraceOptions

    for options in (LensOptions, TraceOptions):
        with pytest.raises(UsageError, match="nope.pt does not exist"):
            options(lens=f"jacobian:{tmp_path / 'nope.pt'}")
        with pytest.raises(UsageError, match="a tuned lens is a directory"):
            (tmp_path / "file").write_text("x")
            options(lens=f"tuned:{tmp_path / 'file'}")
