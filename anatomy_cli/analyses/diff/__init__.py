"""`diff`: two models side by side, layer by layer.

* :mod:`.weights`: the checkpoints' tensors compared one pair at a time (relative change, cosine,
  max |Δ|), grouped per block and ``params`` component; never a whole model in memory.
* :mod:`.activations`: the residual streams and logit lenses on a prompt, A run and reduced to what
  the comparison needs before B loads.
"""

from __future__ import annotations

from anatomy_cli.analyses.diff.activations import ActivationDiff
from anatomy_cli.analyses.diff.activations import Kept
from anatomy_cli.analyses.diff.activations import LayerDiff
from anatomy_cli.analyses.diff.activations import compare
from anatomy_cli.analyses.diff.activations import keep
from anatomy_cli.analyses.diff.activations import kl
from anatomy_cli.analyses.diff.headers import Header
from anatomy_cli.analyses.diff.headers import check_headers
from anatomy_cli.analyses.diff.headers import read_header
from anatomy_cli.analyses.diff.weights import Sums
from anatomy_cli.analyses.diff.weights import TensorDiff
from anatomy_cli.analyses.diff.weights import WeightRow
from anatomy_cli.analyses.diff.weights import WeightsDiff
from anatomy_cli.analyses.diff.weights import diff_weights
from anatomy_cli.analyses.diff.weights import open_weights
from anatomy_cli.analyses.diff.weights import pair_names

__all__ = ["Header", "check_headers", "read_header",
           "ActivationDiff", "Kept", "LayerDiff", "compare", "keep", "kl", "Sums", "TensorDiff", "WeightRow",
           "WeightsDiff", "diff_weights", "open_weights", "pair_names"]
