"""Models by name (issue 26): ``ollama:NAME[:TAG]``, ``lmstudio:PUBLISHER/REPO`` and ``anatomy models``.

Fake Ollama and LM Studio trees are built in temporary folders around the tiny LLaMA GGUF file of
tests/test_gguf.py (GGUFWriter, F32, general.name ``tiny-llama``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.errors import CheckpointError
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.errors import UsageError
from anatomy_cli.models.resolve import check_path
from anatomy_cli.models.resolve import resolve

runner = CliRunner()
MODEL_MEDIA = "application/vnd.ollama.image.model"


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory) -> Path:
    from test_gguf import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("tiny-gguf") / "tiny-llama.F32.gguf")


def _manifest(root: Path, parts: tuple[str, ...], layers: list[dict] | str) -> Path:
    path = root / "manifests" / Path(*parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(layers if isinstance(layers, str) else
                    json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                                "layers": layers}))
    return path


@pytest.fixture
def ollama(tmp_path, tiny_file, monkeypatch) -> Path:
    """$OLLAMA_MODELS with library/tiny:latest, library/tiny:small (same blob) and me/tiny:v1."""
    root = tmp_path / "ollama-models"
    (root / "blobs").mkdir(parents=True)
    digest = hashlib.sha256(tiny_file.read_bytes()).hexdigest()
    os.symlink(tiny_file, root / "blobs" / f"sha256-{digest}")
    (root / "blobs" / "sha256-0123").write_text("{}")
    layers = [{"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:0123", "size": 2},
              {"mediaType": MODEL_MEDIA, "digest": f"sha256:{digest}", "size": tiny_file.stat().st_size}]
    for parts in [("registry.ollama.ai", "library", "tiny", "latest"), ("registry.ollama.ai", "library", "tiny", "small"),
                  ("registry.ollama.ai", "me", "tiny", "v1")]:
        _manifest(root, parts, layers)
    monkeypatch.setenv("OLLAMA_MODELS", str(root))
    return root


@pytest.fixture
def lmstudio(tmp_path, tiny_file, monkeypatch) -> Path:
    """$LMSTUDIO_MODELS with pub/one (one model file and a vision projector) and pub/two (two files)."""
    root = tmp_path / "lmstudio-models"
    for repo, names in (("one", ["tiny.F32.gguf", "mmproj-tiny.gguf"]), ("two", ["a.F32.gguf", "b.F32.gguf"])):
        (root / "pub" / repo).mkdir(parents=True)
        for name in names:
            os.symlink(tiny_file, root / "pub" / repo / name)
    monkeypatch.setenv("LMSTUDIO_MODELS", str(root))
    return root


def test_ollama_names_resolve_to_the_model_blob(ollama, tiny_file):
    for spec in ("ollama:tiny", "ollama:tiny:latest", "ollama:tiny:small", "ollama:me/tiny:v1",
                 "ollama:registry.ollama.ai/me/tiny:v1"):
        source = check_path(spec)
        assert source.kind == "gguf" and source.spec == spec
        assert Path(source.ref).name.startswith("sha256-") and Path(source.ref).resolve() == tiny_file.resolve()
    assert resolve("ollama:tiny").ref == check_path("ollama:tiny").ref


def test_ollama_errors_are_one_line(ollama, tmp_path, monkeypatch):
    with pytest.raises(ModelNotFound, match=r"^ollama:nope: no such model in .* \(looked for nope:latest\); it has "
                                            r"me/tiny:v1, tiny:latest, tiny:small$"):
        check_path("ollama:nope")
    _manifest(ollama, ("registry.ollama.ai", "library", "broken", "latest"), "not json")
    with pytest.raises(CheckpointError, match="ollama:broken: its manifest .* is unreadable"):
        check_path("ollama:broken")
    _manifest(ollama, ("registry.ollama.ai", "library", "nomodel", "latest"),
              [{"mediaType": "application/vnd.ollama.image.license", "digest": "sha256:0123"}])
    with pytest.raises(CheckpointError, match=f"has no model layer \\({MODEL_MEDIA}\\)"):
        check_path("ollama:nomodel")
    _manifest(ollama, ("registry.ollama.ai", "library", "gone", "latest"),
              [{"mediaType": MODEL_MEDIA, "digest": "sha256:" + "f" * 64}])
    with pytest.raises(CheckpointError, match="its model blob .* is missing"):
        check_path("ollama:gone")
    _manifest(ollama, ("registry.ollama.ai", "library", "notgguf", "latest"),
              [{"mediaType": MODEL_MEDIA, "digest": "sha256:0123"}])
    with pytest.raises(CheckpointError, match="is not a GGUF file"):
        check_path("ollama:notgguf")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "absent"))
    with pytest.raises(ModelNotFound, match="no Ollama models directory at .*absent \\(set OLLAMA_MODELS"):
        check_path("ollama:tiny")
    result = runner.invoke(app, ["next", "hi", "--model", "ollama:tiny"])
    assert result.exit_code == 1 and result.stderr.startswith("error: ollama:tiny: no Ollama models directory")
    assert result.stderr.count("\n") == 1


def test_ollama_model_runs_like_its_file(ollama, tiny_file, cached_load):
    args = ["next", "Thank you very", "--k", "3", "--device", "cpu", "--format", "json"]
    by_name = runner.invoke(app, [*args, "--model", "ollama:tiny"])
    assert by_name.exit_code == 0, by_name.stderr
    by_path = runner.invoke(app, [*args, "--model", str(tiny_file)])
    named, direct = json.loads(by_name.stdout), json.loads(by_path.stdout)
    assert named["model"] == "ollama:tiny" and direct["model"] == str(tiny_file)
    assert named["top"] == direct["top"] and named["token_ids"] == [10449, 345, 845]
    table = runner.invoke(app, [*args[:-2], "--format", "table", "--model", "ollama:tiny"])
    assert table.stdout.startswith("next · tiny-llama")  # an Ollama blob's stem names nothing: general.name
    params = runner.invoke(app, ["params", "ollama:tiny", "--format", "json"])
    assert params.exit_code == 0 and json.loads(params.stdout)["total"] > 0


def test_lmstudio_names(lmstudio, tiny_file):
    source = check_path("lmstudio:pub/one")
    assert source.kind == "gguf" and Path(source.ref) == lmstudio / "pub" / "one" / "tiny.F32.gguf"
    assert Path(check_path("lmstudio:pub/two/b.F32.gguf").ref).name == "b.F32.gguf"
    with pytest.raises(UsageError, match=r"^lmstudio:pub/two holds 2 GGUF files \(a.F32.gguf, b.F32.gguf\): "
                                         r"name one, e.g. lmstudio:pub/two/a.F32.gguf$"):
        check_path("lmstudio:pub/two")
    with pytest.raises(ModelNotFound, match="no such model folder"):
        check_path("lmstudio:pub/three")
    with pytest.raises(ModelNotFound, match="no such file"):
        check_path("lmstudio:pub/two/c.gguf")
    with pytest.raises(ModelNotFound, match="not an LM Studio model name"):
        check_path("lmstudio:pub")
    result = runner.invoke(app, ["tokens", "Thank you very", "--model", "lmstudio:pub/two"])
    assert result.exit_code == 2 and result.stderr.startswith("error: lmstudio:pub/two holds 2 GGUF files")


def test_models_lists_every_place(ollama, lmstudio, tiny_file, tmp_path, empty_hf_cache, tiny_model_dir):
    import models as tiny

    from anatomy_cli.models.headers import read_gguf

    folder = tmp_path / "mine"
    folder.mkdir()
    shutil.copy(tiny_file, folder / "copy.gguf")
    (folder / "notes.gguf").write_text("not a model")
    (folder / "broken.gguf").write_bytes(tiny_file.read_bytes()[:200])  # a truncated header
    checkpoint = shutil.copytree(tiny_model_dir("llama"), folder / "llama-dir")
    result = runner.invoke(app, ["models", str(folder), "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    by_name = {m["name"]: m for m in data["models"]}
    n_params = sum(t.n_params for t in read_gguf(tiny_file).tensors)
    assert n_params == tiny.expected_params("llama")  # the header's count is the model's
    for name, source in [("ollama:tiny:latest", "ollama"), ("ollama:me/tiny:v1", "ollama"),
                         ("lmstudio:pub/one", "lmstudio"), ("lmstudio:pub/two/a.F32.gguf", "lmstudio"),
                         (str(folder / "copy.gguf"), "dir")]:
        entry = by_name[name]
        assert (entry["source"], entry["format"], entry["architecture"]) == (source, "gguf", "llama"), name
        assert entry["parameters"] == n_params and entry["size_bytes"] == tiny_file.stat().st_size
    assert "lmstudio:pub/one/mmproj-tiny.gguf" not in by_name and str(folder / "notes.gguf") not in by_name
    broken = by_name[str(folder / "broken.gguf")]
    assert broken["parameters"] is None and "truncated" in broken["note"] and broken["size_bytes"] == 200
    ckpt = by_name[str(checkpoint)]
    assert (ckpt["format"], ckpt["architecture"], ckpt["parameters"]) == \
        ("safetensors", "LlamaForCausalLM", tiny.expected_params("llama"))
    assert not [m for m in data["models"] if m["source"] == "hf-cache"]
    assert data["searched"][0] == f"hf-cache: {empty_hf_cache}"
    bad = runner.invoke(app, ["models", str(tmp_path / "absent")])
    assert bad.exit_code == 2 and bad.stderr.startswith("error: ") and "is not a directory" in bad.stderr


def test_models_reads_the_hf_cache(tmp_path, empty_hf_cache, tiny_model_dir, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "none"))
    monkeypatch.setenv("LMSTUDIO_MODELS", str(tmp_path / "none"))
    repo = empty_hf_cache / "models--tiny--gpt2"
    snapshot = repo / "snapshots" / ("a" * 40)
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for f in ("config.json", "model.safetensors"):
        blob = repo / "blobs" / hashlib.sha256(f.encode()).hexdigest()
        shutil.copy(Path(tiny_model_dir("gpt2")) / f, blob)
        os.symlink(blob, snapshot / f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    data = json.loads(runner.invoke(app, ["models", "--format", "json"]).stdout)
    [entry] = [m for m in data["models"] if m["source"] != "package"]  # installed packages' files are listed too
    import models as tiny

    assert (entry["name"], entry["source"], entry["format"]) == ("tiny/gpt2", "hf-cache", "safetensors")
    assert (entry["architecture"], entry["parameters"]) == ("GPT2LMHeadModel", tiny.expected_params("gpt2"))


def test_models_imports_no_torch(ollama, lmstudio, tmp_path):
    code = ("import sys; from typer.testing import CliRunner; from anatomy_cli.cli.main import app\n"
            "r = CliRunner().invoke(app, ['models', '--format', 'json'])\n"
            "assert r.exit_code == 0, r.stderr\n"
            "assert 'ollama:tiny:latest' in r.stdout, r.stdout\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules\n")
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hf")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
