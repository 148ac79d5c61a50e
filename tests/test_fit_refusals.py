"""Issue 61, items 6 and 7: what a model's config or the file system answers is refused before the weights load
(the fits' --out folders, --checkpoint, blocks out of range, prompts too short; the API as the CLI), and
`fit-lens merge` refuses a fit given twice and fits that share a prompt (their files' prompt hashes).

"Before the load" is proved by the loader's weights phase failing the test if it is reached (every front end loads
through ``engine.loader.DIRECT``); each refusal is one ``error:`` line with exit 2."""

from __future__ import annotations

import hashlib
import shutil

import pytest
import torch
from typer.testing import CliRunner

from anatomy_cli import api
from anatomy_cli.cli.main import app
from anatomy_cli.errors import UsageError

runner = CliRunner()
TEXT = "The quick brown fox jumps over the lazy dog because it was tired of running in the sun"
OTHER = "Once upon a time there was a small village at the edge of a dark forest"
THIRD = "In the beginning the universe was created and this has made a lot of people very angry"


@pytest.fixture
def no_weights(monkeypatch):
    """The weights phase fails the test: whatever is refused after this was refused before the load."""
    from anatomy_cli.engine import loader

    monkeypatch.setattr(loader.DIRECT, "load_weights", lambda opened: pytest.fail("the weights were loaded"))


def _one_line_usage(res, message):
    assert res.exit_code == 2 and message in res.output, res.output
    assert [line for line in res.output.splitlines() if line.strip()] == [line for line in res.output.splitlines()
                                                                          if line.startswith("error: ")], res.output


JACOBIAN = {  # args (OUT: a new file; DIR: tmp_path; PROMPTS: the prompts file), the error
    "missing folder": (["--out", "DIR/missing/lens.pt"], "--out DIR/missing/lens.pt: the folder DIR/missing does not "
                       "exist"),
    "folder a file": (["--out", "PROMPTS/lens.pt"], "the folder PROMPTS is not a folder"),
    "folder not writable": (["--out", "/proc/lens.pt"], "--out /proc/lens.pt: no permission to write in /proc"),
    "out a folder": (["--out", "DIR"], "--out DIR is a directory; give the file to write"),
    "checkpoint folder": (["--out", "OUT", "--checkpoint", "DIR/missing/c.pt"], "--checkpoint DIR/missing/c.pt: the "
                          "folder DIR/missing does not exist"),
    "source out of range": (["--out", "OUT", "--source-layers", "40"], "--source-layers 40 is out of range"),
    "target 0": (["--out", "OUT", "--target-layer", "0"], "--target-layer 0 leaves no block below it to fit"),
    "target out of range": (["--out", "OUT", "--target-layer", "9"], "--target-layer 9 is out of range"),
    "prompts too short": (["--out", "OUT", "--skip-first", "30"], "no prompt is long enough to fit on: each needs "
                          "at least 32 tokens"),
    "shard's prompts too short": (["--out", "OUT", "--shard", "1/2", "--skip-first", "4"], "no prompt is long "
                                  "enough to fit on: each needs at least 6 tokens"),  # prompt 1 is "short"
}


@pytest.mark.parametrize("case", sorted(JACOBIAN))
def test_fit_lens_jacobian_refuses_before_the_weights_load(case, tiny_model_dir, tmp_path, no_weights):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"{TEXT}\nshort\n{OTHER}\n")
    places = {"DIR": str(tmp_path), "PROMPTS": str(prompts), "OUT": str(tmp_path / "lens.pt")}

    def put(text):
        for key, value in places.items():
            text = text.replace(key, value)
        return text

    args, message = JACOBIAN[case]
    res = runner.invoke(app, ["fit-lens", "jacobian", "--model", str(tiny_model_dir("llama")), "--prompts",
                              str(prompts), *map(put, args)])
    _one_line_usage(res, put(message))
    assert not (tmp_path / "lens.pt").exists()


@pytest.mark.parametrize("command", ["fit-lens tuned", "fit-sae"])
def test_a_missing_folder_is_refused_before_the_weights_load(command, tiny_model_dir, tmp_path, no_weights):
    model = str(tiny_model_dir("llama"))
    corpus = tmp_path / "c.txt"
    corpus.write_text(" ".join([TEXT, OTHER, THIRD] * 8))
    missing = tmp_path / "missing"
    args = (["fit-lens", "tuned", "--corpus", str(corpus), "--tokens", "64"] if command == "fit-lens tuned" else
            ["fit-sae", str(corpus), "--layer", "1", "--ctx", "8", "--max-tokens", "64"])
    res = runner.invoke(app, [*args, "--model", model, "--out", str(missing / "out")])
    _one_line_usage(res, f"--out {missing / 'out'}: the folder {missing} does not exist")
    assert not missing.exists()


