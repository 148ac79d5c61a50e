"""`anatomy circuit` after a new user's trial (issue 49): --estimate counts a TopK transcoder's k (equal to the real
run's active features), checks --target as the run does, refuses --check / --labels, and counts the batch forward's
MLPs once; --plot names .html alone; a path row without a source has no via weight (empty, null)."""

from __future__ import annotations

import json

import pytest
from test_circuit import invoke
from test_circuit import random_clt
from test_circuit import random_transcoders
from test_circuit import write_clt
from test_circuit import write_transcoder_set
from test_circuit_transcoders import write_sae_folders

PROMPT = "The capital of France is"


def _args(model, tdir, *more):
    return ["circuit", PROMPT, "--model", str(model), "--device", "cpu", "--transcoders", str(tdir), "--bos",
            "--max-feature-nodes", "20", "--batch-size", "8", *more]


@pytest.mark.parametrize("layout", ["config", "sparsify", "clt"])
def test_estimate_counts_topk_k_as_the_run_does(tiny_model_dir, tiny_lm, tmp_path, layout):
    """TopK transcoders (k 4 of 16 features): the estimate's bound is L·(P−1)·k, exactly the run's active features
    (a config.yaml ``k:``, a sparsify folder's cfg.json ``k``, a cross-layer transcoder's ``k:``), and its note
    says k."""
    import anatomy_cli as anatomy

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    if layout == "clt":
        tdir = write_clt(tmp_path / "clt", *random_clt(lm), threshold=False)
        (tdir / "config.yaml").write_text((tdir / "config.yaml").read_text() + "k: 4\n")
    else:
        tdir = (write_transcoder_set(tmp_path / "ct", lm, tcs, extra="k: 4\n") if layout == "config"
                else write_sae_folders(tmp_path / "sp", tcs, "sparsify", k=4))
    model = tiny_model_dir("llama")
    est = invoke(*_args(model, tdir, "--estimate", "-f", "json"))
    assert est.exit_code == 0, est.stderr
    e = json.loads(est.stdout)
    real = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), max_feature_nodes=20, batch_size=8,
                           prompts=anatomy.PromptOptions(bos=True))
    n_active = int(real.graph.active_features.shape[0])
    assert e["k"] == 4 and e["active_features_bound"] == lm.n_layers * (e["n_tokens"] - 1) * 4 == n_active
    table = invoke(*_args(model, tdir, "--estimate", "-f", "table"))
    assert "k = 4 features of each block" in table.stdout + table.stderr
    plain = write_transcoder_set(tmp_path / "plain", lm, tcs)  # not TopK: every feature, k null
    p = json.loads(invoke(*_args(model, plain, "--estimate", "-f", "json")).stdout)
    assert p["k"] is None and p["active_features_bound"] == lm.n_layers * (p["n_tokens"] - 1) * 16


def _with_thresholds(tdir, value=0.0):
    """The transcoder_set's files with a JumpReLU ``activation_function.threshold`` (``value`` everywhere)."""
    import torch
    from safetensors.torch import load_file
    from safetensors.torch import save_file

    for f in sorted(tdir.glob("layer_*.safetensors")):
        t = load_file(str(f))
        save_file({**t, "activation_function.threshold": torch.full(t["b_enc"].shape, value)}, str(f))
    return tdir


@pytest.mark.parametrize("kind", ["relu", "jumprelu", "topk", "jumprelu+k", "sparsify", "clt+k"])
def test_estimate_bounds_the_runs_active_features(tiny_model_dir, tiny_lm, tmp_path, kind):
    """For every activation kind the estimate's active_features_bound is at least the run's active features, and
    equals them for pure TopK (a config ``k:``, sparsify): a JumpReLU file whose config also states ``k: 2`` is
    JumpReLU in the run (its threshold wins), so it is bounded by every feature, not by k (the run here has more
    than L·(P−1)·2 active: counting k undercounted)."""
    import anatomy_cli as anatomy

    lm = tiny_lm("llama")
    tcs = random_transcoders(lm)
    k = "k: 2\n" if kind.endswith("+k") or kind == "topk" else ""
    if kind == "sparsify":
        tdir = write_sae_folders(tmp_path / "sp", tcs, "sparsify", k=2)
    elif kind == "clt+k":
        tdir = write_clt(tmp_path / "clt", *random_clt(lm))  # threshold_l: JumpReLU
        (tdir / "config.yaml").write_text((tdir / "config.yaml").read_text() + k)
    else:
        tdir = write_transcoder_set(tmp_path / "ct", lm, tcs, extra=k)
        if kind.startswith("jumprelu"):
            _with_thresholds(tdir)
    est = invoke(*_args(tiny_model_dir("llama"), tdir, "--estimate", "-f", "json"))
    assert est.exit_code == 0, est.stderr
    e = json.loads(est.stdout)
    real = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), max_feature_nodes=20, batch_size=8,
                           prompts=anatomy.PromptOptions(bos=True))
    n_active = int(real.graph.active_features.shape[0])
    assert e["active_features_bound"] >= n_active
    per_topk = lm.n_layers * (e["n_tokens"] - 1) * 2
    if kind in ("topk", "sparsify"):
        assert e["k"] == 2 and e["active_features_bound"] == n_active == per_topk
    else:
        assert e["k"] is None and e["active_features_bound"] == lm.n_layers * (e["n_tokens"] - 1) * 16
    if kind.endswith("+k"):
        assert n_active > per_topk  # what counting k would have given: below the run's count


