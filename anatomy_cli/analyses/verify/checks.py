"""The rows of `anatomy verify`: one :class:`Check` per measured comparison, grouped into sections.

A check compares two tensors (:func:`compare`: max |a - b|, relative error ``||a - b|| / ||b||`` and cosine, in
float64) or one scalar error against a tolerance. ``error`` is the number the tolerance applies to; a check
passes when ``error <= tolerance`` (and, for tensor comparisons, ``1 - cosine <= tolerance`` too). A skipped
check (``passed`` None) says why in ``note``. Pure: no model, no engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from dataclasses import field

import torch

# Relative-error tolerances of a forward repeated under another batching or attention kernel, by dtype: fp32
# rounding (~1e-7 per op) summed over a few dozen layers; bf16 keeps 8 bits of mantissa (~4e-3 per rounding).
RELATIVE = {"fp32": 1e-4, "fp16": 2e-2, "bf16": 5e-2}
# Identities that hold up to the rounding of one sum (decomposition, lens, DLA): tighter in fp32.
IDENTITY = {"fp32": 1e-5, "fp16": 1e-2, "bf16": 3e-2}
# Attention weights are probabilities in [0, 1]: an absolute tolerance.
PATTERN = {"fp32": 1e-5, "fp16": 5e-3, "bf16": 3e-2}


@dataclass(frozen=True)
class Comparison:
    """``max_abs``: max |a - b|; ``rel_error``: ||a - b|| / ||b|| (Frobenius; 0 when both are 0); ``cosine``."""

    max_abs: float
    rel_error: float
    cosine: float


def compare(a: torch.Tensor, b: torch.Tensor) -> Comparison:
    """``a`` (measured) against ``b`` (the reference), any equal shapes, in float64 on the CPU."""
    if a.shape != b.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} and {tuple(b.shape)}")
    x, y = a.detach().to("cpu", torch.float64).flatten(), b.detach().to("cpu", torch.float64).flatten()
    diff = (x - y).norm()
    ref = y.norm()
    rel = float(diff / ref) if float(ref) > 0 else (0.0 if float(diff) == 0 else math.inf)
    denom = float(x.norm() * ref)
    cos = float(x @ y) / denom if denom > 0 else (1.0 if float(diff) == 0 else 0.0)
    return Comparison(max_abs=float((x - y).abs().max()) if x.numel() else 0.0, rel_error=rel, cosine=cos)


@dataclass(frozen=True)
class Check:
    """One row. ``name``: what is compared (``resid_post``, ``logits``, ...); ``layer``: the block, or None;
    ``error``: the measured error the ``tolerance`` applies to (None when skipped); ``passed``: True, False,
    or None (skipped, ``note`` says why). ``max_abs``/``rel_error``/``cosine``: the tensor comparison behind
    it, where there is one. ``score``: a known answer's score (then ``error`` is None and ``threshold``
    the lowest score that passes)."""

    name: str
    layer: int | None = None
    error: float | None = None
    tolerance: float | None = None
    passed: bool | None = None
    max_abs: float | None = None
    rel_error: float | None = None
    cosine: float | None = None
    score: float | None = None
    threshold: float | None = None
    note: str = ""

    @property
    def label(self) -> str:
        return self.name if self.layer is None else f"{self.name} L{self.layer}"

    @property
    def margin(self) -> float:
        """How close the row came to its limit: error / tolerance, or threshold / score for a known answer (1 is
        at the limit, above 1 failed; 0 for an exact 0 against a 0 tolerance; inf for a NaN); nan when skipped."""
        if self.passed is None:
            return math.nan
        if self.score is not None:
            return (self.threshold or 0.0) / self.score if self.score > 0 else math.inf
        if self.error is None or math.isnan(self.error):
            return math.inf
        if not self.tolerance:
            return 0.0 if self.error == 0 else math.inf
        return self.error / self.tolerance

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "layer": self.layer, "passed": self.passed, "error": _num(self.error),
                "tolerance": self.tolerance, "max_abs": _num(self.max_abs), "rel_error": _num(self.rel_error),
                "cosine": _num(self.cosine), "score": _num(self.score), "threshold": self.threshold,
                "note": self.note}


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else x


def tensor_check(name: str, a: torch.Tensor, b: torch.Tensor, tolerance: float, *, layer: int | None = None,
                 note: str = "") -> Check:
    """``a`` against ``b``: the error is the relative error; passes when it and ``1 - cosine`` are within
    ``tolerance`` (a NaN anywhere fails; so do different shapes)."""
    if a.shape != b.shape:
        return _shapes(name, a, b, tolerance, layer)
    c = compare(a, b)
    ok = c.rel_error <= tolerance and (1.0 - c.cosine) <= tolerance
    return Check(name, layer, error=c.rel_error, tolerance=tolerance, passed=bool(ok), max_abs=c.max_abs,
                 rel_error=c.rel_error, cosine=c.cosine, note=note)


def abs_check(name: str, a: torch.Tensor, b: torch.Tensor, tolerance: float, *, layer: int | None = None,
              note: str = "") -> Check:
    """``a`` against ``b`` where an absolute error is meaningful (probabilities): the error is max |a - b|."""
    if a.shape != b.shape:
        return _shapes(name, a, b, tolerance, layer)
    c = compare(a, b)
    return Check(name, layer, error=c.max_abs, tolerance=tolerance, passed=bool(c.max_abs <= tolerance),
                 max_abs=c.max_abs, rel_error=c.rel_error, cosine=c.cosine, note=note)


def _shapes(name: str, a: torch.Tensor, b: torch.Tensor, tolerance: float, layer: int | None) -> Check:
    return Check(name, layer, error=math.inf, tolerance=tolerance, passed=False,
                 note=f"shapes differ: {list(a.shape)} against {list(b.shape)}")


def scalar_check(name: str, error: float, tolerance: float, *, layer: int | None = None, note: str = "") -> Check:
    return Check(name, layer, error=error, tolerance=tolerance, passed=bool(error <= tolerance), note=note)


def score_check(name: str, score: float, threshold: float, *, note: str = "") -> Check:
    """A known answer: passes when ``score >= threshold``."""
    return Check(name, score=score, threshold=threshold, passed=bool(score >= threshold), note=note)


def skipped(name: str, why: str, *, layer: int | None = None) -> Check:
    return Check(name, layer, passed=None, note=why)


def worst(checks: list[Check]) -> Check:
    """Of several checks of one point (one per prompt), the one with the largest error (a failure first)."""
    return max(checks, key=lambda c: (c.passed is False, -math.inf if c.error is None else
                                      (math.inf if math.isnan(c.error) else c.error)))


@dataclass(frozen=True)
class SectionResult:
    """One section: ``name`` (``parity``, ``identities``, ...), its ``checks``, and a ``note`` (why it was
    skipped as a whole, or what its numbers mean)."""

    name: str
    title: str
    checks: tuple[Check, ...] = ()
    note: str = ""

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.passed is False]

    @property
    def status(self) -> str:
        """``passed``, ``failed``, or ``skipped`` (no row ran)."""
        if not any(c.passed is not None for c in self.checks):
            return "skipped"
        return "failed" if self.failed else "passed"

    def counts(self) -> dict[str, int]:
        return {"passed": sum(c.passed is True for c in self.checks),
                "failed": sum(c.passed is False for c in self.checks),
                "skipped": sum(c.passed is None for c in self.checks)}

    @property
    def worst(self) -> Check | None:
        """The row that came closest to (or went furthest past) its limit: a failure first, then the largest
        :attr:`Check.margin`; None when every row was skipped."""
        ran = [c for c in self.checks if c.passed is not None]
        return max(ran, key=lambda c: (c.passed is False, c.margin)) if ran else None

    def summary(self) -> dict[str, object]:
        """The section in one line: ``name``, ``status``, ``counts``, the ``worst`` row (its :meth:`Check.to_dict`,
        or None), ``note`` (why it was skipped, for a section with no row that ran)."""
        worst = self.worst
        why = "" if worst is not None else (self.note or next((c.note for c in self.checks if c.note), ""))
        return {"name": self.name, "status": self.status, "counts": self.counts(),
                "worst": None if worst is None else worst.to_dict(), "note": why}

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "title": self.title, "status": self.status, "note": self.note,
                "checks": [c.to_dict() for c in self.checks]}


@dataclass(frozen=True)
class Verification:
    """Every section, in order; ``passed``: no check failed (skipped ones do not count)."""

    sections: tuple[SectionResult, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> list[tuple[str, Check]]:
        return [(s.name, c) for s in self.sections for c in s.failed]

    @property
    def passed(self) -> bool:
        return not self.failed

    def counts(self) -> dict[str, int]:
        per = [s.counts() for s in self.sections]
        return {k: sum(c[k] for c in per) for k in ("passed", "failed", "skipped")}

    def to_dict(self) -> dict[str, object]:
        return {"passed": self.passed, "counts": self.counts(), "sections": [s.to_dict() for s in self.sections],
                "summary": [s.summary() for s in self.sections],
                "failed": [f"{section}: {c.label}" for section, c in self.failed]}
