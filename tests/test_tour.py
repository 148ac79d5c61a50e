"""The README's tour runs as written after its two set-up commands (issue 42, item 1).

Each line of the tour block runs in-process in a fresh directory (the tour's own output files land there;
`docs/` is the clone's), with a fresh user config directory where the tour's `anatomy models --default smollm2`
lines have run. The lines without `--model` run on the default model: here `$ANATOMY_MODEL`, which overrides the
stored default, names a tiny random Llama of SmolLM2's tour-relevant shape (6 layers, 4 heads: every layer and
head the tour names exists) with GPT-2's tokenizer, so the whole tour takes seconds. The line whose comment
states the default model's own figure (`next "The capital of Germany is"`: " Berlin", p ≈ 0.796) runs on the
stored default, SmolLM2. Each line must exit 0 and print the figures, rows and files it promises
(tests/tour_checks.py: the tiny model's lines against transformers' own forward of it). Lines whose files the
README does not say how to make are skipped, by name, below. Timings are benchmarks' business, not this test's.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from tour_checks import Reference
from tour_checks import check
from typer.testing import CliRunner

from anatomy_cli.cli.main import app

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# Files a tour line names that the README does not say how to make, or makes in minutes (./my-sae: the fit-sae
# line, about 5 min on SmolLM2 on 2 busy cores; tests/test_fit_sae.py runs fit-sae then sae on a tiny model):
# ./tc: a transcoder folder (docs/commands/circuit.md says how to lay one out, and trains one with `fit-sae
# --transcoder --layer all`: 21 min on SmolLM2 on 2 busy cores; tests/test_circuit.py runs circuit on tiny models,
# tests/test_fit_sae.py on fit-sae's folder); feats: what `features ./my-sae` writes (tests/test_explain.py runs
# features then explain on a tiny model): those lines are skipped.
UNMADE = ("./my-sae", "./my-moe", "./tc", "feats")
# The `diff` lines, after the requantizing recipe and `convert`: tests/test_requantize.py runs them as written with
# a tiny GGUF standing for smollm2 (on SmolLM2 itself the weights diff alone took about 55 s).
ON_A_TINY_GGUF = ("smollm2.Q8_0.gguf", "./source")


def tour_lines(start: str = "anatomy ") -> list[str]:
    """The lines of the README's tour block (the first bash block after '## A tour') that begin with ``start``."""
    tour = README[README.index("## A tour"):]
    block = re.search(r"```bash\n(.*?)```", tour, re.S).group(1)
    return [line for line in block.splitlines() if line.startswith(start)]


def tiny_llama(out: Path) -> Path:
    """A random Llama, 6 layers x 4 heads (2 KV heads), d_model 32, with GPT-2's tokenizer, saved to ``out``."""
    import torch
    from conftest import build_gpt2_tokenizer
    from transformers import LlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, num_hidden_layers=6, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=128,
                         bos_token_id=50256, eos_token_id=50256, pad_token_id=None)
    LlamaForCausalLM(config).save_pretrained(out)
    build_gpt2_tokenizer().save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def tour_dir(tmp_path_factory, smollm2_gguf):
    """A working directory with the clone's docs/, a user config directory where the tour's
    ``models --default`` lines have run (so each line can also run alone), and ``$ANATOMY_MODEL`` naming the
    tiny Llama."""
    work = tmp_path_factory.mktemp("tour")
    (work / "docs").symlink_to(ROOT / "docs")
    tiny = tiny_llama(work / "tiny-llama")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANATOMY_CONFIG_DIR", str(work / "config"))
        mp.setenv("ANATOMY_MODEL", str(tiny))
        mp.chdir(work)
        for line in tour_lines():
            if line.startswith("anatomy models --default"):
                result = CliRunner().invoke(app, shlex.split(line, comments=True)[1:])
                assert result.exit_code == 0, result.stderr
        yield work


@pytest.fixture(scope="module")
def reference(tour_dir):
    """The tiny Llama in plain transformers (eager attention, so its attention weights are returned)."""
    from transformers import AutoTokenizer
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(tour_dir / "tiny-llama", attn_implementation="eager").eval()
    return Reference(model, AutoTokenizer.from_pretrained(tour_dir / "tiny-llama"))


# The lines whose comment states the default model's own figures run on it (the stored default, SmolLM2).
ON_THE_DEFAULT = ('anatomy next "The capital of Germany is"',)


