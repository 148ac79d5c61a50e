"""``anatomy circuit`` against circuit-tracer 0.5.0 itself, on the real SmolLM2 with seeded random transcoders.

circuit-tracer pins transformers 4.57.3 (and nnsight), so it lives in its own venv: ``.venv-ct`` beside the project
(``.ci/run`` builds it: torch from the local wheel, then ``circuit-tracer==0.5.0 transformers==4.57.3 nnsight<0.7``),
or the Python that ``$ANATOMY_CT_PYTHON`` names. Skipped, with the reason, where neither imports circuit_tracer.

tests/reference/circuit_tracer_ref.py runs in that venv: it writes the transcoders (circuit-tracer's ``transcoder_set``
layout: ``config.yaml`` + ``layer_i.safetensors``; JumpReLU on even blocks, ReLU on odd; and, as the second case, a
cross-layer transcoder in its ``load_clt`` layout: ``W_enc_l`` / ``W_dec_l [F, L - l, d]``) for the directory that
``anatomy convert`` makes of the GGUF file, runs ``attribute(...)`` (max_feature_nodes 64, batch 8, so the feature rows
come in influence order with two re-rankings), ``prune_graph``, ``compute_graph_scores`` and ``create_graph_files``, and
saves every result as plain tensors. anatomy runs the same prompt with circuit-tracer's BOS (``--bos``); then
circuit-tracer's own ``Graph.from_pt`` reads anatomy's ``graph.pt`` and prunes and scores it.

Compared: tokens, logit targets and probabilities, active features and activations, selected features, the adjacency
(relative error ≤ 1e-4 in fp32), node and edge masks, cumulative scores, replacement and completeness scores, and the
JSON's nodes and links.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from conftest import cache_root
from conftest import cached_file

REF = ROOT / "tests" / "reference" / "circuit_tracer_ref.py"
PROMPT = "The capital of France is"
MAX_FEATURE_NODES, BATCH = 64, 8
REL = 1e-4  # fp32 on both sides; the two tools sum the same products in different orders


VERSIONS = ("import circuit_tracer, importlib.metadata as m; "
            "print(' '.join(p + m.version(p) for p in ('circuit-tracer', 'torch', 'transformers', 'nnsight')))")


@functools.cache
def ct_probe() -> tuple[str, str] | None:
    """``(circuit-tracer's Python, its venv's versions)``: $ANATOMY_CT_PYTHON, else ROOT/.venv-ct (what .ci/run
    builds); None if neither imports circuit_tracer. Probed once per process (a few seconds: it imports torch)."""
    named = os.environ.get("ANATOMY_CT_PYTHON")
    candidate = Path(named) if named else ROOT / ".venv-ct" / "bin" / "python"
    if not candidate.is_file():
        return None
    probe = subprocess.run([str(candidate), "-c", VERSIONS], capture_output=True, text=True, timeout=120)
    return (str(candidate), probe.stdout.strip()) if probe.returncode == 0 else None


def ct_python() -> str | None:
    """circuit-tracer's Python (:func:`ct_probe`), or None."""
    probe = ct_probe()
    return None if probe is None else probe[0]