def test_config_k_must_be_a_whole_number(tiny_model_dir, tiny_lm, tmp_path):
    lm = tiny_lm("llama")
    for k in ("0", "2.5", "yes"):
        tdir = write_transcoder_set(tmp_path / f"k{k}", lm, random_transcoders(lm), extra=f"k: {k}\n")
        result = invoke(*_args(tiny_model_dir("llama"), tdir, "--estimate"))
        assert result.exit_code == 2 and "TopK takes a whole number of at least 1" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_estimate_checks_targets_as_the_run_does(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    """A --target of several tokens: the same one-line usage error (exit 2) with and without --estimate, before
    any weight loads; a one-token target gives n_logits 1."""
    from transformers import AutoTokenizer

    import anatomy_cli.cli.commands.circuit as command

    lm = tiny_lm("llama")
    model = tiny_model_dir("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    hf = AutoTokenizer.from_pretrained(model)
    n = len(hf(" Paris,x", add_special_tokens=False).input_ids)
    assert n > 1
    monkeypatch.setattr(command, "load_weights", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("loaded")))
    want = f"error: --target ' Paris,x' is {n} tokens for "  # text/targets.py resolve's message, as next's
    seen = set()
    for extra in ((), ("--estimate",)):
        got = invoke(*_args(model, tdir, "--target", " Paris", "--target", " Paris,x", *extra))
        assert got.exit_code == 2 and got.stderr.startswith(want), got.stderr
        assert len(got.stderr.strip().splitlines()) == 1 and got.stderr.rstrip().endswith("to take the first")
        seen.add(got.stderr)
    assert len(seen) == 1
    one = hf.convert_ids_to_tokens(hf(" Paris", add_special_tokens=False).input_ids)
    ok = invoke(*_args(model, tdir, "--target", " Paris", "--estimate", "-f", "json"))
    assert ok.exit_code == 0 and len(one) == 1 and json.loads(ok.stdout)["n_logits"] == 1
    monkeypatch.undo()
    run = invoke(*_args(model, tdir, "--target", " Paris", "-f", "json"))
    assert run.exit_code == 0, run.stderr
    assert [t["id"] for t in json.loads(run.stdout)["targets"]] == hf(" Paris", add_special_tokens=False).input_ids


def test_first_token_and_target_id(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    """--first-token takes a several-token --target's first token, --target-id N names a logit node by id (after
    the texts), as next's options do (text/targets.py); --estimate counts both, and the refusals (an id past the
    LM head, --first-token with no text) come before any weight loads, also with --estimate."""
    from transformers import AutoTokenizer

    import anatomy_cli as anatomy
    import anatomy_cli.cli.commands.circuit as command

    lm = tiny_lm("llama")
    model = tiny_model_dir("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    first = AutoTokenizer.from_pretrained(model)(" Paris,x", add_special_tokens=False).input_ids[0]
    rows = lm.model.get_output_embeddings().weight.shape[0]
    monkeypatch.setattr(command, "load_weights", lambda *_a, **_k: (_ for _ in ()).throw(AssertionError("loaded")))
    for extra in ((), ("--estimate",)):
        bad = invoke(*_args(model, tdir, "--target-id", str(rows), *extra))
        assert bad.exit_code == 2 and bad.stderr.strip().endswith(f"(ids 0..{rows - 1})"), bad.stderr
        alone = invoke(*_args(model, tdir, "--target-id", "5", "--first-token", *extra))
        assert alone.exit_code == 2 and "--first-token applies to a --target TEXT" in alone.stderr
        # one token named twice (a text and its id): two logit nodes would share one JSON node id
        twice = invoke(*_args(model, tdir, "--target", " Paris,x", "--first-token", "--target-id", str(first),
                              *extra))
        assert twice.exit_code == 2 and twice.stderr.strip().splitlines()[-1] == (
            f"error: --target / --target-id name token id {first} more than once: each logit node once"), twice.stderr
    est = invoke(*_args(model, tdir, "--target", " Paris,x", "--first-token", "--target-id", "5", "--estimate",
                        "-f", "json"))
    assert est.exit_code == 0 and json.loads(est.stdout)["n_logits"] == 2, est.stderr
    monkeypatch.undo()
    run = invoke(*_args(model, tdir, "--target", " Paris,x", "--first-token", "--target-id", "5", "-f", "json"))
    assert run.exit_code == 0, run.stderr
    assert [t["id"] for t in json.loads(run.stdout)["targets"]] == [first, 5]
    assert "--first-token takes" in run.stderr
    api = anatomy.circuit(lm, PROMPT, transcoders=str(tdir), target=[" Paris,x"], first_token=True, target_id=[5],
                          max_feature_nodes=20, batch_size=8, prompts=anatomy.PromptOptions(bos=True))
    assert [i for _, i in api.graph.logit_targets] == [first, 5]


@pytest.mark.parametrize("flag", ["--check", "--labels"])
def test_estimate_refuses_check_and_labels(tiny_model_dir, tiny_lm, tmp_path, monkeypatch, flag):
    """--estimate computes no graph: --check N and --labels PATH are usage errors before the model is opened."""
    import anatomy_cli.cli.commands.circuit as command

    def refuse(*_a, **_k):
        raise AssertionError("model opened")

    monkeypatch.setattr(command, "open_texts", refuse)
    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    labels = tmp_path / "labels.json"
    labels.write_text(json.dumps([{"layer": "0-transcoder", "index": 1, "description": "x"}]))
    value = "3" if flag == "--check" else str(labels)
    result = invoke(*_args(tiny_model_dir("llama"), tdir, "--estimate", flag, value))
    assert result.exit_code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --estimate") and flag in lines[0]
    assert result.stdout == ""


def test_estimate_flops_by_hand(tiny_model_dir, tiny_lm, tmp_path):
    """The FLOPs counted by hand: the prompt's forward (12 d² per block and token, the LM head, attention's
    2·L·P²·d) and every block's encode + decode; the batch forward and each backward as B copies of the forward
    without its MLPs (8 d² of the 12) and LM head, the MLPs once in the batch forward; the dots; the re-rankings."""
    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    e = json.loads(invoke(*_args(tiny_model_dir("llama"), tdir, "--estimate", "-f", "json")).stdout)
    L, P, d, V, F, B = lm.n_layers, e["n_tokens"], lm.d_model, lm.model.get_output_embeddings().weight.shape[0], 16, 8
    A, n, K = L * (P - 1) * F, 20, 10
    fwd = 2 * (12 * L * d * d + V * d) * P + 2 * L * P * P * d
    mlp = 16 * L * d * d * P
    core = fwd - mlp - 2 * V * d * P
    passes = -(-K // B) + -(-n // B)
    rankings = -(-n // (4 * B))
    want = (fwd + 4 * L * P * F * d + B * core + mlp + passes * (B * core + 2 * B * d * (A + (L + 1) * P))
            + rankings * (L + 2) * 2 * (n + K) * (A + (L + 1) * P + K))
    assert e["backward_passes"] == passes and e["flops"] == pytest.approx(want, rel=1e-12)
    assert e["seconds_expected"] == pytest.approx(want / 5e10, rel=1e-12)


@pytest.mark.parametrize("name", ["x.bmp", "x.png", "x.svg", "x"])
def test_plot_names_html_alone(tiny_model_dir, tiny_lm, tmp_path, name):
    """Any --plot but .html: one message naming .html only (not the other commands' .png/.svg/.pdf)."""
    lm = tiny_lm("llama")
    tdir = write_transcoder_set(tmp_path / "tc", lm, random_transcoders(lm))
    result = invoke(*_args(tiny_model_dir("llama"), tdir, "--plot", str(tmp_path / name)))
    assert result.exit_code == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and line.endswith("give a .html file " +
                                                          (f"(not '{name[1:]}')" if "." in name else "(no suffix)"))
    rest = line.replace(name, "").replace(f"'{name[1:]}'", "")
    assert not any(other in rest for other in (".png", ".svg", ".pdf"))


def test_path_without_source_has_no_via_weight(capsys):
    """A kept source with no edge into it (a token, an error node: the graph's inputs): via "" and via_weight None,
    printed empty in tsv and null in JSON; a source with one: its strongest, an error node's included."""
    from test_circuit_output import hand_graph

    from anatomy_cli.analyses.circuit_files import written_nodes
    from anatomy_cli.output import render
    from anatomy_cli.output.render import Format
    from anatomy_cli.output.render import Report
    from anatomy_cli.output.render import Section
    from anatomy_cli.output.views.circuit import COLUMNS
    from anatomy_cli.tasks.circuit import paths

    graph, pr = hand_graph()
    rows = [r.to_dict() for r in paths(graph, pr, written_nodes(graph, pr), 10)]
    assert [(r["node"], r["via"], r["via_weight"]) for r in rows] == [("0_3_2", "0_-1_1", 0.3125),
                                                                      ("E_5_1", "", None), ("0_-1_2", "", None)]
    assert json.loads(render.to_json(rows))[1]["via_weight"] is None
    render.emit(Report(data={}, sections=[Section(COLUMNS, rows)]), Format.tsv)
    lines = capsys.readouterr().out.rstrip("\n").splitlines()
    assert lines[-2].split("\t")[-2:] == ["", ""] and lines[-3].split("\t")[-2:] == ["0_-1_1", "0.3125"]
