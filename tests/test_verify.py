"""`anatomy verify` (issue 37): passes on tiny families, a padded vocabulary and the real SmolLM2; fails, exit 1,
naming the point, when a fault is injected (a tap on the wrong module, rotary skipped, the final norm twice).

The references are transformers' own forward (the command's parity section) and identities; the faults are
injected into anatomy only, so a check that still passed would be one that sees nothing."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import engine
from anatomy_cli.analyses.verify import checks as C
from anatomy_cli.analyses.verify.suite import Plan
from anatomy_cli.analyses.verify.suite import verify
from anatomy_cli.cli.main import app
from anatomy_cli.engine.loader import DIRECT
from anatomy_cli.engine.loader import using_loader
from anatomy_cli.models.adapters import Tap

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["The capital of France is", "Thank you very much for the help", "a b"]
runner = CliRunner()


class FixedLoader:
    """Opens the files as users do; the weights are ``lm`` (already loaded, maybe with a fault)."""

    def __init__(self, lm):
        self.lm = lm

    def open(self, spec):
        return DIRECT.open(spec)

    def load_weights(self, opened):
        return dataclasses.replace(self.lm, name=opened.spec.model)


def _run(lm, model: str, *args: str):
    with using_loader(FixedLoader(lm)):
        return runner.invoke(app, ["verify", "--model", model, "--device", "cpu", *args])


def _verify(lm, path, *, quick=True, prompts=PROMPTS):
    enc = engine.encode(lm, prompts)
    return verify(lm, enc, lambda dtype, device: engine.load(str(path), dtype=dtype, device=device),
                  Plan(against="transformers", quick=quick))


def _failed(result) -> set[str]:
    return {f"{s}: {c.label}" for s, c in result.failed}


@pytest.mark.parametrize("arch", ["gpt2", "llama", "gemma3", "gpt_neox", "bert"])
def test_passes_on_tiny_families(tiny_lm, tiny_model_dir, arch):
    result = _verify(tiny_lm(arch), tiny_model_dir(arch))
    assert result.passed, _failed(result)
    names = {c.name for s in result.sections for c in s.checks if c.passed}
    assert {"resid_pre", "resid_post", "attention", "batched == one by one"} <= names
    if arch != "bert":   # post-LN: decomposition skipped, and said
        assert {"resid_post = pre + attn + mlp", "lens == logits", "DLA rows sum to logit diff",
                "self-patch changes nothing", "attribution patching == exact (linear metric)",
                "jacobian lens J = I == logit lens", "tuned lens A = 0, b = 0 == logit lens"} <= names
    else:
        skipped = [c for s in result.sections for c in s.checks if c.passed is None]
        assert any("post-LN" in c.note for c in skipped)


def test_numbers_are_the_comparisons(tiny_lm):
    # A row's numbers are those of the two tensors, computed here independently.
    a, b = torch.tensor([[1.0, 2.0], [3.0, 4.0]]), torch.tensor([[1.0, 2.0], [3.0, 4.5]])
    row = C.tensor_check("x", a, b, 0.1)
    assert row.max_abs == pytest.approx(0.5) and row.rel_error == pytest.approx(0.5 / float(b.norm()))
    assert row.cosine == pytest.approx(float(a.flatten() @ b.flatten()) / (a.norm() * b.norm()).item())
    assert row.passed and not C.tensor_check("x", a, b, 0.01).passed
    assert C.tensor_check("x", a, b[:1], 1.0).passed is False          # shapes differ: a failure, not a crash


def test_padded_vocabulary_and_random_init_full_run(tmp_path, tiny_model_dir):
    import models
    import transformers
    from conftest import build_gpt2_tokenizer

    config = transformers.GPTNeoXConfig(**{**models.config_kwargs("gpt_neox"), "vocab_size": 50304})
    torch.manual_seed(0)
    transformers.GPTNeoXForCausalLM(config).eval().save_pretrained(tmp_path)
    build_gpt2_tokenizer().save_pretrained(tmp_path)
    lm = dataclasses.replace(engine.load(str(tmp_path), device="cpu"), untrained=True)   # random weights
    assert lm.vocab_size == 50304 > len(lm.tokenizer)
    # every section, --init random: the known answers are skipped, and said so, exit 0
    out = _run(lm, str(tmp_path), "--init", "random", "--against", "transformers", "--format", "json")
    assert out.exit_code == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["passed"] and [s["name"] for s in data["sections"]] == ["parity", "identities", "precision",
                                                                         "devices", "known"]
    sections = {s["name"]: s for s in data["sections"]}
    assert sections["parity"]["status"] == "passed" and sections["identities"]["status"] == "passed"
    assert sections["known"]["status"] == "skipped" and "untrained" in sections["known"]["checks"][0]["note"]
    assert sections["precision"]["checks"][0]["passed"] is None       # fp32: its own control, said


# ---------------------------------------------------------------- faults: exit 1, naming the point

def test_fault_wrong_tap_fails_naming_the_point(tiny_lm, tiny_model_dir):
    from anatomy_cli.engine.hooks import build_points

    lm = tiny_lm("llama")
    wrong = dataclasses.replace(lm.adapter, attn_out=Tap("input_layernorm"))   # attention's input norm, not it
    bad = dataclasses.replace(lm, points=build_points(lm.model, wrong, lm.has_resid_mid, lm.has_unembed))
    out = _run(bad, str(tiny_model_dir("llama")), "--quick", "--format", "json")
    assert out.exit_code == 1
    error = [line for line in out.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "identities: resid_post = pre + attn + mlp L0" in error[0], out.stderr
    data = json.loads(out.stdout)
    assert data["passed"] is False and "identities: resid_mid = pre + attn L1" in data["failed"]
    assert not any(f.startswith("parity") for f in data["failed"])      # the residual stream itself is right
    # the same model without the fault passes, exit 0
    ok = _run(lm, str(tiny_model_dir("llama")), "--quick", "--format", "json")
    assert ok.exit_code == 0, ok.stderr and json.loads(ok.stdout)["passed"] is True


def test_fault_rotary_skipped_fails_parity(tiny_lm, tiny_model_dir, monkeypatch):
    import importlib

    fwd = importlib.import_module("anatomy_cli.engine.forwarding")   # the module (engine.forward is the function)

    real = fwd.forward

    def no_rotary(lm, *args, **kw):   # every position at angle 0: the rotary embedding does nothing
        if "position_ids" in kw:
            kw["position_ids"] = torch.zeros_like(kw["position_ids"])
        return real(lm, *args, **kw)

    monkeypatch.setattr(fwd, "forward", no_rotary)
    result = _verify(tiny_lm("llama"), tiny_model_dir("llama"))
    failed = _failed(result)
    assert "parity: resid_post L0" in failed and "parity: logits" in failed, failed
    assert "parity: resid_pre L0" not in failed                          # the embedding has no position


def test_fault_final_norm_twice_fails_lens_and_last_layer(tmp_path, monkeypatch):
    import models
    import transformers
    from conftest import build_gpt2_tokenizer

    from anatomy_cli.engine import lens

    # A final norm whose weight is not uniform, so applying it twice is not the same as once.
    model = models.build_model("llama")
    with torch.no_grad():
        model.model.norm.weight.copy_(1 + 0.5 * torch.randn(models.D, generator=torch.Generator().manual_seed(1)))
    model.save_pretrained(tmp_path)
    build_gpt2_tokenizer().save_pretrained(tmp_path)
    assert isinstance(model, transformers.LlamaForCausalLM)
    lm = engine.load(str(tmp_path), device="cpu")
    assert _verify(lm, tmp_path).passed
    once = lens.final_norm
    monkeypatch.setattr(lens, "final_norm", lambda lm, h, **kw: once(lm, once(lm, h, **kw), **kw))
    out = _run(lm, str(tmp_path), "--quick")
    assert out.exit_code == 1
    error = next(line for line in out.stderr.splitlines() if line.startswith("error: "))
    assert "parity: resid_post L1" in error and "identities: lens == logits L1" in error, error


def test_neutral_fitted_lenses_read_exactly_the_logit_lens_and_a_fault_fails_the_section(tiny_lm, tiny_model_dir,
                                                                                        monkeypatch):
    """J = identity and zero translators, built in memory, read the logit lens exactly (error 0 at fp32 on the CPU:
    h @ I and h + h @ 0 + 0 are h); a fitted-lens reading turned off its direction (1% of its own dimensions shifted
    by one; no norm undoes that, as it would a scale or a shift) fails both rows, named under identities."""
    from anatomy_cli.analyses.verify.fitted import JACOBIAN
    from anatomy_cli.analyses.verify.fitted import TUNED
    from anatomy_cli.analyses.verify.fitted import neutral_lenses
    from anatomy_cli.engine.fitted_lens import FittedLens

    lm, path = tiny_lm("llama"), tiny_model_dir("llama")
    lenses = neutral_lenses(lm.d_model, lm.n_layers)
    assert lenses[JACOBIAN].rows == tuple(range(1, lm.n_layers + 1)) and lenses[TUNED].rows[0] == 0
    rows = {c.name: c for s in _verify(lm, path).sections for c in s.checks}
    assert rows[JACOBIAN].passed and rows[JACOBIAN].error == 0.0
    assert rows[TUNED].passed and rows[TUNED].error == 0.0
    right = FittedLens.transform
    monkeypatch.setattr(FittedLens, "transform",
                        lambda self, resid: right(self, resid) + 0.01 * right(self, resid).roll(1, dims=-1))
    out = _run(lm, str(path), "--quick")
    assert out.exit_code == 1
    error = next(line for line in out.stderr.splitlines() if line.startswith("error: "))
    assert f"identities: {JACOBIAN}" in error and f"identities: {TUNED}" in error, error
    assert "parity" not in error and "lens == logits" not in error   # only the fitted reading is off


# ---------------------------------------------------------------- the real SmolLM2, the command's output

def test_smollm2_quick_passes_and_json_keys_are_documented(smollm2_lm, smollm2_gguf):
    out = _run(smollm2_lm, str(smollm2_gguf), "--quick", "--format", "json")
    assert out.exit_code == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["passed"] is True and data["counts"]["failed"] == 0 and data["quick"] is True
    assert [s["name"] for s in data["sections"]] == ["parity", "identities"]
    assert len(data["prompts"]) == 2
    parity = data["sections"][0]["checks"]
    assert sum(c["name"] == "resid_post" for c in parity) == smollm2_lm.n_layers
    doc = (ROOT / "docs" / "commands" / "verify.md").read_text()
    keys = set(data) | set(data["sections"][0]) | set(parity[0]) | set(data["counts"])
    missing = [k for k in sorted(keys) if not re.search(rf"`{re.escape(k)}`", doc)]
    assert not missing, missing


def test_usage_errors(tiny_lm, tiny_model_dir, tmp_path):
    lm, model = tiny_lm("gpt2"), str(tiny_model_dir("gpt2"))
    out = _run(lm, model, "--prompts", str(tmp_path / "nope.txt"))
    assert out.exit_code == 2 and "no such file" in out.stderr
    out = _run(lm, model, "--against", "vllm")
    assert out.exit_code == 2
    (tmp_path / "empty.txt").write_text("\n  \n")
    out = _run(lm, model, "--prompts", str(tmp_path / "empty.txt"))
    # the file is named, not stdin (issue 51)
    assert out.exit_code == 2 and out.stderr.strip() == (f"error: --prompts {tmp_path / 'empty.txt'}: no prompts in "
                                                         "the file: every line was empty"), out.stderr


class NoWeights(FixedLoader):
    """Opens the files; loading the weights is a test failure (a refusal must come before it)."""

    def load_weights(self, opened):
        raise AssertionError("the weights were loaded")


def test_against_llamacpp_that_cannot_run_fails_before_the_weights(tiny_lm, tiny_model_dir, tmp_path, monkeypatch):
    # issue 51: `--against llama.cpp` without llama-cpp-python (or on a model that is not a .gguf file) exited 0
    # having checked nothing. A section asked for by name that cannot run is a failure: exit 1, one line.
    from test_gguf import write_tiny_gguf

    def run(model, *args):
        with using_loader(NoWeights(None)):
            return runner.invoke(app, ["verify", "--model", model, "--device", "cpu", "--against", "llama.cpp",
                                       *args])

    out = run(str(tiny_model_dir("llama")))
    assert out.exit_code == 1, (out.stdout, out.stderr)
    assert out.stderr.strip() == "error: --against llama.cpp checks nothing here: the model is not a .gguf file"
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)           # `import llama_cpp` fails
    out = run(str(gguf))
    assert out.exit_code == 1 and out.stdout == "", (out.stdout, out.stderr)
    assert out.stderr.strip() == ("error: --against llama.cpp checks nothing here: llama-cpp-python is not installed "
                                  "(in a clone of anatomy: pip install -e '.[llamacpp]'; docs/commands/verify.md has "
                                  "the build recipe)")
    out = run(str(gguf), "--init", "random")
    assert out.exit_code == 1 and "random weights (--init random)" in out.stderr
    # the API refuses the same way (its result would check nothing)
    import anatomy_cli as anatomy
    from anatomy_cli.errors import AnatomyError

    # in the API's words (api/_declared.py: the keyword, not the flag)
    with pytest.raises(AnatomyError, match=r"^against= llama.cpp checks nothing here: the model is not a .gguf"):
        anatomy.verify(anatomy.load(str(tiny_model_dir("llama"))), against="llama.cpp")
    # --against all keeps it a skipped row (llama.cpp "where it is installed"); asked for by name, a failed one
    from anatomy_cli.analyses.verify.llamacpp import against_llamacpp

    assert [c.passed for c in against_llamacpp(None, None).checks] == [None]
    row = against_llamacpp(None, None, required=True).checks[0]
    assert row.passed is False and row.note == "the model is not a .gguf file"


def _sections():
    """Three sections as a run would give them: a failure among passes, a known answer, nothing that ran."""
    return C.Verification((
        C.SectionResult("parity", "parity", (C.scalar_check("a", 0.0, 1e-5), C.scalar_check("b", 3e-3, 1e-3),
                                             C.scalar_check("c", 9e-6, 1e-5))),
        C.SectionResult("known", "known", (C.skipped("prev", "no heads"), C.score_check("induction", 0.9, 0.3),
                                           C.score_check("ioi", 0.8, 0.7))),
        C.SectionResult("llama.cpp", "GGUF against llama.cpp", (C.skipped("llama.cpp", "not a gguf"),)),
    ))


def test_summary_is_one_line_per_section_and_detail_the_rows(tiny_lm, tiny_model_dir, monkeypatch):
    # issue 51: one line per section on a terminal (the table), with --detail every row; tsv and json keep the
    # rows; json gains the summary. The worst row of each section is picked here by hand.
    from anatomy_cli.analyses.verify import suite

    monkeypatch.setattr(suite, "verify", lambda lm, enc, reload, plan, progress: _sections())
    lm, model = tiny_lm("gpt2"), str(tiny_model_dir("gpt2"))
    out = _run(lm, model, "--quick", "--format", "table")
    assert out.exit_code == 1 and "1 check failed: parity: b" in out.stderr
    lines = [" ".join(line.split()) for line in out.stdout.splitlines()]
    # parity: b failed (3e-3 against 1e-3); known: ioi is nearest its threshold (0.7 / 0.8 > 0.3 / 0.9)
    assert any(line.startswith("1. parity failed 2 1 0 b 0.0030 ≤ 0.001") for line in lines), lines
    assert any(line.startswith("5. known passed 2 0 1 ioi 0.8000 ≥ 0.7") for line in lines), lines
    assert any(line.startswith("6.") and "skipped 0 0 1" in line and line.endswith("not a gguf") for line in lines)
    assert not any(line.startswith(("a ", "c ", "induction")) for line in lines)      # no row of its own
    assert "--detail for every row" in out.stdout
    detail = _run(lm, model, "--quick", "--format", "table", "--detail").stdout
    titles = [line.strip() for line in detail.splitlines() if re.match(r"\s*\d\. ", line)]
    assert titles == ["1. parity", "5. known", "6. GGUF against llama.cpp"]         # the docs' numbers
    assert sum(line.split()[:1] in (["a"], ["b"], ["c"], ["induction"], ["ioi"]) for line in detail.splitlines()) == 5
    tsv = _run(lm, model, "--quick").stdout                        # piped: tsv, every row as before
    assert [line.split("\t")[0] for line in tsv.splitlines() if line and not line.startswith("check")] == [
        "a", "b", "c", "prev", "induction", "ioi", "llama.cpp"]
    data = json.loads(_run(lm, model, "--quick", "--format", "json").stdout)
    assert [len(s["checks"]) for s in data["sections"]] == [3, 3, 1]
    assert [(s["name"], s["status"], s["counts"], s["worst"] and s["worst"]["name"], s["note"])
            for s in data["summary"]] == [
        ("parity", "failed", {"passed": 2, "failed": 1, "skipped": 0}, "b", ""),
        ("known", "passed", {"passed": 2, "failed": 0, "skipped": 1}, "ioi", ""),
        ("llama.cpp", "skipped", {"passed": 0, "failed": 0, "skipped": 1}, None, "not a gguf")]


def test_docs_number_the_sections_as_the_output_does():
    # issue 51: the output numbered 6 sections where the page said 5.
    from anatomy_cli.output.views.verify import NUMBERS

    doc = (ROOT / "docs" / "commands" / "verify.md").read_text()
    listed = {name: int(n) for n, name in re.findall(r"^(\d)\. \*\*([\w.]+)\*\*", doc, re.M)}
    assert listed == NUMBERS and "six sections" in doc


def test_llamacpp_section_against_smollm2(smollm2_lm, smollm2_gguf):
    from anatomy_cli.analyses.verify import llamacpp

    why = llamacpp.unusable(str(smollm2_gguf))
    if why is not None:
        pytest.skip(why)
    out = _run(smollm2_lm, str(smollm2_gguf), "--against", "llama.cpp", "--format", "json")
    assert out.exit_code == 0, out.stderr
    section = json.loads(out.stdout)["sections"][-1]
    assert section["name"] == "llama.cpp" and section["status"] == "passed"
    assert "llama" not in out.stderr.lower()          # llama.cpp's log lines stay off the streams


# ---------------------------------------------------------------- --plot: the page and the picture of the rows

def _synthetic():
    rows = (C.scalar_check("a", 0.0, 1e-5), C.scalar_check("b", 3e-3, 1e-3), C.skipped("c", "no device"),
            C.score_check("induction", 0.9, 0.3))
    return C.Verification((C.SectionResult("one", "one", rows[:2]), C.SectionResult("two", "two", rows[2:])))


def test_plot_pages_carry_every_row_with_its_colour(tmp_path):
    from test_html import figure_data

    from anatomy_cli.output import plots
    from anatomy_cli.output.verify_rows import COLOURS

    result, cap = _synthetic(), plots.Caption("verify", "m", None, "fp32 on cpu")
    page = plots.draw("verify", tmp_path / "v.html", None, result, cap)
    traces = figure_data(page)
    assert len(traces) == 2                                      # one figure per section with a measured row
    (one, one_limit), (two, two_limit) = traces
    assert one["x"] == [1e-6, 3e-3] and one_limit["x"] == [1e-5, 1e-3]   # 0 drawn a decade below the smallest
    assert one["marker"]["color"] == [COLOURS["pass"], COLOURS["FAIL"]]
    assert two["x"] == [None, 0.9] and two["marker"]["color"] == [COLOURS["skip"], COLOURS["pass"]]
    text = page.read_text(encoding="utf-8")
    assert "no device" in text and "≥ 0.3" in text            # the table under the figure has the skipped row
    png = plots.draw("verify", tmp_path / "v.png", None, result, cap)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.usefixtures("cached_load")
def test_api_is_the_commands_json_and_plot_writes_its_rows(tiny_model_dir, tmp_path):
    # anatomy.verify(...).to_dict() is `anatomy verify --format json`; the same run's --plot page has its rows.
    from test_html import figure_data

    import anatomy_cli as anatomy

    path = str(tiny_model_dir("gpt2"))
    api = anatomy.verify(anatomy.load(path), quick=True, against="transformers")
    out = runner.invoke(app, ["verify", "-m", path, "--quick", "--against", "transformers", "--format", "json",
                              "--plot", str(tmp_path / "v.html")])
    assert out.exit_code == 0, out.stderr
    data = json.loads(out.stdout)
    assert json.loads(json.dumps(api.to_dict())) == data and api.passed is True
    assert [s["name"] for s in api.rows] == ["parity", "identities"]
    assert f"wrote {tmp_path / 'v.html'}" in out.stderr
    measured = [fig[0]["x"] for fig in figure_data(tmp_path / "v.html")]
    assert len(measured) == len(data["sections"]) == 2
    for section, xs in zip(data["sections"], measured):
        errors = [c["error"] for c in section["checks"]]
        assert len(xs) == len(errors) and all(x > 0 for x in xs)   # zeros drawn at the floor, on the log axis
        assert [x for x, e in zip(xs, errors) if e > 0] == [e for e in errors if e > 0]


def test_devices_section_says_skipped_and_why_in_every_format(tiny_lm, tiny_model_dir, monkeypatch):
    # Without CUDA or MPS the devices section is one skipped row whose reason every format carries.
    from anatomy_cli.analyses.verify import precision
    from anatomy_cli.analyses.verify import suite
    from anatomy_cli.analyses.verify.runs import Runs

    monkeypatch.setattr(precision, "other_device", lambda lm: None)
    monkeypatch.setattr(suite, "verify", lambda lm, enc, reload, plan, progress: C.Verification(
        (precision.devices(Runs(lm, list(enc)), reload),)))
    lm, model = tiny_lm("gpt2"), str(tiny_model_dir("gpt2"))
    for fmt in ("table", "tsv", "csv", "json", "jsonl"):
        out = _run(lm, model, "--quick", "--format", fmt)
        assert out.exit_code == 0, out.stderr
        text = " ".join(out.stdout.split())
        assert "skip" in text and "no CUDA or MPS device here" in text, (fmt, out.stdout)
        if fmt.startswith("json"):
            section = json.loads(out.stdout)["sections"][0]
            assert section["status"] == "skipped" and section["checks"][0]["passed"] is None
            assert "no CUDA or MPS device here" in section["note"]


def test_the_llamacpp_file_is_the_one_behind_the_spec(smollm2_gguf, tiny_model_dir):
    """The llama.cpp section's file is ModelInfo.source, resolved once when the model is opened (a path or the
    packaged short name), not the spec re-resolved; none for a directory or random weights."""
    from anatomy_cli.models.spec import ModelSpec
    from anatomy_cli.tasks.session import open_model
    from anatomy_cli.tasks.verify import gguf_file

    for name in (str(smollm2_gguf), "smollm2"):
        info = open_model(ModelSpec(name)).info
        assert Path(gguf_file(info, untrained=False)).resolve() == Path(smollm2_gguf).resolve(), name
        assert gguf_file(info, untrained=True) is None
    assert gguf_file(open_model(ModelSpec(str(tiny_model_dir("llama")))).info, untrained=False) is None


def test_a_tall_section_has_its_x_axis_ticks_on_the_first_screen_too(tmp_path):
    # issue 51 item 9: on SmolLM2 section 1 has about 95 rows (1,800 px): its x axis, at the bottom, was below the
    # first screen. A figure taller than a screen gets the same log axis on top as well.
    from test_html import figure_layouts

    from anatomy_cli.output import plots

    rows = tuple(C.scalar_check(f"resid_post L{i}", 10.0 ** (-8 + i % 5), 1e-4) for i in range(95))
    result = C.Verification((C.SectionResult("parity", "parity", rows), C.SectionResult("two", "two", rows[:3])))
    page = plots.draw("verify", tmp_path / "v.html", None, result, plots.Caption("verify", "m", None, "fp32"))
    tall, short = figure_layouts(page)
    assert tall["height"] > 1000                                 # taller than a first screen
    top = tall["xaxis2"]
    assert top["side"] == "top" and top["overlaying"] == "x" and top["matches"] == "x" and top["type"] == "log"
    assert tall["margin"]["t"] >= 40                             # room for the top tick labels
    assert "xaxis2" not in short                                 # a short figure keeps one axis