def run_ct(python: str, *args: str | Path) -> str:
    done = subprocess.run([python, str(REF), *map(str, args)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    assert done.returncode == 0, f"circuit_tracer_ref.py {args[0]} failed:\n{done.stderr[-4000:]}"
    return done.stdout


@functools.cache
def folder_digests(model: Path) -> tuple[str, ...]:
    """``name sha256`` of each file of a model folder (read once per process: 540 MB for SmolLM2). A safetensors
    file's by its content: the header's JSON with sorted keys (save_pretrained writes its keys in no fixed order,
    so two saves of the same tensors differ in their bytes), then the tensors' bytes."""
    return tuple(f"{f.name} {content_sha256(f)}" for f in sorted(model.iterdir()))


def content_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        if path.suffix == ".safetensors":
            size = int.from_bytes(fh.read(8), "little")
            h.update(json.dumps(json.loads(fh.read(size)), sort_keys=True).encode())
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def reference_key(model: Path, versions: str, options: list) -> str:
    """What circuit-tracer's run depends on, digested: the model folder's files (names and bytes), the reference
    script, the options and circuit-tracer's venv (its versions)."""
    parts = [REF.read_text(), versions, *map(str, options), *folder_digests(model)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory, smollm2_lm):
    """``anatomy convert``'s directory of the session's SmolLM2 (what circuit-tracer's transformers reads)."""
    from anatomy_cli.cli.commands.convert import write_directory

    model = tmp_path_factory.mktemp("smollm2-hf")
    write_directory(smollm2_lm, model)
    return model


@pytest.fixture(scope="module", params=["plt", "clt"])
def ct(request, tmp_path_factory):
    """circuit-tracer's run: (python, model dir, out dir, reference record, its JSON); once with per-layer
    transcoders, once with a cross-layer transcoder (its ``load_clt`` folder). circuit-tracer's run is kept once per
    machine (conftest's ``cached_file``, as transformers' reference loads are): keyed by this model folder's bytes
    (what ``anatomy convert`` wrote), the reference script, its options and the venv's versions, so a change to any of
    them runs circuit-tracer again; ``check`` (circuit-tracer reading anatomy's graph) runs every time."""
    probe = ct_probe()
    if probe is None:
        pytest.skip("circuit-tracer is not installed: .ci/run builds .venv-ct (or set ANATOMY_CT_PYTHON)")
    python, versions = probe
    model = request.getfixturevalue("smollm2_dir")
    options = ["--prompt", PROMPT, "--features", 64, "--seed", 0, "--max-feature-nodes", MAX_FEATURE_NODES,
               "--batch-size", BATCH, "--kind", request.param]

    key = f"circuit-tracer-{request.param}-{reference_key(model, versions, options)}"

    def build(out: Path) -> None:
        run_ct(python, "attribute", "--model", model, "--out", out, *options)  # writes the transcoders first
        shutil.rmtree(out / "model-v4")  # links to this session's model folder: not kept
        config = out / "transcoders" / "config.yaml"  # names its files by their paths: the folder's final ones
        config.write_text(config.read_text().replace(str(out), str(cache_root() / "references" / key)))

    out = cached_file(key, "", build, folder="references")
    record = torch.load(out / "reference.pt", weights_only=False)
    record["kind"] = request.param
    return python, model, out, record, json.loads((out / "ct.json").read_text())


def test_circuit_tracer_reference_is_consistent(ct):
    """The reference itself: circuit-tracer reads its own graph.pt back (the path anatomy's file takes) to the same
    graph, pruning and scores, and the run exercised what the comparison needs (features beyond the cap, a BOS it
    added, none at the BOS position)."""
    *_, ref, _ = ct
    assert ref["roundtrip_equal"]  # Graph.from_pt(to_pt(g)) prunes and scores as g
    assert ref["scan"] == f"random-{ref['kind']}-seed0"  # the transcoders of this case
    n_active, n_sel = len(ref["active_features"]), len(ref["selected_features"])
    assert n_active > MAX_FEATURE_NODES == n_sel  # the influence ranking chose the rows
    assert ref["input_tokens"][0].item() == 1 and ref["input_string"].startswith("<|im_start|>")  # BOS prepended
    assert not (ref["active_features"][:, 1] == 0).any()  # no feature at the BOS position
    n = n_sel + (ref["n_layers"] + 1) * len(ref["input_tokens"]) + len(ref["logit_ids"])
    assert ref["adjacency_matrix"].shape == (n, n)


def anatomy_logits(lm, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return lm.model(tokens[None]).logits[0, -1].float()


def test_reference_logits_are_the_models(ct, smollm2_lm):
    """circuit-tracer's model (transformers 4.57 reading ``anatomy convert``'s directory) is anatomy's SmolLM2: the
    logit targets' probabilities equal anatomy's forward of the same tokens."""
    *_, ref, _ = ct
    probs = torch.softmax(anatomy_logits(smollm2_lm, ref["input_tokens"]), -1)
    torch.testing.assert_close(probs[ref["logit_ids"]], ref["logit_probabilities"], rtol=1e-4, atol=1e-6)
    assert ref["logit_ids"][0] == int(probs.argmax())


# ---- anatomy's side: `anatomy circuit` (c1's command; its interface: /work/notes/c1-interface.md) ----

def anatomy_circuit(lm, model: Path, transcoders: Path, out: Path, graph_json: bool = True) -> dict:
    """Run ``anatomy circuit`` as a user would, with circuit-tracer's choices spelled out; returns its JSON. The
    model is the session's SmolLM2 (the GGUF file ``model`` was converted from: the same weights), not read again.
    ``graph_json``: also ``--json`` with 0.5.0's ids (refused where they collide: the graph.pt alone otherwise)."""
    from conftest import FixedLoader
    from typer.testing import CliRunner

    from anatomy_cli.cli.main import app
    from anatomy_cli.engine.loader import using_loader

    if "circuit" not in {c.name for c in app.registered_commands}:
        pytest.skip("anatomy circuit is not built on this branch yet")
    with using_loader(FixedLoader(lm)):
        result = CliRunner().invoke(app, [
            "circuit", PROMPT, "--model", str(model), "--transcoders", str(transcoders), "--bos",
            "--max-feature-nodes", str(MAX_FEATURE_NODES), "--batch-size", str(BATCH), "--out", str(out / "graph.pt"),
            *(["--ids", "ct-0.5", "--json", str(out / "graph.json")] if graph_json else []), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def ours(ct, tmp_path_factory, smollm2_lm):
    python, model, out, ref, _ = ct
    mine = tmp_path_factory.mktemp("anatomy")
    report = anatomy_circuit(smollm2_lm, model, out / "transcoders", mine)
    run_ct(python, "check", "--model", model, "--out", mine, mine / "graph.pt")  # circuit-tracer reads anatomy's file
    return report, torch.load(mine / "check.pt", weights_only=False), json.loads((mine / "graph.json").read_text())


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def test_graph_equals_circuit_tracers(ct, ours):
    *_, ref, _ = ct
    _, got, _ = ours
    assert_same_graph(got, ref)


def assert_same_graph(got: dict, ref: dict) -> None:
    """circuit-tracer's reading of anatomy's graph (``got``, from ``check``) is its own graph (``ref``): tokens,
    logit targets, active and selected features and activations, the adjacency to ``REL``."""
    assert got["input_tokens"].tolist() == ref["input_tokens"].tolist()
    assert got["logit_ids"] == ref["logit_ids"]
    torch.testing.assert_close(got["logit_probabilities"], ref["logit_probabilities"], rtol=REL, atol=1e-7)
    assert got["active_features"].tolist() == ref["active_features"].tolist()
    assert rel_err(got["activation_values"], ref["activation_values"]) <= REL
    assert got["selected_features"].tolist() == ref["selected_features"].tolist()
    assert got["adjacency_matrix"].dtype == torch.float32
    assert got["adjacency_matrix"].shape == ref["adjacency_matrix"].shape
    assert rel_err(got["adjacency_matrix"], ref["adjacency_matrix"]) <= REL
    # the feature sources on their own scale (a cross-layer feature's edge sums its slices over later blocks; error
    # and token edges, larger, would hide a wrong feature column in the whole matrix's maximum)
    n_sel = len(ref["selected_features"])
    assert rel_err(got["adjacency_matrix"][:, :n_sel], ref["adjacency_matrix"][:, :n_sel]) <= REL
    assert got["scan"] == ref["scan"]
    assert got["vocab_size"] == ref["vocab_size"] and got["n_layers"] == ref["n_layers"]


def test_pruning_and_scores_equal_circuit_tracers(ct, ours):
    """circuit-tracer's pruning of anatomy's graph equals its pruning of its own; anatomy's reported scores equal
    circuit-tracer's ``compute_graph_scores``."""
    *_, ref, _ = ct
    report, got, _ = ours
    assert torch.equal(got["node_mask"], ref["node_mask"]), int((got["node_mask"] != ref["node_mask"]).sum())
    assert torch.equal(got["edge_mask"], ref["edge_mask"]), int((got["edge_mask"] != ref["edge_mask"]).sum())
    torch.testing.assert_close(got["cumulative_scores"], ref["cumulative_scores"], rtol=REL, atol=1e-6)
    scores = report.get("scores", report)
    for key in ("replacement_score", "completeness_score"):
        assert abs(scores[key] - ref[key]) <= REL, (key, scores[key], ref[key])


def test_json_equals_circuit_tracers(ct, ours):
    """anatomy's ``--json --ids ct-0.5`` (its own pruning) has circuit-tracer 0.5.0's nodes, in its order, with its
    ids, and its links, field by field (floats to REL: the two sum in different orders); every id names one node
    (anatomy refuses a graph where 0.5.0's ids would collide: this one has none)."""
    *_, ct_json = ct
    *_, mine = ours
    assert mine["metadata"]["prompt_tokens"] == ct_json["metadata"]["prompt_tokens"]
    assert mine["qParams"] == ct_json["qParams"]
    assert [n["node_id"] for n in mine["nodes"]] == [n["node_id"] for n in ct_json["nodes"]]
    theirs = {n["node_id"]: n for n in ct_json["nodes"]}
    got = {n["node_id"]: n for n in mine["nodes"]}
    assert len(got) == len(mine["nodes"]) == len(theirs) == len(ct_json["nodes"])
    assert [sorted(n) for n in mine["nodes"]] == [sorted(n) for n in ct_json["nodes"]]  # the same fields
    exact = ("feature", "layer", "ctx_idx", "feature_type", "is_target_logit", "jsNodeId", "clerp", "run_idx",
             "reverse_ctx_idx")
    for node_id, node in theirs.items():
        assert {k: got[node_id][k] for k in exact} == {k: node[k] for k in exact}, node_id
        for k in ("influence", "activation", "token_prob"):
            if node.get(k) is None:
                assert got[node_id].get(k) is None, (node_id, k)
            else:
                assert got[node_id][k] == pytest.approx(node[k], rel=REL, abs=1e-6), (node_id, k)
    links = {(e["source"], e["target"]): e["weight"] for e in ct_json["links"]}
    mine_links = {(e["source"], e["target"]): e["weight"] for e in mine["links"]}
    assert list(mine_links) == list(links) and len(mine_links) == len(mine["links"])  # circuit-tracer's order
    scale = max(abs(w) for w in links.values())
    assert max(abs(mine_links[k] - w) for k, w in links.items()) <= REL * scale


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-n", "0", "-x"]))
