"""`verify`'s llama.cpp section on GGUF MoE files (issue 50): llama.cpp's own chosen experts (its graph's
``ffn_moe_topk-{il}``, read through llama-cpp-python's graph-eval callback) against transformers' routing of the
source and anatomy's. The llama.cpp tests skip, saying why, where llama.cpp cannot run here (a child-process
probe: ``llamacpp.unusable``)."""

from __future__ import annotations

import pytest
import torch
from test_gguf_moe import ARCHS
from test_gguf_moe import PROMPT
from test_gguf_moe import _json
from test_gguf_moe import make_moe_files
from test_gguf_moe import routing
from test_gguf_moe import write_moe_gguf

from anatomy_cli import engine


@pytest.fixture(scope="module")
def moe_files(tmp_path_factory):
    return make_moe_files(tmp_path_factory.mktemp("gguf-moe-llamacpp"))


# ---------------------------------------------------------------- llama.cpp's own top-k (verify's llama.cpp section)

def _runs(path):
    from anatomy_cli.analyses.verify.runs import Runs

    lm = engine.load(str(path), device="cpu")
    return Runs(lm, engine.encode(lm, [PROMPT, "Thank you very"]))


def test_the_expert_row_compares_sets_and_says_why_when_it_cannot(moe_files, monkeypatch):
    from anatomy_cli.analyses.verify import llamacpp
    from anatomy_cli.analyses.verify import llamacpp_moe

    src, path, _ = moe_files["qwen3_moe"]
    runs = _runs(path)
    theirs = [{b: idx.flip(-1) for b, (idx, _) in routing(src, e.ids).items()} for e in runs.encoded]  # sets
    row = llamacpp_moe.topk_check(runs, theirs)
    n = sum(len(e) for e in runs.encoded) * 2
    assert row.passed is True and row.error == 0 and f"{n}/{n} (block, position)" in row.note
    # one choice swapped for an expert left out where the router is not near a tie: a failure
    [cache] = engine.run(runs.lm, runs.encoded[:1], ["blocks.1.mlp.hook_router_logits"])
    ranked = torch.softmax(cache["blocks.1.mlp.hook_router_logits"].double(), -1).sort(-1, descending=True)
    pos = int((ranked.values[:, 1] - ranked.values[:, 2]).argmax())
    assert float(ranked.values[pos, 1] - ranked.values[pos, 2]) >= llamacpp_moe.MARGIN
    theirs[0][1] = theirs[0][1].clone()
    theirs[0][1][pos] = ranked.indices[pos, [0, 2]]
    row = llamacpp_moe.topk_check(runs, theirs)
    assert row.passed is False and row.error == 1 and f"{n - 1}/{n}" in row.note
    del theirs[1][0]
    assert "no ffn_moe_topk for every position of block(s) 0" in llamacpp_moe.topk_check(runs, theirs).note

    def broken(*args):
        raise RuntimeError("no such symbol")

    monkeypatch.setattr(llamacpp_moe, "llama_topk", broken)
    row = llamacpp._experts(runs, str(path))
    assert row.passed is None and row.note == ("llama.cpp's own top-k could not be read through its graph callback "
                                               "(cb_eval): no such symbol")


def _llama_cpp(path):
    """Skip unless llama.cpp runs ``path`` here (a child-process probe: a build for another CPU dies there)."""
    from anatomy_cli.analyses.verify import llamacpp

    why = llamacpp.unusable(str(path))
    if why is not None:
        pytest.skip(why)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_llama_cpp_chooses_the_experts_transformers_chooses(moe_files, arch):
    """llama.cpp's own ffn_moe_topk-{il} (through its graph callback) on the F32 file: the sets transformers'
    router logits give, at every block and position."""
    from anatomy_cli.analyses.verify.llamacpp import quiet_fds
    from anatomy_cli.analyses.verify.llamacpp_moe import llama_topk

    src, path, _ = moe_files[arch]
    _llama_cpp(path)
    ids = engine.encode(engine.load(str(path), device="cpu"), [PROMPT])[0].ids
    with quiet_fds():
        [theirs] = llama_topk(str(path), [ids])
    ref = routing(src, ids)
    assert sorted(theirs) == sorted(ref)
    for b, (idx, _) in ref.items():
        assert theirs[b].shape == idx.shape
        assert [sorted(r) for r in theirs[b].tolist()] == [sorted(r) for r in idx.tolist()], b


@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_verify_against_llama_cpp_on_a_moe_gguf(moe_files, tmp_path, quant):
    """The section's expert row on the F32 file (every choice agrees) and on a Q8_0 one (llama.cpp's 8-bit
    activations flip near-ties only: measured 78/80 agreeing, the 2 differences below the 0.02 margin)."""
    from anatomy_cli.analyses.verify.llamacpp_moe import NAME

    src, path, _ = moe_files["qwen2_moe"]
    path = path if quant == "F32" else write_moe_gguf(tmp_path / "q8.gguf", "qwen2_moe", src, quant="Q8_0")
    _llama_cpp(path)
    [section] = _json("verify", "--model", str(path), "--against", "llama.cpp")["sections"]
    assert (section["name"], section["status"]) == ("llama.cpp", "passed"), section
    [row] = [c for c in section["checks"] if c["name"] == NAME]
    assert row["passed"] is True and row["error"] == 0, row
    if quant == "F32":
        assert "80/80 (block, position) choices agree" in row["note"], row


def test_llama_cpp_takes_torchs_thread_count_not_every_core():
    """Beside another test worker (or Ray worker) llama.cpp must not start a thread per core: it takes torch's count,
    which follows OMP_NUM_THREADS, capped at 8."""
    from anatomy_cli.analyses.verify.llamacpp_moe import llama_threads

    before = torch.get_num_threads()
    try:
        for n, want in ((1, 1), (3, 3), (16, 8)):
            torch.set_num_threads(n)
            assert llama_threads() == want
    finally:
        torch.set_num_threads(before)