API = {
    "fit_lens source": (lambda m, p: api.fit_lens(m, "jacobian", [TEXT], out=p / "l.pt", source_layers=[40]),
                        "source_layers= 40 is out of range"),
    "fit_lens target": (lambda m, p: api.fit_lens(m, "jacobian", [TEXT], out=p / "l.pt", target_layer=0),
                        "target_layer= 0 leaves no block below it"),
    "fit_lens short": (lambda m, p: api.fit_lens(m, "jacobian", ["short"], out=p / "l.pt"), "no prompt is long"),
    "fit_lens folder": (lambda m, p: api.fit_lens(m, "jacobian", [TEXT], out=p / "no" / "l.pt"), "does not exist"),
    "fit_sae layer": (lambda m, p: api.fit_sae(m, p / "c.txt", layer=99, out=p / "sae", ctx=8, max_tokens=64),
                      "layer= 99 is out of range"),
    "lens_eval width": (lambda m, p: api.lens_eval(m, {"items": [{"prompt": TEXT, "intermediates": ["dog"]}]},
                                                   lens=f"jacobian:{p / 'wide.pt'}"), "fitted for d_model 7"),
    "lens layers": (lambda m, p: api.lens(m, TEXT, layers="9"), "layers= 9 is out of range"),
    "generate context": (lambda m, p: api.generate(m, TEXT, max_new_tokens=10**6), "context"),
    "attribute target": (lambda m, p: api.attribute(m, TEXT, target_id=10**9), "1000000000"),
}


@pytest.mark.parametrize("case", sorted(API))
def test_the_api_refuses_before_the_weights_load_as_the_command_does(case, tiny_model_dir, tmp_path, no_weights):
    (tmp_path / "c.txt").write_text(" ".join([TEXT, OTHER, THIRD] * 8))
    torch.save({"J": {0: torch.eye(7)}, "n_prompts": 1, "source_layers": [0], "d_model": 7}, tmp_path / "wide.pt")
    call, message = API[case]
    with pytest.raises(UsageError, match=message):
        call(str(tiny_model_dir("llama")), tmp_path)


def _fit(lm, texts, out, **kw):
    return api.fit_lens(lm, "jacobian", texts, out=out, skip_first=4, dim_batch=16, dtype="fp32", source_layers=[0],
                        **kw)


def _merge(*files, out):
    return runner.invoke(app, ["fit-lens", "merge", *map(str, files), "--out", str(out), "--dtype", "fp32"])


def test_merge_refuses_a_fit_given_twice_and_fits_that_share_a_prompt(tiny_lm, tmp_path):
    from anatomy_cli.tasks.session import encode

    lm = tiny_lm("llama")
    a, b, ab, copy = (tmp_path / f for f in ("a.pt", "b.pt", "ab.pt", "copy.pt"))
    _fit(lm, [TEXT, "short"], a)
    _fit(lm, [OTHER, THIRD], b)
    _fit(lm, [TEXT, OTHER], ab)
    shutil.copy(a, copy)
    # the hashes are a sha256 of each fitted prompt's token ids (the short prompt is skipped, so not recorded)
    ids = [list(e.ids) for e in encode(lm, [TEXT])]
    assert torch.load(a, weights_only=True)["prompt_hashes"] == [hashlib.sha256(repr(ids[0]).encode()).hexdigest()]
    out = tmp_path / "m.pt"
    _one_line_usage(_merge(a, a, out=out), f"fit-lens merge: {a} is given twice: give each fit once")
    _one_line_usage(_merge(a, tmp_path / "." / "a.pt", out=out), f"fit-lens merge: {a} is given twice")
    _one_line_usage(_merge(a, tmp_path / "sub" / ".." / "a.pt", out=out), "are the same file")
    _one_line_usage(_merge(a, copy, out=out), f"fit-lens merge: {a} and {copy} share 1 prompt (their prompt hashes)")
    _one_line_usage(_merge(b, a, ab, out=out), f"fit-lens merge: {b} and {ab} share 1 prompt")
    assert not out.exists()
    res = _merge(a, b, out=out)
    assert res.exit_code == 0, res.output
    merged = torch.load(out, weights_only=True)
    assert merged["n_prompts"] == 3
    assert merged["prompt_hashes"] == [h for f in (a, b) for h in torch.load(f, weights_only=True)["prompt_hashes"]]
    # a merged file is merged again only with fits of other prompts
    _one_line_usage(_merge(out, ab, out=tmp_path / "m2.pt"), f"{out} and {ab} share 2 prompts")


def test_merge_of_files_written_before_the_hashes(tiny_lm, tmp_path):
    """An older file (no prompt_hashes) given twice under two names is the same fit: refused; older files of
    different fits merge, with a warning, into a file that records no hashes (it cannot vouch for them)."""
    lm = tiny_lm("llama")
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    _fit(lm, [TEXT], a)
    _fit(lm, [OTHER], b)
    for f in (a, b):
        state = torch.load(f, weights_only=True)
        del state["prompt_hashes"]
        torch.save(state, f)
    shutil.copy(a, tmp_path / "copy.pt")
    out = tmp_path / "m.pt"
    res = _merge(a, tmp_path / "copy.pt", out=out)
    assert res.exit_code == 2 and f"{a} and {tmp_path / 'copy.pt'} hold the same fit" in res.output, res.output
    assert "records no prompt hashes" in res.output
    res = _merge(a, b, out=out)
    assert res.exit_code == 0, res.output
    assert res.output.count("records no prompt hashes") == 2
    merged = torch.load(out, weights_only=True)
    assert merged["n_prompts"] == 2 and "prompt_hashes" not in merged