@pytest.mark.parametrize("line", tour_lines())
def test_tour_line_does_what_it_says(line, tour_dir, reference, cached_load, monkeypatch):
    args = shlex.split(line, comments=True)[1:]
    if unmade := [a for a in args if a in UNMADE]:
        pytest.skip(f"names {', '.join(unmade)}, which the README does not say how to make")
    if args[0] == "diff" and any(a in ON_A_TINY_GGUF for a in args):
        pytest.skip("runs in tests/test_requantize.py, on a tiny GGUF standing for smollm2")
    if line.startswith(ON_THE_DEFAULT):
        monkeypatch.delenv("ANATOMY_MODEL")
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, f"{line}\n{result.stderr}"
    check(line, args, result.stdout, result.stderr, tour_dir, reference)


def test_the_stored_default_is_smollm2(tour_dir, cached_load, monkeypatch):
    monkeypatch.delenv("ANATOMY_MODEL")
    result = CliRunner().invoke(app, ["next", "The capital of Germany is", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    import json

    data = json.loads(result.stdout)
    assert data["model"] == "smollm2" and data["top"][0]["token"] == "·Berlin"
    assert abs(data["top"][0]["probability"] - 0.796) < 0.001  # the tour's figure


def test_the_tour_uses_the_default_model_and_names_no_placeholder():
    lines = tour_lines()
    assert lines[:2] == ["anatomy models                       # models on this machine and their --model names "
                         "(HF cache, Ollama, LM Studio, packages)", lines[1]]
    assert lines[1].startswith("anatomy models --default smollm2")
    weight_lines = [ln for ln in lines if ln.split()[1] in ("next", "trace", "lens", "dla", "attn", "ablate")]
    assert weight_lines and not [ln for ln in weight_lines if "--model" in ln]  # the default does it
    assert "CLEAN" not in " ".join(lines) and "~/models" not in " ".join(lines)


OUTPUT_OPTIONS = ("--out", "-o", "--to", "--plot", "--save-control-vector")


def tour_outputs() -> list[str]:
    """The files and folders the tour's lines write into the clone: every output option's argument and the
    requantizing recipe's output file."""
    found = []
    for line in tour_lines("anatomy ") + tour_lines("python "):
        words = shlex.split(line.split("#")[0])
        found += [words[i + 1] for i, w in enumerate(words[:-1]) if w in OUTPUT_OPTIONS]
        if words[:2] == ["python", "docs/examples/requantize.py"]:
            found.append(words[3])
    return found


def test_what_the_tour_writes_is_ignored_by_git():
    """Following the README from a clone leaves `git status` clean: its outputs (538 MB under source/, GGUFs,
    run folders, pictures) are in .gitignore."""
    import shutil
    import subprocess

    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git clone")
    outputs = tour_outputs()
    assert {"./source", "smollm2.Q8_0.gguf", "run1", "report.html", "lens.png", "joy.gguf"} <= set(outputs)
    for path in outputs:
        probe = path.rstrip("/") + ("/x" if path in ("./source", "run1") else "")
        done = subprocess.run([git, "check-ignore", "-q", "--no-index", probe], cwd=ROOT, check=False)
        assert done.returncode == 0, f"{path} (the tour writes it) is not in .gitignore"


# ---------------------------------------------------------------- issue 61 item 3

FITS = ("fit-lens", "fit-sae")
# The tour's fits stay small (about a minute on SmolLM2 here; their comments give the full settings' cost).
SMALL = {"--tokens": 1000, "--max-tokens": 2000, "--ctx": 128, "--epochs": 2, "--steps": 4}


def test_each_fit_line_says_its_cost_and_its_full_settings_and_runs_small():
    """A fit line (and the circuit line, whose ./tc a fit makes) says beside it how long it takes here, that its
    result is too weak to read and what the full settings cost; its settings are the small ones."""
    lines = [ln for ln in tour_lines() if ln.split()[1] in FITS or "--transcoders ./tc" in ln]
    assert len(lines) == 4, lines
    for line in lines:
        comment = line.split("#", 1)[1]
        assert re.search(r"about \d+ (s|min|h)\b.* here", comment), line
        assert "too weak to read" in comment or "too few" in comment or "too little" in comment, line
        words = shlex.split(line.split("#")[0])
        for flag, most in SMALL.items():
            if flag in words:
                assert int(words[words.index(flag) + 1]) <= most, (line, flag)
    sae = next(ln for ln in lines if ln.split()[1] == "fit-sae")
    tuned = next(ln for ln in lines if ln.split()[1:3] == ["fit-lens", "tuned"])
    assert "--max-tokens" in sae.split("#")[0] and "--tokens" in tuned.split("#")[0]
    assert "--tokens 100000" in tuned.split("#")[1] and "--max-tokens 8000" in sae.split("#")[1]  # the full ones
