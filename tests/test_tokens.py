"""`anatomy tokens`: real GPT-2 ids from tiktoken and from the HF tokenizer, spans, bytes, errors, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from anatomy_cli.analyses.tokens import byte_spans
from anatomy_cli.analyses.tokens import tokenize_hf
from anatomy_cli.analyses.tokens import tokenize_tiktoken
from anatomy_cli.cli.main import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]  # subprocesses import anatomy_cli from this tree

# (text, GPT-2 ids) — the first two are the project's known values; the rest were checked
# against both tiktoken and the HF GPT-2 tokenizer built from the same BPE files.
CHINESE = "你好"
CHINESE_IDS = [19526, 254, 25001, 121]
ENDOFTEXT_PLAIN_IDS = [64, 27, 91, 437, 1659, 5239, 91, 29, 65]
SAMPLES = ["Thank you very", " much", "你好世界 much", "a  b\n\n  c\t\td   ", "é\u0301x 😀😀", "a<|endoftext|>b",
           "I'm can't 123456789 ...!!!"]


def _json(args, **kw):
    result = runner.invoke(app, ["tokens", *args, "--format", "json"], **kw)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(autouse=True)
def _cache(tiktoken_cache):
    return tiktoken_cache


def test_thank_you_very():
    data = _json(["Thank you very"])
    assert [t["token_id"] for t in data["tokens"]] == [10449, 345, 845]
    assert [t["token"] for t in data["tokens"]] == ["Thank", "·you", "·very"]
    assert [t["text"] for t in data["tokens"]] == ["Thank", " you", " very"]
    assert [(t["start"], t["end"]) for t in data["tokens"]] == [(0, 5), (5, 9), (9, 14)]
    assert [t["index"] for t in data["tokens"]] == [0, 1, 2]
    assert (data["n_tokens"], data["n_characters"], data["n_bytes"]) == (3, 14, 14)
    assert data["tokenizer"] == "tiktoken:gpt2"


def test_known_single_tokens():
    assert [t["token_id"] for t in _json([" much"])["tokens"]] == [881]
    assert [t["token_id"] for t in _json([" bank"])["tokens"]] == [3331]
    assert [t["token_id"] for t in _json(["bank"])["tokens"]] == [17796]


def test_chinese_splits_into_byte_pieces_with_the_characters_span():
    data = _json([CHINESE])
    toks = data["tokens"]
    assert [t["token_id"] for t in toks] == CHINESE_IDS
    assert [t["bytes"] for t in toks] == ["e4 bd", "a0", "e5 a5", "bd"]
    assert [t["token"] for t in toks] == ["<e4 bd>", "<a0>", "<e5 a5>", "<bd>"]
    assert all(t["text"] is None for t in toks)
    assert [(t["start"], t["end"]) for t in toks] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert bytes.fromhex(" ".join(t["bytes"] for t in toks)) == CHINESE.encode()
    assert (data["n_tokens"], data["n_characters"], data["n_bytes"]) == (4, 2, 6)


def test_byte_spans_piece_across_a_character_boundary():
    # " 😀" as GPT-2 splits it: space + first 3 emoji bytes, then the last byte.
    text = "x 😀"
    assert byte_spans(text, [b"x", " 😀".encode()[:4], "😀".encode()[3:]]) == [(0, 1), (1, 3), (2, 3)]
    with pytest.raises(ValueError):
        byte_spans(text, [b"x"])


def test_endoftext_is_plain_text_unless_allowed():
    plain = _json(["a<|endoftext|>b"])
    assert [t["token_id"] for t in plain["tokens"]] == ENDOFTEXT_PLAIN_IDS
    assert not any(t["special"] for t in plain["tokens"])
    special = _json(["a<|endoftext|>b", "--allow-special"])
    assert [t["token_id"] for t in special["tokens"]] == [64, 50256, 65]
    assert [t["special"] for t in special["tokens"]] == [False, True, False]
    assert special["tokens"][1]["token"] == "<|endoftext|>"
    assert (special["tokens"][1]["start"], special["tokens"][1]["end"]) == (1, 14)


def test_other_encoding_and_unknown_encoding():
    result = runner.invoke(app, ["tokens", "x", "--encoding", "nope"])
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: unknown tiktoken encoding 'nope'; available: gpt2, ")
    assert "cl100k_base" in result.stderr and result.stderr.count("\n") == 1


def test_encoding_and_model_together_is_a_usage_error():
    result = runner.invoke(app, ["tokens", "x", "-e", "gpt2", "--model", "./some-model"])
    assert result.exit_code == 2 and "not both" in result.stderr


def test_empty_text_is_a_usage_error():
    for args, stdin in ((["tokens", ""], None), (["tokens", "-"], b"")):
        result = runner.invoke(app, args, input=stdin)
        assert result.exit_code == 2, args
        assert result.stderr.startswith("error: empty text") and result.stdout == ""


def test_stdin_text_is_taken_verbatim():
    data = _json(["-"], input=b"Thank you very")
    assert [t["token_id"] for t in data["tokens"]] == [10449, 345, 845]
    data = _json(["-"], input=b"Thank you very\n")
    assert [t["token_id"] for t in data["tokens"]] == [10449, 345, 845, 198]
    assert data["tokens"][-1]["token"] == "↵"


def test_invalid_utf8_on_stdin_names_the_line():
    result = runner.invoke(app, ["tokens", "-"], input=b"fine\nbad \xff here\n")
    assert result.exit_code == 2
    # the same words as every prompt command's: line 2, its 5th byte
    assert result.stderr == "error: stdin line 2 is not valid UTF-8 (byte 5: b'\\xff')\n"


def test_tsv_rows_on_stdout_summary_on_stderr():
    result = runner.invoke(app, ["tokens", "你 much", "--format", "tsv"])
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        "index\ttoken_id\ttoken\tbytes\tstart\tend",
        "0\t19526\t<e4 bd>\te4 bd\t0\t1",
        "1\t254\t<a0>\ta0\t0\t1",
        "2\t881\t·much\t\t1\t6",
    ]
    assert result.stderr == "3 tokens, 6 characters, 8 bytes (tiktoken:gpt2)\n"


def test_csv_and_jsonl():
    csv_out = runner.invoke(app, ["tokens", "Thank you", "-f", "csv"]).stdout
    assert csv_out.splitlines() == ["index,token_id,token,bytes,start,end", "0,10449,Thank,,0,5", "1,345,·you,,5,9"]
    line = runner.invoke(app, ["tokens", "Thank you", "-f", "jsonl"]).stdout
    assert line.count("\n") == 1 and json.loads(line)["n_tokens"] == 2


def test_table_is_markup_safe_and_has_the_summary():
    result = runner.invoke(app, ["tokens", "[bold]x[/bold]", "--format", "table"])
    assert result.exit_code == 0 and result.stderr == ""
    rows = [line.split() for line in result.stdout.splitlines()[2:9]]  # header, rule, rows: no blank line first
    # index, id, token, start, end (bytes is empty): every piece printed literally, none eaten as markup
    assert rows == [["0", "58", "[", "0", "1"], ["1", "36575", "bold", "1", "5"], ["2", "60", "]", "5", "6"],
                    ["3", "87", "x", "6", "7"], ["4", "13412", "[/", "7", "9"], ["5", "36575", "bold", "9", "13"],
                    ["6", "60", "]", "13", "14"]]
    assert result.stdout.splitlines()[-1] == "7 tokens, 14 characters, 14 bytes (tiktoken:gpt2)"


def _dead_network(monkeypatch, cache):
    import tiktoken.registry

    # Forget encodings already loaded in this process; refuse any connection through a dead proxy.
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)


def test_gpt2_works_offline_with_an_empty_cache_from_the_bundled_files(tmp_path, monkeypatch):
    import hashlib

    from tiktoken_ext import openai_public

    from anatomy_cli.text import encodings

    _dead_network(monkeypatch, tmp_path)
    assert [t.token_id for t in tokenize_tiktoken("Thank you very").tokens] == [10449, 345, 845]
    # The first run wrote r50k_base's file: byte for byte the published one (tiktoken's hash).
    written = tmp_path / hashlib.sha1(encodings.R50K_URL.encode()).hexdigest()
    assert hashlib.sha256(written.read_bytes()).hexdigest() == encodings.R50K_SHA256
    assert openai_public.r50k_base()["mergeable_ranks"] == encodings.gpt2_encoding()._mergeable_ranks
    assert [t.token_id for t in tokenize_tiktoken("Thank you very").tokens] == [10449, 345, 845]


def test_bundled_gpt2_equals_tiktokens_own_gpt2_encoding(monkeypatch, tmp_path):
    import shutil

    import tiktoken
    from tiktoken_ext import openai_public

    from anatomy_cli.data import GPT2_ENCODER
    from anatomy_cli.data import GPT2_MERGES
    from anatomy_cli.text import encodings

    # tiktoken's own gpt2 (merges replayed from vocab.bpe, checked against encoder.json) from a seeded cache.
    for name, url in (("vocab.bpe", "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe"),
                      ("encoder.json",
                       "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json")):
        shutil.copyfile(GPT2_MERGES if name == "vocab.bpe" else GPT2_ENCODER, tmp_path / encodings.cache_name(url))
    _dead_network(monkeypatch, tmp_path)
    ours, theirs = encodings.gpt2_encoding(), tiktoken.Encoding(**openai_public.gpt2())
    for text in SAMPLES + [CHINESE]:
        assert ours.encode(text, allowed_special="all") == theirs.encode(text, allowed_special="all")
    assert ours.n_vocab == theirs.n_vocab == 50257 and ours.special_tokens_set == theirs.special_tokens_set


def test_corrupt_cached_r50k_file_is_never_used(tmp_path, monkeypatch):
    from anatomy_cli.text import encodings

    _dead_network(monkeypatch, tmp_path)
    (tmp_path / encodings.cache_name(encodings.R50K_URL)).write_bytes(b"corrupt")
    assert [t.token_id for t in tokenize_tiktoken("Thank you very").tokens] == [10449, 345, 845]


def test_other_encoding_offline_names_the_file_tiktoken_wants(tmp_path, monkeypatch):
    _dead_network(monkeypatch, tmp_path)
    result = runner.invoke(app, ["tokens", "Thank you very", "--encoding", "cl100k_base"])
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    url = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
    assert result.stderr.startswith("error: tiktoken encoding 'cl100k_base' is not cached")
    assert f"tiktoken reads {url}; save that file once as TIKTOKEN_CACHE_DIR (now: {tmp_path})/" \
           f"9b5ad71b2ce5302211f9c61530b329a4922fc6a4" in result.stderr
    assert "docs/commands/tokens.md#offline" in result.stderr


def test_hf_tokenizer_matches_tiktoken(gpt2_tokenizer_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gpt2_tokenizer_dir)
    for text in SAMPLES:
        for allow in (False, True):
            ours = tokenize_tiktoken(text, allow_special=allow).to_dict()["tokens"]
            hf = tokenize_hf(text, "gpt2-dir", allow_special=allow, tokenizer=tok).to_dict()["tokens"]
            assert hf == ours, (text, allow)
    assert [t.token_id for t in tokenize_hf(CHINESE, "x", tokenizer=tok).tokens] == CHINESE_IDS


def test_model_option_uses_the_hf_tokenizer(gpt2_tokenizer_dir):
    data = _json(["你好世界 much", "--model", str(gpt2_tokenizer_dir)])
    assert data["tokenizer"] == f"hf:{gpt2_tokenizer_dir}"
    assert [t["token_id"] for t in data["tokens"]] == [19526, 254, 25001, 121, 10310, 244, 45911, 234, 881]
    assert data["tokens"][-1]["token"] == "·much"
    assert (data["n_tokens"], data["n_characters"], data["n_bytes"]) == (9, 9, 17)


@pytest.mark.parametrize("model, code, message", [
    ("./no/such/dir", 2, "error: no such directory: ./no/such/dir"),
    ("nobody/not-cached-anywhere", 1, "error: no tokenizer for 'nobody/not-cached-anywhere' in the Hugging Face "
                                      "cache and the Hub cannot be reached"),
])
def test_model_errors_are_one_line(model, code, message):
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # conftest: never touch the network
    result = runner.invoke(app, ["tokens", "x", "--model", model])
    assert result.exit_code == code
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1


def test_directory_without_tokenizer_is_a_checkpoint_error(tmp_path):
    result = runner.invoke(app, ["tokens", "x", "--model", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: '{tmp_path}' has no tokenizer files")
    assert result.stderr.count("\n") == 1


def test_directory_with_unusable_tokenizer_files(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{}")
    result = runner.invoke(app, ["tokens", "x", "--model", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: '{tmp_path}' has no usable tokenizer files")
    assert result.stderr.rstrip().endswith("a required field is missing: 'added_tokens'")
    assert result.stderr.count("\n") == 1


def test_gpt2_preset_tokenizer_offline(empty_hf_cache):
    # Nothing cached and no network: the BPE files inside the package, as the engine's preset path uses.
    data = _json(["Thank you very", "--model", "gpt2"])
    assert [t["token_id"] for t in data["tokens"]] == [10449, 345, 845]


def test_tokens_and_the_engine_share_one_tokenizer_loader(monkeypatch, tiny_model_dir):

    from anatomy_cli import engine
    from anatomy_cli.analyses import tokens as tokens_analysis
    from anatomy_cli.engine import opening
    from anatomy_cli.models import model_files


    seen = []
    real = model_files.load_tokenizer

    def spy(source, **kw):
        seen.append((source.kind, source.ref))
        return real(source, **kw)

    for module in (tokens_analysis, opening):  # where `tokens` and the engine read it
        monkeypatch.setattr(module, "load_tokenizer", spy)
    d = str(tiny_model_dir("gpt2"))
    assert _json(["Thank you very", "--model", d])["tokens"][0]["token_id"] == 10449
    assert engine.load(d, device="cpu").tokenizer.encode(["Thank you very"])[0].ids == [10449, 345, 845]
    assert seen == [("dir", d), ("dir", d)]


def test_help_tokens_and_layernorm_do_not_import_torch():
    # A fresh interpreter: other tests in this process have imported torch already.
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from anatomy_cli.cli.main import app\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0, r.stderr\n"
        "r = CliRunner().invoke(app, ['tokens', 'Thank you very', '-f', 'tsv'])\n"
        "assert r.exit_code == 0, r.stderr\n"
        "assert '10449' in r.stdout, r.stdout\n"
        "r = CliRunner().invoke(app, ['layernorm', '100', '0.001', '-50', '25', '-f', 'json'])\n"
        "assert r.exit_code == 0 and '18.75025' in r.stdout, r.stderr\n"
        "heavy = sorted(m for m in ('torch', 'transformers') if m in sys.modules)\n"
        "print(','.join(heavy) or 'clean')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "clean\n"


def test_head_closing_the_pipe_is_quiet():
    proc = subprocess.run(f"{sys.executable} -m anatomy_cli tokens - --format tsv | head -1",
                          shell=True, capture_output=True, input=b"a " * 100_000, timeout=120,
                          env=dict(os.environ), cwd=ROOT)
    assert proc.stdout == b"index\ttoken_id\ttoken\tbytes\tstart\tend\n"
    assert proc.stderr == b""


def test_a_tokenizer_error_over_several_lines_is_kept_whole_on_one(tmp_path, monkeypatch):
    """transformers' "Couldn't instantiate the backend tokenizer from one of:" lists the ways on the next lines: the
    one error line keeps them (it once stopped at the colon)."""
    import transformers

    def refuse(*args, **kwargs):
        raise ValueError("Couldn't instantiate the backend tokenizer from one of: \n(1) a serialization file, \n"
                         "(2) a slow tokenizer instance to convert")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", refuse)
    (tmp_path / "vocab.json").write_text("{}")
    result = runner.invoke(app, ["tokens", "x", "--model", str(tmp_path)])
    assert result.exit_code == 1
    assert result.stderr.rstrip().endswith(
        "Couldn't instantiate the backend tokenizer from one of: (1) a serialization file, (2) a slow tokenizer "
        "instance to convert"), result.stderr
    assert result.stderr.count("\n") == 1
