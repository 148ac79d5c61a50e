"""How long a fit will take, timed on this machine now: the one mechanism behind the cost lines of ``fit-sae`` and
``fit-lens`` (``tuned``, ``jacobian``).

A fit is a fixed list of phases (the weights' load, collecting activations, training, the held-out check, ...).
Each phase not yet run is estimated from a **probe**: a short run of the phase's own code (one window's forward,
a few training steps, one backward pass) on the fit's device, now, scaled by how much of that work the phase
does. A phase already over (the weights' load) is counted as it was measured. The estimate is the sum of every
phase; the fit then runs its phases under :meth:`Timings.phase`, which records what each took and refuses a
phase the estimate did not count, so the estimate and the run are lists of the same phases (compared in the
result's JSON and by ``benchmarks/bench_fit_estimate.py``).

Every time here is read from :func:`now` (tests replace it with a clock of their own).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field
from typing import TypedDict

from anatomy_cli.units import human_seconds


def now() -> float:
    """The clock every probe and phase is timed with (seconds)."""
    return time.perf_counter()


def timed(work: Callable[[], object]) -> float:
    """The seconds one call of ``work`` takes."""
    start = now()
    work()
    return now() - start


class PhaseRecord(TypedDict):
    """:meth:`Phase.to_dict`."""

    phase: str
    seconds: float
    done: bool


class EstimateRecord(TypedDict):
    """:meth:`Estimate.to_dict`: the total and each phase."""

    seconds: float
    phases: list[PhaseRecord]


class TimingRow(TypedDict):
    """One phase of :meth:`Timings.to_dict`: as estimated and as measured."""

    phase: str
    estimated_seconds: float
    seconds: float


class TimingsRecord(TypedDict):
    """:meth:`Timings.to_dict`."""

    estimated_seconds: float
    seconds: float
    phases: list[TimingRow]


@dataclass(frozen=True)
class Phase:
    """One phase of a fit: its name and its seconds (``done``: it is over, and this is what it took)."""

    name: str
    seconds: float
    done: bool = False

    def to_dict(self) -> PhaseRecord:
        return {"phase": self.name, "seconds": self.seconds, "done": self.done}


def scaled(name: str, probe_seconds: float, probe_units: float, units: float) -> Phase:
    """A phase of ``units`` of work whose probe did ``probe_units`` of it in ``probe_seconds``."""
    return Phase(name, probe_seconds * units / max(probe_units, 1e-12))


def summed(name: str, *parts: Phase) -> Phase:
    """A phase of several kinds of work, each probed and scaled on its own (:func:`scaled`): their sum."""
    return Phase(name, sum(p.seconds for p in parts))


@dataclass(frozen=True)
class Estimate:
    """A fit's phases, in the order they run; :attr:`seconds` is their sum."""

    phases: tuple[Phase, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    def describe(self) -> str:
        """``roughly 6 min in all (loading 12 s, done; training 5 min; held-out check 20 s; timed on this machine
        now)``."""

        parts = "; ".join(f"{p.name} {human_seconds(p.seconds)}{', done' if p.done else ''}" for p in self.phases)
        return f"roughly {human_seconds(self.seconds)} in all ({parts}; timed on this machine now)"

    def to_dict(self) -> EstimateRecord:
        return {"seconds": self.seconds, "phases": [p.to_dict() for p in self.phases]}

    def timings(self) -> Timings:
        """The clock the fit runs its phases under: the done phases already recorded."""
        return Timings(self, {p.name: p.seconds for p in self.phases if p.done})


@dataclass
class Timings:
    """What each phase of a fit took, recorded as it runs (:meth:`phase`)."""

    estimate: Estimate
    took: dict[str, float] = field(default_factory=dict)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the block as phase ``name`` (several blocks of one phase add up). Raises ValueError for a phase
        the estimate did not count: an estimate covers every phase a fit runs."""
        names = [p.name for p in self.estimate.phases]
        if name not in names:
            raise ValueError(f"phase {name!r} is not in the estimate ({', '.join(names)})")
        start = now()
        try:
            yield
        finally:
            self.took[name] = self.took.get(name, 0.0) + now() - start

    @property
    def seconds(self) -> float:
        return sum(self.took.values())

    def to_dict(self) -> TimingsRecord:
        """The estimate and what was measured, phase by phase, and their ratios (measured / estimated)."""
        rows: list[TimingRow] = [{"phase": p.name, "estimated_seconds": p.seconds,
                                  "seconds": self.took.get(p.name, 0.0)} for p in self.estimate.phases]
        return {"estimated_seconds": self.estimate.seconds, "seconds": self.seconds, "phases": rows}


def probes_phase(begun: float) -> Phase:
    """The probes themselves, done: the seconds since ``begun`` (when they started)."""
    return Phase("timing probes", now() - begun, done=True)


def load_phase(lm: object) -> Phase:
    """The weights' load, done: the seconds :func:`anatomy_cli.tasks.session.load_weights` measured (0 for a
    model loaded before the command, as the API's callers and ``anatomy serve`` hold them)."""
    return Phase("loading the weights", float(getattr(lm, "load_seconds", 0.0) or 0.0), done=True)
