"""The presets' breakdowns ship with the package (issue 32, item 3): they equal the meta-device count for
every preset, with and without --per-layer, for every --dtype, and `params PRESET` imports no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from anatomy_cli.analyses.params import shipped
from anatomy_cli.analyses.params.rules import DTYPE_BITS
from anatomy_cli.models.presets import PRESETS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", list(PRESETS))
def test_shipped_breakdowns_equal_the_meta_device_count(name):
    from anatomy_cli.analyses.params.build import build_meta_model
    from anatomy_cli.analyses.params.build import resolve_config
    from anatomy_cli.analyses.params.meta import count_parameters
    from anatomy_cli.models.resolve import resolve

    resolved = resolve_config(name, source=resolve(name, need="config"))
    model = build_meta_model(resolved.config)
    for per_layer in (False, True):
        for dtype in (None, *DTYPE_BITS):
            counted = count_parameters(model, resolved, dtype=dtype, per_layer=per_layer)
            assert shipped.breakdown(name, dtype=dtype, per_layer=per_layer) == counted, (name, per_layer, dtype)


def test_a_changed_preset_shape_is_not_answered_from_the_shipped_file(monkeypatch):
    model_type, shape = PRESETS["gpt2"]
    monkeypatch.setitem(PRESETS, "gpt2", (model_type, {**shape, "n_layer": 2}))
    assert shipped.breakdown("gpt2", dtype=None, per_layer=False) is None
    assert shipped.breakdown("no-such-preset", dtype=None, per_layer=False) is None


def test_the_data_round_trips():
    entry = json.loads(shipped.DATA.read_text())["presets"]["mixtral-8x7b"]["per_layer"]
    assert json.loads(json.dumps(shipped.to_data(shipped.from_data(entry)))) == entry


@pytest.mark.parametrize("args", [["llama-7b"], ["mixtral-8x7b", "--per-layer", "--dtype", "bf16"]])
def test_params_preset_imports_no_torch(args, tmp_path):
    code = ("import sys\nfrom anatomy_cli.cli.main import app\n"
            f"code = app({['params', *args, '--format', 'json']!r}, standalone_mode=False)\n"
            "print('torch' in sys.modules, 'transformers' in sys.modules, file=sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ANATOMY_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines()[-1] == "False False"
    data = json.loads(done.stdout)
    assert data["total"] == {"llama-7b": 6_738_415_616, "mixtral-8x7b": 46_702_792_704}[args[0]]
