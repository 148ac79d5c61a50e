"""LayerNorm by hand, on a vector of numbers. numpy only (no torch).

The formula is ``torch.nn.functional.layer_norm`` over the last dimension::

    mean     = sum(x) / n
    variance = sum((x - mean)**2) / n        # population variance (divide by n, not n - 1)
    y        = (x - mean) / sqrt(variance + eps) * gamma + beta

computed in float64. When every value is equal (in particular for one value)
``x - mean`` is exactly 0, so ``y == beta``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from anatomy_cli.errors import UsageError

DEFAULT_EPS = 1e-5  # torch.nn.LayerNorm's and GPT-2's default


@dataclass(frozen=True)
class LayerNormResult:
    """Statistics and vectors of one LayerNorm; every vector has length ``n``."""

    values: tuple[float, ...]  # the input x
    mean: float
    variance: float  # population variance (divided by n)
    std: float  # sqrt(variance), without eps
    eps: float
    denominator: float  # sqrt(variance + eps), what x - mean is divided by
    centered: tuple[float, ...]  # x - mean
    normalized: tuple[float, ...]  # (x - mean) / denominator
    gamma: tuple[float, ...]  # scale; all 1 unless given
    beta: tuple[float, ...]  # shift; all 0 unless given
    output: tuple[float, ...]  # normalized * gamma + beta

    @property
    def constant(self) -> bool:
        """True when all values are equal (variance 0): the output is beta."""
        return self.variance == 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "n": len(self.values),
            "values": list(self.values),
            "mean": self.mean,
            "variance": self.variance,
            "std": self.std,
            "eps": self.eps,
            "denominator": self.denominator,
            "centered": list(self.centered),
            "normalized": list(self.normalized),
            "gamma": list(self.gamma),
            "beta": list(self.beta),
            "output": list(self.output),
        }


def parse_number(text: str, what: str = "value") -> float:
    """``float(text)`` for a finite number. Raises UsageError naming ``text`` otherwise."""
    token = text.strip()
    try:
        value = float(token)
    except ValueError:
        raise UsageError(f"{what} '{token}' is not a number") from None
    if not math.isfinite(value):
        raise UsageError(f"{what} '{token}' is not finite: LayerNorm needs finite numbers")
    return value


def parse_list(text: str, option: str) -> list[float]:
    """Numbers separated by commas and/or whitespace (``"1,2,3,4"``, ``"1 2 3 4"``) -> floats.

    Raises UsageError for an empty list, an empty item or a non-number.
    """
    items = re.split(r"\s*,\s*|\s+", text.strip())
    if items == [""]:
        raise UsageError(f"{option} is empty: give comma-separated numbers, e.g. {option} 1,1,1,1")
    if "" in items:
        raise UsageError(f"{option} '{text.strip()}' has an empty item")
    return [parse_number(item, f"{option} item") for item in items]


def layer_norm(values: Sequence[float], *, gamma: Sequence[float] | None = None,
               beta: Sequence[float] | None = None, eps: float = DEFAULT_EPS) -> LayerNormResult:
    """LayerNorm of ``values`` (n >= 1 finite floats) with optional ``gamma``/``beta`` of length n.

    Raises UsageError for no values, mismatched lengths, eps < 0 or not finite,
    variance + eps == 0 (0/0), and results that overflow float64.
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        raise UsageError("no values: give the numbers to normalise, e.g. anatomy layernorm 100 0.001 -50 25")
    if not math.isfinite(eps) or eps < 0:
        raise UsageError(f"--eps must be a finite number >= 0, got {eps!r}")
    g = _vector(gamma, n, "--gamma", 1.0)
    b = _vector(beta, n, "--beta", 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        return _layer_norm(x, g, b, eps)


def _layer_norm(x: np.ndarray, g: np.ndarray, b: np.ndarray, eps: float) -> LayerNormResult:
    if np.all(x == x[0]):
        # Exactly x[0]: float rounding in sum/n would leave tiny non-zero deviations.
        mean = float(x[0])
        centered = np.zeros_like(x)
    else:
        mean = float(np.mean(x))
        centered = x - mean
    variance = float(np.mean(centered * centered))
    if variance + eps == 0:
        raise UsageError("all values are equal and --eps is 0: (x - mean) / sqrt(variance + eps) is 0/0")
    denominator = math.sqrt(variance + eps)
    normalized = centered / denominator
    output = normalized * g + b
    if not (math.isfinite(mean) and math.isfinite(variance) and np.all(np.isfinite(output))):
        raise UsageError("the values are too large: their variance overflows float64")
    return LayerNormResult(
        values=tuple(x.tolist()), mean=mean, variance=variance, std=math.sqrt(variance), eps=float(eps),
        denominator=denominator, centered=tuple(centered.tolist()), normalized=tuple(normalized.tolist()),
        gamma=tuple(g.tolist()), beta=tuple(b.tolist()), output=tuple(output.tolist()),
    )


def _vector(given: Sequence[float] | None, n: int, option: str, fill: float) -> np.ndarray:
    if given is None:
        return np.full(n, fill)
    if len(given) != n:
        raise UsageError(f"{option} has {len(given)} values but the input has {n}; give one per input value")
    return np.asarray(given, dtype=np.float64)
