"""`diff`: two models side by side, layer by layer.

* :mod:`.weights`: the checkpoints' tensors compared one pair at a time (relative change, cosine,
  max |Δ|), grouped per block and ``params`` component; never a whole model in memory.
* :mod:`.activations`: the residual streams and logit lenses on a prompt, A run and reduced to what
  the comparison needs before B loads.
"""

from __future__ import annotations

from anatomy_cli.analyses.diff.activations import ActivationDiff, Kept, LayerDiff, compare, keep, kl
from anatomy_cli.analyses.diff.headers import Header, check_headers, read_header
from anatomy_cli.analyses.diff.weights import (
    Sums,
    TensorDiff,
    WeightRow,
    WeightsDiff,
    diff_weights,
    open_weights,
    pair_names,
)

__all__ = ["Header", "check_headers", "read_header",
           "ActivationDiff", "Kept", "LayerDiff", "compare", "keep", "kl", "Sums", "TensorDiff", "WeightRow",
           "WeightsDiff", "diff_weights", "open_weights", "pair_names"]
