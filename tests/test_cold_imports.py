"""A cold `anatomy next` imports only what it needs (issue 51 item 11): not the plotting, Parquet, Ray, pandas,
Captum or browser libraries that other commands use, nor rich when nothing is drawn (piped output, no status
line). One subprocess runs the command in-process on a tiny model and lists what it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("plotly", "pyarrow", "ray", "pandas", "matplotlib", "captum", "datasets", "playwright", "kaleido", "rich")

CODE = """
import json, sys
from anatomy_cli.cli.main import app
try:
    app(["next", "The cat sat on the", "--model", MODEL, "--format", "json"], standalone_mode=False)
except SystemExit as exc:
    assert not exc.code, exc.code
print()
print(json.dumps(sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))))
"""


def test_next_loads_no_plotting_parquet_ray_or_rich(tiny_model_dir):
    code = CODE.replace("MODEL", repr(str(tiny_model_dir("gpt2")))).replace("HEAVY", repr(HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "ANATOMY_STATUS": ""})
    assert out.returncode == 0, out.stderr[-2000:]
    *result, loaded = out.stdout.strip().splitlines()
    assert json.loads("\n".join(result))["top"], out.stdout  # the command ran and printed its JSON
    assert json.loads(loaded) == []
