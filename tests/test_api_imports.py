"""Importing anatomy_cli and calling every API function on a tiny model loads no typer (issue 47): the API and
the task layer stand beside the CLI. One subprocess calls each prompt-reading function once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CALLS = """
import sys, json, anatomy_cli as anatomy
lm = anatomy.load(MODEL)
p = "The cat sat on the mat"
anatomy.trace(lm, p)
anatomy.next_token(lm, p, k=2)
anatomy.lens(lm, p, k=1)
anatomy.heads(lm, p, seq_len=8)
anatomy.attn(lm, p, layer=0, head=0)
anatomy.dla(lm, p, target=" the")
anatomy.ablate(lm, p, target=" the")
anatomy.patch(lm, p, "The dog sat on the mat", target=" the")
anatomy.attribute(lm, p, target=" the")
anatomy.drift(lm, "bank", ["the river bank", "the bank account"])
anatomy.generate(MODEL, p, max_new_tokens=1)  # by name: the API opens the model itself (no CLI either)
anatomy.steer(lm, positive=["I love it"], negative=["I hate it"], layer=0)
anatomy.verify(lm, quick=True)
print(json.dumps(sorted(x for x in ("typer", "rich", "anatomy_cli.cli") if x in sys.modules)))
"""


def test_every_api_function_runs_without_typer_or_the_cli(tiny_model_dir):
    code = CALLS.replace("MODEL", repr(str(tiny_model_dir("gpt2"))))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
