#!/usr/bin/env bash
# A separate virtual environment with TransformerLens and anatomy, for benchmarks/tl/run.py.
#
#   bash benchmarks/tl/setup.sh [VENV]      # default VENV: ../tl-venv beside the clone
#
# TransformerLens brings about 70 packages (wandb, datasets, pandas, ...): it never goes into the
# project's own environment, its test dependencies or .ci/run. torch is installed first and pinned
# (an unpinned torch may pull a multi-GB CUDA build); the script checks that nothing replaced it.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VENV="${1:-$ROOT/../tl-venv}"
TORCH="${TORCH_VERSION:-2.13.0}"

python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "torch==$TORCH"
"$PY" -m pip install --quiet "torch==$TORCH" transformer_lens pyinstrument
"$PY" -m pip install --quiet "torch==$TORCH" -e "$ROOT"
got="$("$PY" -c 'import torch; print(torch.__version__)')"
case "$got" in
  "$TORCH"|"$TORCH"+*) ;;
  *) echo "error: torch $got in $VENV, expected $TORCH (pip replaced it)" >&2; exit 1 ;;
esac
"$PY" -c 'import transformer_lens, anatomy_cli, transformers; print("transformer_lens", transformer_lens.__version__ if hasattr(transformer_lens, "__version__") else "?", "transformers", transformers.__version__)'
echo "ready: $VENV (python benchmarks/tl/run.py with $PY)" >&2
