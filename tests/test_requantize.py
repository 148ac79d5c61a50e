"""The requantizing recipe of docs/quantization.md runs as written (issue 42, item 6), and so do the README tour's
lines that need its file.

The ```python block under "Requantizing a GGUF file" is docs/examples/requantize.py (tested equal), run as the tour
runs it (``python docs/examples/requantize.py smollm2 smollm2.Q8_0.gguf``), with a tiny F32 GGUF standing for ``smollm2`` (the packaged
name resolves to it). Its output reads back with gguf.GGUFReader, its matrices are Q8_0 (norms F32), its file type
says so, and anatomy loads it with logits close to the source's. Then the tour's `convert` line and both `diff`
lines run as written in the same directory. tests/test_diff_real.py makes its Q8_0 SmolLM2 with the same block.
"""

from __future__ import annotations

import re
import runpy
import shlex
import sys
from pathlib import Path

import pytest
import torch
from test_gguf import write_tiny_gguf
from test_tour import tour_lines
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "quantization.md"


def recipe() -> str:
    """The recipe's code, exactly as docs/quantization.md shows it."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## Requantizing a GGUF file"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def requantize(src: Path, out: Path, type_name: str = "Q8_0") -> Path:
    """The recipe's ``requantize`` function (the block run as a module, not as __main__)."""
    namespace: dict = {}
    exec(compile(recipe(), str(DOC), "exec"), namespace)
    namespace["requantize"](src, out, type_name)
    return out


SCRIPT = ROOT / "docs" / "examples" / "requantize.py"


def test_the_shipped_script_is_the_docs_block():
    assert SCRIPT.read_text(encoding="utf-8") == recipe()


def run_script(script: Path, args: list[str]) -> None:
    """``python docs/examples/requantize.py ARGS...`` in-process: the shipped file run as __main__."""
    argv = sys.argv
    sys.argv = [str(script), *args]
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv


@pytest.fixture(scope="module")
def tour(tmp_path_factory):
    """A directory where the tour's requantize line has run, ``smollm2`` standing for a tiny F32 GGUF meanwhile."""
    from anatomy_cli.models import packaged

    work = tmp_path_factory.mktemp("requant")
    tiny = write_tiny_gguf(work / "tiny-llama.F32.gguf")
    find = packaged.find
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(packaged, "find", lambda spec: tiny if spec == "smollm2" else find(spec))
        mp.chdir(work)
        [line] = tour_lines("python docs/examples/requantize.py")
        args = shlex.split(line, comments=True)
        run_script(ROOT / args[1], args[2:])
        yield work, tiny, work / args[3]


def test_the_recipe_writes_a_q8_0_file_that_loads_close_to_the_source(tour, capsys):
    import gguf
    from gguf import GGMLQuantizationType
    from gguf import GGUFReader

    from anatomy_cli import engine
    from anatomy_cli.models.headers import read_gguf

    _, tiny, out = tour
    src = read_gguf(tiny)  # anatomy's own header reader: GGUFReader takes seconds on a 50k vocabulary
    new = GGUFReader(out)
    types = {t.name: (len(t.shape), t.tensor_type) for t in new.tensors}
    assert sorted(types) == sorted(t.name for t in src.tensors)
    assert {ty for dims, ty in types.values() if dims == 2} == {GGMLQuantizationType.Q8_0}
    assert {ty for dims, ty in types.values() if dims == 1} == {GGMLQuantizationType.F32}
    assert new.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0
    for key in ("general.name", "llama.block_count", "llama.embedding_length"):  # metadata copied
        assert new.fields[key].contents() == src.fields[key]
    assert len(new.fields["tokenizer.ggml.tokens"].contents()) == src.array_lengths["tokenizer.ggml.tokens"]
    a, b = engine.load(str(tiny), device="cpu"), engine.load(str(out), device="cpu")
    ids = torch.tensor([a.tokenizer.hf("The capital of Germany is")["input_ids"]])
    with torch.no_grad():
        la, lb = a.model(input_ids=ids).logits[0], b.model(input_ids=ids).logits[0]
    rel = float((la - lb).norm() / la.norm())
    assert 0 < rel < 0.02, rel  # Q8_0's rounding: small, and not nothing
    assert torch.equal(la.argmax(-1), lb.argmax(-1))


def test_the_tours_convert_and_diff_lines_run_after_the_recipe(tour, monkeypatch):
    from anatomy_cli.cli.main import app
    from anatomy_cli.models import packaged

    work, tiny, out = tour
    find = packaged.find
    monkeypatch.setattr(packaged, "find", lambda spec: tiny if spec == "smollm2" else find(spec))
    monkeypatch.chdir(work)
    lines = [ln for ln in tour_lines() if ln.split()[1] in ("convert", "diff")]
    assert len(lines) == 3 and lines[0].startswith("anatomy convert smollm2 --to ./source")
    for line in lines:
        json_out = ["--format", "json"] if "diff" in line else []
        result = CliRunner().invoke(app, shlex.split(line, comments=True)[1:] + json_out)
        assert result.exit_code == 0, f"{line}\n{result.stderr}"
    assert (work / "source" / "model.safetensors").is_file() and out.is_file()
    import json

    data = json.loads(result.stdout)  # the last line: activations of smollm2 against its dequantized copy
    assert data["kl_nats"] < 1e-6
