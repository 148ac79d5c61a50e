"""Data shipped inside the package: GPT-2's BPE files (``data/gpt2/``, GPT-2's Modified MIT License) and
plotly.js's cartesian bundle for the HTML pages (``data/plotly/``, MIT License, see :data:`PLOTLY_CARTESIAN`).

GPT-2 is the default model and tokenizer, so its tokenizer works on a fresh offline
machine with no set-up: tiktoken's ``gpt2`` encoding and the Hugging Face GPT-2 tokenizer
are both built from these two files. No torch, no transformers here.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

GPT2_DIR = Path(__file__).resolve().parent / "gpt2"
GPT2_ENCODER = GPT2_DIR / "encoder.json"  # token string (GPT-2's byte-to-unicode alphabet) -> id
GPT2_MERGES = GPT2_DIR / "vocab.bpe"  # "#version" line, then one merge "a b" per line, by priority
GPT2_SPECIAL = {"<|endoftext|>": 50256}

# plotly.js's own partial bundle with the trace types the pages draw (bar, heatmap, scatter, ...): the
# file ``plotly-cartesian.min.js`` of the npm package plotly.js-cartesian-dist-min, unchanged, with its
# LICENSE. 1.5 MB against 4.8 MB for the full bundle plotly.py ships, and a browser parses it in about
# 0.9 s instead of 1.5 s (docs/performance.md, "HTML").
PLOTLY_CARTESIAN = Path(__file__).resolve().parent / "plotly" / "plotly-cartesian.min.js"
PLOTLY_CARTESIAN_VERSION = "4.1.1"


@lru_cache(maxsize=1)
def gpt2_vocab() -> dict[str, int]:
    """encoder.json: 50,257 token strings -> ids, ``<|endoftext|>`` = 50256 included."""
    return json.loads(GPT2_ENCODER.read_text(encoding="utf-8"))


def gpt2_merges() -> list[tuple[str, str]]:
    """vocab.bpe's 50,000 merges in priority order (the ``#version`` header line skipped)."""
    lines = GPT2_MERGES.read_text(encoding="utf-8").split("\n")
    pairs = (line.split(" ") for line in lines[1:] if line.strip())
    return [(first, second) for first, second in pairs]


def _unicode_to_byte() -> dict[str, int]:
    # GPT-2's bytes_to_unicode, inverted: printable Latin-1 bytes stand for themselves, the
    # other 68 bytes for chr(256 + n) in byte order (tiktoken's data_gym_to_mergeable_bpe_ranks).
    printable = [b for b in range(256) if chr(b).isprintable() and chr(b) != " "]
    table = {chr(b): b for b in printable}
    others = [b for b in range(256) if b not in set(printable)]
    table.update({chr(256 + n): b for n, b in enumerate(others)})
    return table


def gpt2_ranks() -> dict[bytes, int]:
    """tiktoken's mergeable ranks for gpt2: token bytes -> id, the special token left out.

    In GPT-2 a token's id is its merge rank, so encoder.json alone gives the ranks
    (tiktoken checks the same identity when it reads both files).
    """
    decode = _unicode_to_byte()
    return {bytes(decode[ch] for ch in token): rank for token, rank in gpt2_vocab().items()
            if token not in GPT2_SPECIAL}
