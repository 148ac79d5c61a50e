"""benchmarks/run.py keeps working: one tiny run produces the results table. No timing assertions."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import pytest
from conftest import random_clt

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "benchmarks" / "run.py"
GPT2_BPE = ROOT / "anatomy_cli" / "data" / "gpt2"  # GPT-2's BPE files, shipped in the package


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not (GPT2_BPE / "encoder.json").is_file(), reason=f"GPT-2 BPE files not found at {GPT2_BPE}")
def test_tiny_run_writes_the_table_and_keeps_other_sections(tmp_path, monkeypatch, capsys):
    out = tmp_path / "performance.md"
    out.write_text("# Performance\n\nIntro.\n\n## Offload\n\nOffload notes.\n", encoding="utf-8")
    raw = tmp_path / "samples.json"
    # Each figure costs two ~5 s subprocesses (importing torch and transformers' GPT-2): params, the 70B
    # config, cold start and the stdin batch are skipped to keep this near 20 s (run.py runs them alike). The
    # driver runs here (run.py's main, as its __main__ calls it): a third interpreter importing torch cost ~4 s.
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TIKTOKEN_CACHE_DIR"):  # main sets them: undone after
        monkeypatch.setenv(var, os.environ.get(var, ""))
    monkeypatch.chdir(tmp_path)
    code = _bench_module().main(
        ["--sizes", "tiny", "--runs", "1", "--warmup", "0", "--inproc-runs", "1",
         "--prompts", "16", "--skip", "params,params70b,cold,batch", "--max-wait", "0",
         "--out", str(out), "--json", str(raw)])
    assert code == 0, capsys.readouterr().err[-3000:]

    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Performance\n\nIntro.\n")
    assert "## Offload\n\nOffload notes.\n" in text  # another section survives
    section = text[text.index("## Results"):]
    assert "| figure | anatomy | baseline | ratio | target | pass |" in section
    assert re.search(r"- machine: .+, \d+ cores, [\d.]+ GiB RAM", section)
    assert re.search(r"torch [\w.+]+ \(\d+ threads\), transformers [\w.]+", section)
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| figure")
            and not line.startswith("| ---")]
    figures = [row.split(" | ")[0] for row in rows]
    for prefix in ("| 1. e2e `trace` (tiny", "| 6. peak RSS `trace` (tiny", "| 2. in-process trace (tiny"):
        assert any(f.startswith(prefix) for f in figures), (prefix, figures)
    for row in rows:
        cells = row.strip("|").split(" | ")
        assert len(cells) == 6, row
        assert cells[5].strip() in ("pass", "**FAIL**", "—"), row
        if cells[3].strip() != "—":
            assert float(cells[3]) > 0, row

    data = json.loads(raw.read_text())
    by_figure = {r["figure"]: r for r in data["rows"]}
    e2e = next(r for f, r in by_figure.items() if f.startswith("1. e2e"))
    assert len(e2e["samples"]["anatomy"]) == len(e2e["samples"]["baseline"]) == 1
    assert e2e["samples"]["top5_agree"] is True  # anatomy and the baseline predict the same tokens
    rss = next(r for f, r in by_figure.items() if f.startswith("6. "))
    assert 50e6 < rss["samples"]["anatomy"][0] < 4e9  # the command's own RSS, not the driver's


def test_write_section_replaces_only_results(tmp_path):
    bench = _bench_module()
    path = tmp_path / "p.md"
    bench.write_section(path, "## Results\n\nfirst\n")
    assert path.read_text().startswith("# Performance\n") and "first" in path.read_text()
    path.write_text(path.read_text() + "\n## Offload\n\nkept\n")
    bench.write_section(path, "## Results\n\nsecond\n")
    text = path.read_text()
    assert "first" not in text and "second" in text and "## Offload\n\nkept" in text
    assert text.index("## Results") < text.index("## Offload")
    assert text.count("## Results") == 1


def test_bench_splice_keeps_fit_sae_s_first_positions_and_equals_the_fit_s_splice(tiny_lm, tmp_path):
    """benchmarks/bench_splice.py's closed-loop splice (plain hooks on transformers' MLPs, the weights read from the
    written files) leaves each window's first position as the model computes it and measures the later ones, as
    fit-sae's held-out check does (``sae_fit.SKIPPED``, issue 62): its logits equal ``clt_fit.spliced_logits``' at
    that skip, its CE and KL the analyses' figures on them, and position 0's logits the clean forward's."""
    import torch

    from anatomy_cli.analyses.sae import next_token_ce
    from anatomy_cli.analyses.sae import next_token_kl
    from anatomy_cli.engine import clt_fit
    from anatomy_cli.engine.sae_fit import SKIPPED

    spec = importlib.util.spec_from_file_location("bench_splice", ROOT / "benchmarks" / "bench_splice.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    lm = tiny_lm("llama")
    n = lm.n_layers
    coder, theta, points = random_clt(lm, 16, 4, seed=3)
    clt_fit.save(coder, theta, tmp_path / "clt", scan="test", model_name="tiny")
    splicer = bench.Splicer("clt", bench.read_clt(tmp_path / "clt", n))
    ids = [1, 5, 9, 22, 7, 3, 14, 30]
    clean, spliced = clt_fit.spliced_logits(lm, ids, coder, theta, points, skip=SKIPPED)
    clean_all, clean_in, _, _ = bench.run(lm.model, torch.tensor(ids), None, set(), "open")
    logits, _, _, l0 = bench.run(lm.model, torch.tensor(ids), splicer, set(range(n)), "closed")
    torch.testing.assert_close(logits[SKIPPED:], spliced, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits[:SKIPPED], clean_all[:SKIPPED], rtol=0, atol=0)  # position 0 untouched
    assert not torch.allclose(logits[SKIPPED:], clean, atol=1e-2)  # the splice changed the rest
    assert bench.ce(logits, torch.tensor(ids)) == pytest.approx(next_token_ce(spliced, ids[SKIPPED:]), rel=1e-4)
    assert bench.kl(clean_all, logits) == pytest.approx(next_token_kl(clean, spliced), rel=1e-4)
    feats = splicer.features(0, clean_in[0])  # block 0 reads the clean input in either mode
    assert l0[0] == pytest.approx(float((feats[SKIPPED:] != 0).sum(-1).float().mean()))
